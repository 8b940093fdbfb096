"""job_results end to end on this machine (a local connection plays the node): the files and
the listing come to the controller's folder, and a file already there is not written again."""

import itertools
import json
import sys

import ansible_run
import pytest

FILES = ["trainer_log.jsonl", "training_loss.png", "all_results.json"]
RUNS = itertools.count()


def collect(tmp_path, check=False):
    playbook = tmp_path / "collect.yml"
    playbook.write_text(
        f"""
- hosts: node
  gather_facts: false
  tasks:
    - hostnet.llamafactory.job_results:
        output_dir: {tmp_path}/output
        dest: {tmp_path}/results/job
        files: {FILES}
        patterns: ["adapter_*", "*.safetensors", "all_results.json"]
        listing: adapter-files.txt
        header: "node:{tmp_path}/output (rank 0)"
      register: got
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
    return json.loads((tmp_path / "got.json").read_text())


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
    return folder


def test_the_results_come_once_and_only_what_changed_comes_again(tmp_path, output):
    results = tmp_path / "results" / "job"
    got = collect(tmp_path, check=True)
    assert got["changed"] and not results.exists()  # check mode writes nothing
    got = collect(tmp_path)
    assert got["changed"] and got["written"] == [
        "adapter-files.txt",
        "trainer_log.jsonl",
        "training_loss.png",
    ]
    assert got["missing"] == ["all_results.json"]
    assert (results / "training_loss.png").read_bytes() == (
        output / "training_loss.png"
    ).read_bytes()
    assert (results / "trainer_log.jsonl").stat().st_mode & 0o777 == 0o644
    assert (results / "adapter-files.txt").read_text() == (
        f"# node:{output} (rank 0)\nadapter_config.json 2\nadapter_model.safetensors 1000\n"
    )
    assert collect(tmp_path)["changed"] is False  # nothing new: nothing written
    with (output / "trainer_log.jsonl").open("a") as log:
        log.write('{"current_steps": 2}\n')
    (output / "all_results.json").write_text('{"train_loss": 1.5}')
    got = collect(tmp_path)
    assert got["written"] == ["adapter-files.txt", "all_results.json", "trainer_log.jsonl"]
    assert (results / "trainer_log.jsonl").read_text().endswith('{"current_steps": 2}\n')
    assert [f["name"] for f in got["matching"]] == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "all_results.json",
    ]
