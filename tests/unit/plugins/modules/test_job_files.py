"""job_files run as Ansible runs it on a node, on this machine: folders and files made, changed
only where they differ, check mode and bad input changing nothing (the helpers:
plugins/module_utils/_job_files.py)."""

import os

import ansible_run
import pytest
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _job_files as files

OWNER = str(os.getuid())
GROUP = str(os.getgid())


def run(tmp_path, entries, check=False):
    args = {"entries": entries, "owner": OWNER, "group": GROUP}
    if check:
        args["_ansible_check_mode"] = True
    return ansible_run.module("job_files", tmp_path, "/usr/bin:/bin", **args)


def job(tmp_path, config="a: 1\n", settings='{"rank": 0}\n'):
    root = tmp_path / "jobs"
    return root, [
        {"path": str(root), "state": "directory", "mode": "0755"},
        {"path": str(root / "sft"), "state": "directory", "mode": "0750"},
        {"path": str(root / "sft" / "config.yaml"), "content": config, "mode": "0640"},
        {
            "path": str(root / "sft" / "agent.json"),
            "content": settings,
            "mode": "0640",
            "json": True,
        },
    ]


def test_made_once_then_only_what_differs(tmp_path):
    root, entries = job(tmp_path)
    assert run(tmp_path, entries, check=True)["changed"] and not root.exists()
    result = run(tmp_path, entries)
    assert result["changed"] and not result.get("failed"), result
    assert result["changes"][str(root)] == ["create"]
    assert (root / "sft" / "config.yaml").read_text() == "a: 1\n"
    assert (root / "sft").stat().st_mode & 0o777 == 0o750
    assert (root / "sft" / "agent.json").stat().st_mode & 0o777 == 0o640
    again = run(tmp_path, entries)
    assert again["changed"] is False and again["changes"] == {}
    (root / "sft" / "agent.json").chmod(0o644)
    root, entries = job(tmp_path, config="a: 2\n")
    result = run(tmp_path, entries)
    assert result["changes"] == {
        str(root / "sft" / "config.yaml"): ["content"],
        str(root / "sft" / "agent.json"): ["mode"],
    }
    assert (root / "sft" / "config.yaml").read_text() == "a: 2\n"
    assert sorted(p.name for p in (root / "sft").iterdir()) == ["agent.json", "config.yaml"]


def test_bad_json_or_a_file_in_a_folders_place_is_refused(tmp_path):
    root, entries = job(tmp_path, settings="{rank: 0")
    result = run(tmp_path, entries)
    assert result["failed"] and "agent.json: not valid JSON" in result["msg"]
    assert not root.exists()  # checked before anything is made
    root.write_text("")
    root, entries = job(tmp_path)
    result = run(tmp_path, entries)
    assert result["failed"] and result["msg"] == f"{root} is a file, not the directory wanted"


def test_needs_names_each_change(tmp_path):
    uid, gid = files.ids(OWNER, GROUP)
    path = tmp_path / "f"
    entry = {"path": str(path), "state": "file", "content": "x", "mode": "0600"}
    assert files.needs(entry, uid, gid) == ["content"]
    files.apply(entry, ["content"], uid, gid)
    assert files.needs(entry, uid, gid) == [] and path.stat().st_mode & 0o777 == 0o600
    assert files.needs(entry, uid + 1, gid) == ["owner"]
    with pytest.raises(KeyError):
        files.ids("hostnet-no-such-user", GROUP)


def test_bytes_from_base64_written_and_compared_as_bytes(tmp_path):
    weights = tmp_path / "weights.bin"
    entry = {"path": str(weights), "content_base64": "AP8Q", "mode": "0640"}
    assert run(tmp_path, [entry])["changed"]
    assert weights.read_bytes() == b"\x00\xff\x10"
    assert not run(tmp_path, [entry])["changed"]
    failed = run(tmp_path, [dict(entry, content_base64="not base64!")])
    assert failed["failed"] and "content_base64 is not base64" in failed["msg"]
    both = run(tmp_path, [dict(entry, content="x")])
    assert both["failed"] and "one of them" in both["msg"]
