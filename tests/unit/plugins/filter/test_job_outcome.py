"""The filter job_outcome as roles/launch/tasks/judge.yml calls it: every node's job_status report
after the wait (captured containers and logs: tests/job_captures.py, tests/unit/fixtures), rank
0's job_wait result, the plan's ranks and the hosts the wait stopped. The filter adds the
controller's clock and the diagnosis, and takes ranks and hosts as Jinja hands them over."""

from pathlib import Path

import pytest
from ansible_collections.hostnet.llamafactory.plugins.filter.job_outcome import (
    FilterModule,
    job_outcome,
)
from job_captures import report

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
RANKS = {"vm0": 0, "vm1": 1}


def final(container, log=None, lines=None):
    """A node's job_status result after the wait (what wait.yml registers: no rank, the plan has
    it); `lines`: its log lines from a recorded failure (fixtures/logs/LINES.log)."""
    result = report(container, None, log=log)
    del result["rank"]
    if lines:
        result["log_lines"] = (LOGS / f"{lines}.log").read_text().splitlines()
    return result


def test_a_finished_job_with_rank_0s_checkpoints_and_its_agents_restarts():
    finals = {"vm0": final("exited-0", log="finished"), "vm1": final("exited-0")}
    finals["vm0"]["checkpoints"] = [10, 12]
    finals["vm0"]["agent"] = {"restarts": [{"attempt": 1, "lost": 3}]}
    outcome = job_outcome(
        finals, watch={"state": "finished", "elapsed": 30.2}, ranks=RANKS, job="demo"
    )
    assert outcome["failed"] is False and outcome["state"] == "finished"
    assert outcome["checkpoints"] == [10, 12] and outcome["elapsed"] == 30.2
    assert outcome["restarts"] == [{"attempt": 1, "lost": 3}]
    assert outcome["line"].endswith("rank 0 exited with code 0, rank 1 exited with code 0")


def test_the_killed_rank_is_the_cause_not_the_one_the_wait_stopped():
    finals = {"vm0": final("exited-1", log="peer-killed"), "vm1": final("killed-137", log="killed")}
    finals["vm0"]["container"] = dict(finals["vm0"]["container"], exit_code=143)
    watch = {"state": "failed", "stopped": True, "failed_hosts": ["vm1"], "elapsed": 41.0}
    # Ranks and hosts as Jinja gives them: ranks from extra vars are strings, `stopped` a list.
    outcome = job_outcome(
        finals, watch=watch, ranks={"vm0": "0", "vm1": "1"}, job="capture", stopped=["vm0"]
    )
    assert outcome["failed"] is True and outcome["failed_ranks"] == [1]
    lines = outcome["msg"].splitlines()
    assert lines[0] == "job capture failed: rank 1 (vm1) killed (SIGKILL, exit 137) first."
    assert "Then:" not in outcome["msg"]
    assert outcome["restart"]["restartable"] is True and outcome["restart"]["kind"] == "killed"


def test_the_diagnosis_of_every_ranks_log_names_the_cause_and_allows_a_restart():
    # Both ranks exited 1; rank 1's agent says rank 1's peer stopped answering: a network fault,
    # which a restart may cure - the filter must hand the diagnosis to the judgment.
    finals = {"vm0": final("exited-1"), "vm1": final("exited-1", lines="peer-lost")}
    watch = {"state": "failed", "failed_hosts": ["vm1"], "elapsed": 41.0}
    outcome = job_outcome(finals, watch=watch, ranks=RANKS, job="capture")
    assert "Cause (peer-lost, vm1): This rank was healthy" in outcome["msg"]
    assert outcome["restart"]["restartable"] is True
    assert outcome["restart"]["kind"] == "network"
    assert outcome["restart"]["why"] == "its log says a peer went away (peer-lost)"


def test_an_unreachable_node_and_a_wait_that_timed_out():
    finals = {
        "vm0": final("exited-1", log="peer-killed"),
        "vm1": {"unreachable": True, "msg": "Failed to connect to the host via ssh"},
    }
    outcome = job_outcome(finals, watch={"state": "failed"}, ranks=RANKS, job="capture")
    assert outcome["failed_ranks"] == [0, 1]
    assert "rank 1 (vm1) could not be queried: Failed to connect" in outcome["msg"]
    timeout = {"state": "running", "msg": "job capture is still running after 60 s"}
    running = {"vm0": final("running"), "vm1": final("running")}
    outcome = job_outcome(running, watch=timeout, ranks=RANKS, job="capture")
    assert outcome["failed"] is True and outcome["msg"] == timeout["msg"]


def test_options_by_name_only():
    with pytest.raises(TypeError):
        job_outcome({}, {"state": "finished"}, RANKS, "demo")  # pylint: disable=too-many-function-args,missing-kwoa


def test_the_call_site_binds(call_sites):
    assert FilterModule().filters()["job_outcome"] is job_outcome
    (call,) = call_sites("job_outcome", job_outcome)
    assert call[0] == "roles/launch/tasks/judge.yml"
    assert call[1] == 0 and sorted(call[2]) == ["job", "ranks", "stopped", "watch"]
