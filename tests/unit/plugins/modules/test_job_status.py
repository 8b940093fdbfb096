"""The module job_status: its node-side helper (the end of trainer_log.jsonl, what
_job.last_progress is given), and the module run as Ansible runs it against a dockerd stand-in
on a unix socket (conftest.py)."""

import json
import os
import time
from pathlib import Path

import ansible_run
import pytest
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _job as job
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _job_status as job_status
from job_captures import inspect

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "job"


def record(step: int) -> str:
    return json.dumps(
        {
            "current_steps": step,
            "total_steps": 4000,
            "loss": 5.0 + step / 10000,
            "percentage": round(step / 40, 2),
            "elapsed_time": "0:01:04",
        }
    )


def test_a_small_trainer_log_is_returned_whole(tmp_path):
    text = (FIXTURES / "trainer_log-tail.jsonl").read_text()
    (tmp_path / "trainer_log.jsonl").write_text(text)
    assert job_status.trainer_log_tail(str(tmp_path)) == text
    assert job.last_progress(job_status.trainer_log_tail(str(tmp_path)))["step"] == 400


def test_a_big_trainer_log_ends_at_line_boundaries(tmp_path):
    lines = [record(step) for step in range(1, 1001)]
    text = "\n".join(lines) + "\n"
    assert len(text) > 4 * job_status.TRAINER_LOG_TAIL_BYTES
    (tmp_path / "trainer_log.jsonl").write_text(text)
    tail = job_status.trainer_log_tail(str(tmp_path))
    assert len(tail.encode()) <= job_status.TRAINER_LOG_TAIL_BYTES
    assert text.endswith(tail)
    assert len(tail) > job_status.TRAINER_LOG_TAIL_BYTES - len(lines[-1]) - 2
    # Starts at the beginning of a line: every line is a whole record.
    tail_lines = tail.splitlines()
    assert tail_lines[0] in lines
    assert all(json.loads(line)["current_steps"] for line in tail_lines)
    assert tail_lines[-1] == lines[-1]
    assert job.last_progress(tail)["step"] == 1000


def test_a_trainer_log_of_an_earlier_run_is_ignored(tmp_path):
    path = tmp_path / "trainer_log.jsonl"
    path.write_text(record(10) + "\n")
    written = time.time() - 3600
    os.utime(path, (written, written))
    # The container started after the file was last written: a resumed run's old log.
    assert job_status.trainer_log_tail(str(tmp_path), since=written + 60) == ""
    # Written at (or within a second before) the start: this run's.
    assert job_status.trainer_log_tail(str(tmp_path), since=written + 0.5) == record(10) + "\n"
    assert job_status.trainer_log_tail(str(tmp_path), since=written - 60) == record(10) + "\n"
    assert job_status.trainer_log_tail(str(tmp_path), since=None) == record(10) + "\n"


@pytest.mark.parametrize("since", [None, time.time()])
def test_a_missing_trainer_log(tmp_path, since):
    assert job_status.trainer_log_tail(str(tmp_path), since) == ""
    assert job_status.trainer_log_tail(str(tmp_path / "absent"), since) == ""


# --- the module against a dockerd stand-in (conftest.py) ----------------------------------


def run_module(tmp_path, **args):
    """The module as Ansible runs it, with no docker command on PATH (nothing to run there)."""
    return ansible_run.module("job_status", tmp_path, str(tmp_path), **args)


def test_a_running_rank_with_its_newest_log_lines(dockerd, socket_path, tmp_path):
    dockerd.add_container(
        "llamafactory-demo", inspect("running"), (FIXTURES / "logs-killed.multiplexed").read_bytes()
    )
    result = run_module(tmp_path, name="llamafactory-demo", tail=5, docker_socket=socket_path)
    assert not result.get("failed"), result
    assert result["changed"] is False
    assert result["container"]["state"] == "running"
    assert result["container"] == job.container_state(inspect("running"))
    expected, newest = job.parse_logs("", (FIXTURES / "logs-killed.stderr").read_text())
    assert result["log_lines"] == expected[-5:]
    assert result["last_output_at"] == newest
    calls = [(m, p) for m, p, _q, _h, _b in dockerd.requests]
    assert calls == [
        ("GET", "/containers/llamafactory-demo/json"),
        ("GET", "/containers/llamafactory-demo/logs"),
    ]
    assert dockerd.requests[1][2]["tail"] == "5"


def test_stop_stops_a_running_rank_once(dockerd, socket_path, tmp_path):
    dockerd.add_container("llamafactory-demo", inspect("running"))
    args = dict(name="llamafactory-demo", stop=True, stop_timeout=3, docker_socket=socket_path)
    first = run_module(tmp_path, **args)
    assert first["changed"] is True
    assert (first["container"]["state"], first["container"]["exit_code"]) == ("exited", 143)
    stops = [r for r in dockerd.requests if r[1].endswith("/stop")]
    assert [(r[0], r[2]) for r in stops] == [("POST", {"t": "3"})]
    again = run_module(tmp_path, **args)
    assert again["changed"] is False
    assert len([r for r in dockerd.requests if r[1].endswith("/stop")]) == 1


def test_stop_in_check_mode_reports_without_stopping(dockerd, socket_path, tmp_path):
    dockerd.add_container("llamafactory-demo", inspect("running"))
    result = run_module(
        tmp_path,
        name="llamafactory-demo",
        stop=True,
        docker_socket=socket_path,
        _ansible_check_mode=True,
    )
    assert result["changed"] is True
    assert result["container"]["state"] == "running"
    assert not [r for r in dockerd.requests if r[1].endswith("/stop")]


def test_labels_match_says_whether_the_container_is_this_runs(dockerd, socket_path, tmp_path):
    captured = inspect("running")
    dockerd.add_container("llamafactory-demo", captured)
    labels = captured["Config"]["Labels"]
    assert labels, "the captured inspect carries the launch role's labels"
    key, value = next(iter(labels.items()))
    for wanted, expected in (({key: value}, True), ({key: value + "x"}, False), (None, None)):
        result = run_module(
            tmp_path, name="llamafactory-demo", labels=wanted, docker_socket=socket_path
        )
        assert result["labels_match"] is expected, wanted
    # No container: nothing to match.
    result = run_module(
        tmp_path, name="llamafactory-other", labels={key: value}, docker_socket=socket_path
    )
    assert result["labels_match"] is None


def test_a_missing_container(dockerd, socket_path, tmp_path):
    result = run_module(tmp_path, name="llamafactory-other", docker_socket=socket_path)
    assert result["container"] == {"state": "missing"}
    assert result["log_lines"] == [] and result["last_output_at"] is None
    assert len(dockerd.requests) == 1  # no logs asked of a missing container


def test_no_daemon_fails_saying_so(tmp_path):
    result = run_module(tmp_path, name="x", docker_socket=str(tmp_path / "docker.sock"))
    assert result["failed"] is True
    assert result["msg"].startswith("cannot query container x: there is no Docker daemon socket")


def test_the_agents_state_is_read_and_a_half_written_one_ignored(tmp_path):
    path = tmp_path / "agent-state.json"
    assert job_status.agent_state(None) is None
    assert job_status.agent_state(str(path)) is None  # not written yet
    path.write_text('{"state": "running", "attempt": 1, "pid": 7, "restarts": [{"step": 5')
    assert job_status.agent_state(str(path)) is None
    restarts = [{"attempt": 1, "step": 5, "resume": 2, "lost": 3, "message": "restart 1 of 1"}]
    path.write_text(json.dumps({"state": "running", "attempt": 1, "pid": 7, "restarts": restarts}))
    assert job_status.agent_state(str(path)) == {
        "state": "running",
        "attempt": 1,
        "restarts": restarts,
    }
