"""The job plan's small copies as job_files entries, read from real files (the lookup
job_copies' helpers)."""

import base64

from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _job_copies

JOB = "/var/lib/llamafactory/jobs/demo"


def test_a_file_and_a_folder_become_entries_folders_first(tmp_path):
    (tmp_path / "model" / "tokenizer").mkdir(parents=True)
    (tmp_path / "model" / "weights.bin").write_bytes(b"\x00\xff\x10")
    (tmp_path / "model" / "tokenizer" / "tokenizer.json").write_text("{}")
    (tmp_path / "ds.json").write_text('{"a": 1}')
    found = _job_copies.entries(
        [
            {"src": str(tmp_path / "model"), "dest": f"{JOB}/model/", "directory": True},
            {"src": str(tmp_path / "ds.json"), "dest": f"{JOB}/deepspeed.json", "directory": False},
        ]
    )
    assert [(e["path"], e["state"], e["mode"]) for e in found] == [
        (f"{JOB}/model", "directory", "0750"),
        (f"{JOB}/model/weights.bin", "file", "0640"),
        (f"{JOB}/model/tokenizer", "directory", "0750"),
        (f"{JOB}/model/tokenizer/tokenizer.json", "file", "0640"),
        (f"{JOB}/deepspeed.json", "file", "0640"),
    ]
    assert base64.b64decode(found[1]["content_base64"]) == b"\x00\xff\x10"
    assert base64.b64decode(found[4]["content_base64"]) == b'{"a": 1}'
