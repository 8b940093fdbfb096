"""The filter restart_decision as roles/launch/tasks/attempt_wait.yml calls it: the advice of the
judgment (job_outcome's `restart`) or of the VMs' status (gcp_instances' stopped-VM advice with
the step), the restarts so far (the controller's and the agents'), and launch_max_restarts,
which an extra var makes a string."""

import pytest
from ansible_collections.hostnet.llamafactory.plugins.filter.job_outcome import job_outcome
from ansible_collections.hostnet.llamafactory.plugins.filter.restart_decision import (
    FilterModule,
    restart_decision,
)
from job_captures import report

RANKS = {"vm0": 0, "vm1": 1}
# attempt_wait.yml's advice when the wait failed before the job did (no judgment).
NO_JUDGMENT = {"restartable": False, "why": "the wait failed before the job did"}


def killed_rank_1():
    """job_outcome's result for a job whose rank 1 was killed (SIGKILL) and rank 0 then stopped."""
    finals = {}
    for host, container, log in (
        ("vm0", "exited-1", "peer-killed"),
        ("vm1", "killed-137", "killed"),
    ):
        finals[host] = report(container, None, log=log)
        del finals[host]["rank"]
    watch = {"state": "failed", "failed_hosts": ["vm1"]}
    return job_outcome(finals, watch=watch, ranks=RANKS, job="capture", stopped=["vm0"])


def attempt(advice, restarts, max_restarts):
    """attempt_wait.yml's decision, and the restarts it records (the advice, numbered)."""
    decision = restart_decision(advice, restarts=restarts, max_restarts=max_restarts)
    if decision["restart"]:
        restarts = [*restarts, dict(advice, attempt=len(restarts) + 1)]
    return decision, restarts


def test_a_killed_rank_restarts_until_it_fails_the_same_way_at_the_same_step():
    advice = killed_rank_1()["restart"]
    assert advice["kind"] == "killed"
    decision, restarts = attempt(advice, [], "2")  # -e launch_max_restarts=2: a string
    assert decision == {"restart": True, "why": ""}
    assert restarts == [dict(advice, attempt=1)]
    again, restarts = attempt(advice, restarts, "2")
    assert again["restart"] is False
    assert again["why"] == "the same failure (killed) at the same step (None) twice"
    assert len(restarts) == 1


def test_the_agents_restarts_count_against_the_same_budget():
    advice = killed_rank_1()["restart"]
    agents = [{"attempt": 1, "lost": 3}]  # job_outcome's `restarts`: rank 0's agent's view
    assert attempt(advice, agents, 1)[0] == {
        "restart": False,
        "why": "no restart left (launch_max_restarts 1)",
    }
    assert attempt(advice, [], 0)[0]["why"] == "no restart left (launch_max_restarts 0)"


def test_a_stopped_vm_restarts_only_when_allowed_and_a_failure_of_its_own_never():
    stopped = {
        "restartable": True,
        "kind": "vm-stopped",
        "cause": "the VM of vm1 is TERMINATED",
        "why": "gcp_instances_restart_stopped starts it again",
        "step": 23,
    }
    assert attempt(stopped, [], 2)[0]["restart"] is True
    refused = dict(stopped, restartable=False, why="a VM is not running; set ...=true")
    assert attempt(refused, [], 2)[0] == {"restart": False, "why": refused["why"]}
    assert attempt(NO_JUDGMENT, [], 2)[0] == {"restart": False, "why": NO_JUDGMENT["why"]}


def test_options_by_name_only():
    with pytest.raises(TypeError):
        restart_decision(NO_JUDGMENT, [], 2)  # pylint: disable=too-many-function-args,missing-kwoa


def test_the_call_site_binds(call_sites):
    assert FilterModule().filters()["restart_decision"] is restart_decision
    calls = call_sites("restart_decision", restart_decision)
    assert [(c[0], c[1], sorted(c[2])) for c in calls] == [
        ("roles/launch/tasks/attempt_wait.yml", 0, ["max_restarts", "restarts"])
    ]
