"""job_results end to end on this machine (a local connection plays the node): the results and
the trained model come to the controller's folder, each model file checked against the node's
SHA-256; a file already there is not written again; a large file comes in pieces."""

import hashlib
import itertools
import json
import sys

import ansible_run
import pytest
from ansible_collections.hostnet.llamafactory.plugins.action import job_results as action
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _job_status as job_status
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _results as node_results
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _results

FILES = ["trainer_log.jsonl", "training_loss.png", "all_results.json"]
RUNS = itertools.count()


def collect(tmp_path, check=False, ok=True, **options):
    args = {
        "output_dir": f"{tmp_path}/output",
        "dest": f"{tmp_path}/results/job",
        "files": FILES,
        "model_dir": "adapter",
        **options,
    }
    playbook = tmp_path / "collect.yml"
    playbook.write_text(
        f"""
- hosts: node
  gather_facts: false
  tasks:
    - hostnet.llamafactory.job_results: {json.dumps(args)}
      register: got
      ignore_errors: true
    - ansible.builtin.copy:
        content: "{{{{ got | to_json }}}}"
        dest: {tmp_path}/got.json
        mode: "0644"
      check_mode: false
"""
    )
    inventory = f"node ansible_connection=local ansible_python_interpreter={sys.executable}\n"
    # A folder per run: ansible-runner keeps a run's --check for the next one in the same folder.
    folder = tmp_path / f"runner-{next(RUNS)}"
    run = ansible_run.run(folder, inventory, playbook=playbook, hosts="node", check=check)
    assert run.rc == 0, run.messages()
    got = json.loads((tmp_path / "got.json").read_text())
    assert bool(got.get("failed")) is not ok, got
    return got


def sha(data):
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def output(tmp_path):
    folder = tmp_path / "output"
    folder.mkdir()
    (folder / "trainer_log.jsonl").write_text('{"current_steps": 1}\n')
    (folder / "training_loss.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    (folder / "adapter_model.safetensors").write_bytes(b"x" * 1000)
    (folder / "adapter_config.json").write_text("{}")
    (folder / ".adapter_hidden").write_text("")
    (folder / "checkpoint-5").mkdir()
    (folder / "checkpoint-5" / "adapter_model.safetensors").write_text("older")
    return folder


MODEL = [
    "adapter_config.json",
    "adapter_model.safetensors",
    "trainer_log.jsonl",
    "training_loss.png",
]


def test_the_results_and_the_model_come_once_and_only_what_changed_comes_again(tmp_path, output):
    results = tmp_path / "results" / "job"
    adapter = results / "adapter"
    got = collect(tmp_path, check=True)
    assert got["changed"] and not results.exists()  # check mode writes nothing
    assert got["model"]["fetched"] == MODEL and not got["model"]["verified"]
    got = collect(tmp_path)
    assert got["changed"] and got["written"] == ["trainer_log.jsonl", "training_loss.png"]
    assert got["missing"] == ["all_results.json"]
    assert (results / "training_loss.png").read_bytes() == (
        output / "training_loss.png"
    ).read_bytes()
    assert (results / "trainer_log.jsonl").stat().st_mode & 0o777 == 0o644
    # The model: every visible file at the top of the output folder, byte for byte, and the
    # node's checksums in SHA256SUMS (hidden files and checkpoint folders are not part of it).
    model = got["model"]
    assert model["verified"] and model["fetched"] == MODEL and model["path"] == str(adapter)
    assert sorted(p.name for p in adapter.iterdir()) == sorted([*MODEL, "SHA256SUMS"])
    for name in MODEL:
        assert (adapter / name).read_bytes() == (output / name).read_bytes()
    assert (adapter / "SHA256SUMS").read_text() == "".join(
        f"{sha((output / name).read_bytes())}  {name}\n" for name in MODEL
    )
    assert model["size"] == sum((output / name).stat().st_size for name in MODEL)

    again = collect(tmp_path)
    assert again["changed"] is False and again["model"]["verified"]  # nothing new: nothing written
    assert again["model"]["fetched"] == []
    with (output / "trainer_log.jsonl").open("a") as log:
        log.write('{"current_steps": 2}\n')
    (output / "all_results.json").write_text('{"train_loss": 1.5}')
    (output / "adapter_model.safetensors").write_bytes(b"y" * 1000)
    got = collect(tmp_path)
    assert got["written"] == ["all_results.json", "trainer_log.jsonl"]
    assert got["model"]["fetched"] == [
        "adapter_model.safetensors",
        "all_results.json",
        "trainer_log.jsonl",
    ]
    assert (results / "trainer_log.jsonl").read_text().endswith('{"current_steps": 2}\n')
    assert (adapter / "adapter_model.safetensors").read_bytes() == b"y" * 1000


def test_compare_only_says_whether_the_controllers_copy_is_the_nodes(tmp_path, output):
    got = collect(tmp_path, model_fetch=False)
    assert not got["model"]["verified"] and got["model"]["fetched"] == []
    assert not (tmp_path / "results" / "job" / "adapter").exists()
    collect(tmp_path)
    assert collect(tmp_path, model_fetch=False)["model"]["verified"]
    (tmp_path / "results" / "job" / "adapter" / "adapter_config.json").write_text("{ }")
    assert not collect(tmp_path, model_fetch=False)["model"]["verified"]


def test_a_model_over_the_limit_is_listed_not_brought(tmp_path, output):
    got = collect(tmp_path, model_max_mb=0.001)  # 1000 bytes: the model is 1.3 kB
    model = got["model"]
    assert model["over_limit"] and not model["verified"] and model["fetched"] == []
    assert model["max_mb"] == 0.001  # the limit, for the message that names it
    assert [f["name"] for f in model["files"]] == MODEL
    assert "sha256" not in model["files"][0]  # not read for nothing
    assert not (tmp_path / "results" / "job" / "adapter").exists()


def test_a_file_too_large_for_one_call_comes_in_pieces(tmp_path, monkeypatch):
    """The action's reads of a large file, against the module's read_piece (the module call
    replaced by a direct one: ansible-runner runs the action in another process)."""
    monkeypatch.setattr(action, "PIECE", 300)
    data = bytes(range(256)) * 9  # 2304 bytes: 8 pieces
    (tmp_path / "f").write_bytes(data)
    offsets = []

    def node(_task_vars, output_dir, dest, read):
        offsets.append(read["offset"])
        return node_results.read_piece(
            f"{output_dir}/{read['name']}", read["offset"], read["length"]
        )

    plugin = object.__new__(action.ActionModule)
    plugin._node = node
    pieces = plugin._pieces({}, str(tmp_path), {"name": "f", "size": len(data)})
    assert b"".join(pieces) == data and offsets == list(range(0, len(data), 300))
    with pytest.raises(OSError, match="f ended at 2304 bytes, not 3000"):
        list(plugin._pieces({}, str(tmp_path), {"name": "f", "size": 3000}))


def test_a_file_that_does_not_match_the_nodes_checksum_is_not_kept(tmp_path, output):
    """What arrives is checked: a piece changed on the way is refused, the old copy kept."""
    folder = tmp_path / "kept"
    folder.mkdir()
    (folder / "f").write_bytes(b"old")
    with pytest.raises(ValueError, match="not the node's"):
        _results.write_pieces(str(folder / "f"), [b"new", b"!"], sha256=sha(b"new"))
    assert (folder / "f").read_bytes() == b"old" and [p.name for p in folder.iterdir()] == ["f"]


def test_a_missing_output_folder_has_no_model(tmp_path):
    got = collect(tmp_path, model_fetch=False)
    assert got["model"]["files"] == [] and not got["model"]["verified"]
    assert got["missing"] == FILES


def test_the_finished_jobs_record_is_written_once_0600_and_read_back(tmp_path, output):
    """The record a re-run reads with rank 0's job (job_status's `record`): written when it
    differs (not in check mode), 0600, and then a change no more."""
    path = tmp_path / "job" / "finished.json"
    path.parent.mkdir()
    record = {"job": "sft", "container": {"id": "3f2a9c0d1e4b"}, "ranks": {"vm0": 0, "vm1": 1}}
    with_record = {"model_dir": "", "files": [], "record": record, "record_path": str(path)}
    got = collect(tmp_path, check=True, **with_record)
    assert got["changed"] and got["recorded"] and not path.exists()
    got = collect(tmp_path, **with_record)
    assert got["changed"] and got["recorded"]
    assert json.loads(path.read_text()) == record and path.stat().st_mode & 0o777 == 0o600
    assert list(path.parent.iterdir()) == [path]  # no temporary file left
    again = collect(tmp_path, **with_record)
    assert again["changed"] is False and again["recorded"] is False
    moved = {**record, "container": {"id": "77aa00bb11cc"}}
    assert collect(tmp_path, **{**with_record, "record": moved})["recorded"]
    assert job_status.record(str(path)) == moved
    assert job_status.record(None) is None
    path.write_text('{"job": "sf')  # half written (another writer): no record
    assert job_status.record(str(path)) is None
    assert job_status.record(str(tmp_path / "missing.json")) is None
