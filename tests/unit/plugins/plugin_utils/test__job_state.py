"""The controller's side of the job logic (plugins/plugin_utils/_job_state.py): the launch
decision, the verdict while waiting and the failure message, over the reports job_status makes
from data captured on the local cluster (tests/unit/fixtures/job, see its README).
"""

import pytest
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _job as node
from ansible_collections.hostnet.llamafactory.plugins.module_utils._job import LABEL_DIGEST
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _job_state as job
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._diagnosis import diagnose
from job_captures import (
    DIGEST_CAPTURE_RANK1,
    DIGEST_DEMO_RANK0,
    FIXTURES,
    LOGS,
    epoch,
    inspect,
    listing,
    report,
)


def test_common_checkpoint():
    assert job.common_checkpoint([{"checkpoints": [4, 8, 12]}, {"checkpoints": [4, 8]}]) == 8
    assert job.common_checkpoint([{"checkpoints": [12]}, {"checkpoints": [4, 8]}]) is None
    assert job.common_checkpoint([{"checkpoints": [10]}, {}]) is None
    assert job.common_checkpoint([{"checkpoints": [10]}, {"checkpoints": [10]}]) == 10
    assert job.common_checkpoint([]) is None


# --- decide_launch ------------------------------------------------------------------------

CKPT0 = node.complete_checkpoints(listing(0))
CKPT1 = node.complete_checkpoints(listing(1))


def decide(reports, restart_allowed=False, durable=None):
    return job.decide_launch(
        reports,
        restart_allowed=restart_allowed,
        job="capture",
        restart_var="launch_restart_on_change",
        durable=durable,
    )


def test_nothing_there_launches():
    result = decide({"vm0": report(None, 0), "vm1": report(None, 1)})
    assert result["action"] == "launch"
    assert result["stop_first"] == []
    assert result["resume"] is None and result["fresh"] is False
    assert result["why"] == "job capture is not on the nodes: launching"


def test_nothing_there_with_checkpoints_resumes():
    result = decide(
        {"vm0": report(None, 0, checkpoints=CKPT0), "vm1": report(None, 1, checkpoints=CKPT1)}
    )
    assert (result["action"], result["resume"], result["fresh"]) == ("launch", 10, False)
    assert result["why"].endswith(", resuming from checkpoint-10")


@pytest.mark.parametrize(
    ("rank0", "rank1", "state"),
    [
        ("running", "running", "running"),
        ("exited-0", "exited-0", "finished"),
        ("exited-0", "running", "running"),
    ],
)
def test_the_same_job_healthy_everywhere_is_kept(rank0, rank1, state):
    result = decide({"vm1": report(rank1, 1), "vm0": report(rank0, 0)})
    assert result["action"] == "keep"
    assert result["state"] == state
    assert result["stop_first"] == []
    assert result["why"] == f"job capture is already {state}"


@pytest.mark.parametrize(
    ("rank0", "rank1", "state", "different"),
    [
        ("exited-0", "exited-0", "finished", "vm0, vm1"),
        ("running", "running", "running", "vm0, vm1"),
        ("exited-0", "running", "running", "vm0, vm1"),
    ],
)
def test_a_different_config_is_refused_without_restart(rank0, rank1, state, different):
    reports = {
        "vm0": report(rank0, 0, wanted="0123456789abcdef"),
        "vm1": report(rank1, 1, wanted="fedcba9876543210"),
    }
    result = decide(reports)
    assert result["action"] == "refuse"
    assert result["stop_first"] == []
    why = result["why"]
    assert f"job capture is {state} on {different} with a different configuration" in why
    assert "launch_restart_on_change=true" in result["why"]
    assert "nothing was changed" in result["why"]
    # The filter's default names the variable even without restart_var.
    plain = job.decide_launch(reports, job="capture")
    assert "launch_restart_on_change" in plain["why"]


def test_a_different_config_on_one_rank_only_is_refused():
    reports = {
        "vm0": report("running", 0),
        "vm1": report("running", 1, wanted="fedcba9876543210"),
    }
    result = decide(reports)
    assert result["action"] == "refuse"
    assert "running on vm1 with a different configuration" in result["why"]


def test_a_different_config_with_restart_allowed_stops_and_launches():
    reports = {
        "vm0": report("exited-0", 0, wanted="0123456789abcdef", checkpoints=CKPT0),
        "vm1": report("running", 1, wanted="fedcba9876543210", checkpoints=CKPT1),
    }
    result = decide(reports, restart_allowed=True)
    assert result["action"] == "launch"
    assert result["stop_first"] == ["vm1"]
    assert (result["resume"], result["fresh"]) == (10, False)
    assert result["why"] == (
        "job capture changed and launch_restart_on_change allows a restart, "
        "resuming from checkpoint-10"
    )


def test_a_failed_rank_next_to_a_running_one_relaunches_from_the_common_checkpoint():
    reports = {
        "vm1": report("killed-137", 1, checkpoints=CKPT1),
        "vm0": report("running", 0, checkpoints=CKPT0),
    }
    result = decide(reports)
    assert result["action"] == "launch"
    assert result["stop_first"] == ["vm0"]
    assert result["resume"] == 10
    assert result["fresh"] is False
    assert result["why"] == (
        "job capture did not finish (vm0 running, vm1 killed (SIGKILL, exit 137)): "
        "launching again, resuming from checkpoint-10"
    )


def test_the_newest_common_checkpoint_is_resumed():
    reports = {
        "vm0": report("exited-1", 0, checkpoints=[4, 8, 12]),
        "vm1": report("killed-137", 1, checkpoints=[4, 8]),
    }
    result = decide(reports)
    assert (result["action"], result["stop_first"], result["resume"]) == ("launch", [], 8)


def test_checkpoints_on_no_common_step_start_fresh():
    reports = {
        "vm0": report("exited-1", 0, checkpoints=[4]),
        "vm1": report("killed-137", 1, checkpoints=[6]),
    }
    result = decide(reports)
    assert (result["action"], result["resume"], result["fresh"]) == ("launch", None, True)
    assert "resuming" not in result["why"]


def test_a_node_without_any_checkpoint_is_named_instead_of_starting_over():
    reports = {
        "vm0": report("exited-1", 0, checkpoints=CKPT0),
        "vm1": report("killed-137", 1, checkpoints=[]),
    }
    result = decide(reports)
    assert result["action"] == "refuse"
    assert f"vm1 holds no checkpoint while vm0 holds checkpoint-{max(CKPT0)}" in result["why"]
    assert "llamafactory_output_uri" in result["why"] and "cleanup.yml" in result["why"]
    # With an output URI whose bucket holds nothing of the job, the same, saying so.
    empty_bucket = decide(reports, durable=[])
    assert empty_bucket["action"] == "refuse"
    assert "no checkpoint of the job is complete" in empty_bucket["why"]


def test_the_bucket_checkpoint_is_resumed_and_restored_where_missing():
    reports = {
        "vm0": report("exited-1", 0, checkpoints=[4, 8]),
        "vm1": report("killed-137", 1, checkpoints=[]),
    }
    result = decide(reports, durable=[4, 8])
    assert (result["action"], result["resume"], result["restore"]) == ("launch", 8, ["vm1"])
    assert result["why"].endswith("resuming from checkpoint-8 (from the bucket on vm1)")
    # A newer checkpoint on every node wins over the bucket's; nothing is downloaded.
    both = {h: dict(r, checkpoints=[4, 8, 12]) for h, r in reports.items()}
    newer = decide(both, durable=[8])
    assert (newer["resume"], newer["restore"]) == (12, [])


def test_labels_match_is_per_host_and_digest_the_fallback():
    # The captured ranks carry different digests (the config differs per node rank): each
    # node's job_status compares its own.
    reports = {"vm0": report("exited-1", 0), "vm1": report("running", 1)}
    vm0_digest = reports["vm0"]["container"]["labels"][LABEL_DIGEST]
    assert vm0_digest != reports["vm1"]["container"]["labels"][LABEL_DIGEST]
    assert reports["vm0"]["labels_match"] and reports["vm1"]["labels_match"]
    for r in reports.values():
        del r["labels_match"]
    assert job.decide_launch(reports, digest=DIGEST_CAPTURE_RANK1, job="x")["action"] == "launch"
    both_running = {"vm0": report("running", 0), "vm1": report("running", 1)}
    for r in both_running.values():
        del r["labels_match"]
    assert job.decide_launch(both_running, digest=DIGEST_CAPTURE_RANK1)["action"] == "keep"
    assert job.decide_launch(both_running, digest="0" * 16)["action"] == "refuse"


# --- verdict ------------------------------------------------------------------------------

NOW = epoch("2026-11-30T07:52:20")


def test_verdict_finished():
    reports = {
        "vm0": report("exited-0", 0, log="finished", received=NOW),
        "vm1": report("exited-0", 1, log="finished", received=NOW),
    }
    result = job.verdict(reports, NOW, 600, 120)
    assert result["state"] == "finished"
    assert result["failed"] == [] and result["reasons"] == {}
    assert result["line"].endswith("rank 0 exited with code 0, rank 1 exited with code 0")


def test_verdict_failed_names_the_rank_that_failed_first():
    # Captured together: rank 1 was killed at 07:52:15, rank 0 (torchrun) exited 1 at 07:52:18.
    reports = {
        "vm0": report("exited-1", 0, log="peer-killed", received=NOW),
        "vm1": report("killed-137", 1, log="killed", received=NOW),
    }
    result = job.verdict(reports, NOW, 600, 120)
    assert result["state"] == "failed"
    assert result["failed"] == ["vm1", "vm0"]
    assert result["reasons"] == {
        "vm1": "killed (SIGKILL, exit 137)",
        "vm0": "exited with code 1",
    }


def test_verdict_a_lost_container_fails():
    reports = {
        "vm0": report("running", 0, received=NOW, last_output_at=NOW - 1),
        "vm1": report(None, 1, received=NOW),
    }
    result = job.verdict(reports, NOW, 600, 120)
    assert result["state"] == "failed"
    assert result["failed"] == ["vm1"]
    assert result["reasons"] == {"vm1": "lost its container"}


def test_verdict_a_rank_that_stopped_answering_fails_before_the_others():
    reports = {
        "vm0": report("running", 0, received=NOW, last_output_at=NOW - 1),
        "vm1": report("running", 1, received=NOW - 300),
        "vm2": report(None, 2, received=NOW),
    }
    result = job.verdict(reports, NOW, 600, 120)
    assert result["state"] == "failed"
    # stale since NOW-300, the missing container seen now
    assert result["failed"] == ["vm1", "vm2"]
    assert result["reasons"]["vm1"] == "stopped answering"
    # just within stale_after: still answering
    reports["vm1"]["received"] = NOW - 119
    del reports["vm2"]
    assert job.verdict(reports, NOW, 600, 120)["state"] == "running"


def test_verdict_stalled_when_no_rank_wrote_for_stall_timeout():
    started = node.container_state(inspect("running"))["started_at"]
    now = started + 1000
    reports = {
        "vm0": report("running", 0, received=now, last_output_at=now - 700),
        "vm1": report("running", 1, received=now, last_output_at=now - 650),
    }
    result = job.verdict(reports, now, 600, 120)
    assert result["state"] == "stalled"
    assert result["quiet"] == pytest.approx(650)
    assert job.verdict(reports, now, 0, 120)["state"] == "running"  # 0: no stall check
    reports["vm1"]["last_output_at"] = now - 10
    assert job.verdict(reports, now, 600, 120)["state"] == "running"
    # No output yet: quiet counts from the newest container start.
    for r in reports.values():
        r["last_output_at"] = None
    assert job.verdict(reports, started + 500, 600, 120)["state"] == "running"
    assert job.verdict(reports, started + 700, 600, 120)["state"] == "stalled"


def test_verdict_running_with_progress_line():
    tail = (FIXTURES / "trainer_log-tail.jsonl").read_text()
    reports = {
        "vm0": report("running", 0, received=NOW, last_output_at=NOW - 5),
        "vm1": report("exited-0", 1, received=NOW, progress=node.last_progress(tail)),
    }
    result = job.verdict(reports, NOW, 600, 120)
    assert result["state"] == "running"
    assert result["progress"]["step"] == 400
    assert result["line"] == (
        "step 400/400 loss 5.6857 | rank 0 running, rank 1 exited with code 0"
    )


def test_progress_line_while_starting_shows_the_newest_log_line():
    reports = {
        "vm0": report("exited-1", 0, log="peer-killed"),
        "vm1": report("killed-137", 1, log="killed"),
    }
    newest = reports["vm0"]["log_lines"][-1]
    assert newest.startswith("subprocess.CalledProcessError: Command '['torchrun'")
    line = job.progress_line(reports, ["vm0", "vm1"], None)
    assert line == (
        f"starting: {newest[:90]} | rank 0 exited with code 1, rank 1 killed (SIGKILL, exit 137)"
    )
    reports["vm0"]["log_lines"] = ["", "  "]
    assert job.progress_line(reports, ["vm0", "vm1"], None).startswith("starting | rank 0")
    no_total = job.progress_line(reports, ["vm0"], {"step": 3, "total": None, "loss": None})
    assert no_total == "step 3/? | rank 0 exited with code 1"


# --- failure_message ----------------------------------------------------------------------


def captured_failure():
    reports = {
        "vm0": report("exited-1", 0, log="peer-killed", received=NOW),
        "vm1": report("killed-137", 1, log="killed", received=NOW),
    }
    return reports, job.verdict(reports, NOW, 600, 120)


def test_failure_message_of_the_captured_failure():
    reports, result = captured_failure()
    message = job.failure_message("capture", result, reports)
    lines = message.splitlines()
    assert lines[0] == "job capture failed: rank 1 (vm1) killed (SIGKILL, exit 137) first."
    assert lines[1] == "Then: rank 0 (vm0) exited with code 1."
    assert "The other ranks were stopped" in lines[2]
    assert lines[3] == "Last log lines of rank 1:"
    tail = lines[4:]
    assert len(tail) == 15
    # The killed rank's last 40 lines repeat two FutureWarnings: each shown once.
    assert tail[-1] == "  (23 repeated lines left out)"
    assert sum("FutureWarning" in line for line in tail) == 2
    assert tail.count("    return func(*args, **kwargs)") == 1
    assert "  [INFO|tokenization_utils_base.py:2111]" in "\n".join(tail)
    assert "Cause" not in message  # no diagnose given


def test_failure_message_with_the_diagnosis_table():
    reports, result = captured_failure()
    assert "Cause" not in job.failure_message("capture", result, reports, diagnose=diagnose)
    reports["vm0"]["log_lines"] += (LOGS / "gloo-loopback.log").read_text().splitlines()
    message = job.failure_message("capture", result, reports, diagnose=diagnose)
    assert "Cause (gloo-loopback, vm0): Gloo bound a loopback address" in message
    assert "\nFix: Set GLOO_SOCKET_IFNAME to the training NIC" in message
    # The diagnosis looks at every rank's log, not only the failing one's tail.
    assert message.index("Last log lines of rank 1:") < message.index("Cause (")


def test_failure_message_of_a_single_failure_without_logs():
    reports = {"vm0": report("running", 0, received=NOW), "vm1": report(None, 1, received=NOW)}
    result = job.verdict(reports, NOW, 600, 120)
    message = job.failure_message("demo", result, reports, diagnose=diagnose)
    assert message.splitlines()[0] == "job demo failed: rank 1 (vm1) lost its container first."
    assert "Then:" not in message
    assert "Last log lines" not in message


def test_failure_message_says_at_which_step():
    reports = captured_failure()[0]
    reports["vm0"]["progress"] = {"step": 10, "total": 400, "loss": 5.9, "percentage": 2.5}
    result = job.verdict(reports, NOW, 600, 120)
    assert result["progress"]["step"] == 10
    message = job.failure_message("capture", result, reports)
    assert "at step 10/400" in message.splitlines()[0]


def test_condense():
    # Each line stays where it last appeared (time order of the newest occurrences).
    assert job.condense(["a", "b", "a", "c", "b", "a"]) == [
        "c",
        "b",
        "a",
        "(3 repeated lines left out)",
    ]
    assert job.condense(["a", "b"]) == ["a", "b"]
    assert job.condense([]) == []


# --- describe -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        ({"state": "exited", "exit_code": 0}, "exited with code 0"),
        ({"state": "exited", "exit_code": 1}, "exited with code 1"),
        ({"state": "exited", "exit_code": 137}, "killed (SIGKILL, exit 137)"),
        ({"state": "exited", "exit_code": 143}, "stopped (SIGTERM, exit 143)"),
        (
            {"state": "exited", "exit_code": 124},
            "stopped at the job's time limit (gcp_instances_max_duration, exit 124)",
        ),
        (
            {"state": "exited", "exit_code": 137, "oom_killed": True},
            "killed by the kernel's OOM killer (exit 137)",
        ),
        ({"state": "missing"}, "has no container"),
        (None, "has no container"),
        ({"state": "running", "exit_code": 0}, "running"),
        ({"state": "paused"}, "paused"),
    ],
)
def test_describe(container, expected):
    assert job.describe({"container": container}) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("running", "running"),
        ("exited-0", "exited with code 0"),
        ("exited-1", "exited with code 1"),
        ("killed-137", "killed (SIGKILL, exit 137)"),
    ],
)
def test_describe_captured(name, expected):
    assert job.describe(report(name, 0)) == expected


def test_a_rank_that_cannot_be_queried_fails_the_job():
    reports = {
        "vm0": report("running", 0, received=NOW),
        "vm1": {
            "rank": 1,
            "container": {"state": "unknown"},
            "error": "docker: not found",
            "received": NOW,
        },
    }
    result = job.verdict(reports, NOW, 600, 120)
    assert result["state"] == "failed" and result["failed"] == ["vm1"]
    assert result["reasons"]["vm1"] == "could not be queried: docker: not found"


def test_verdict_of_no_reports():
    assert job.verdict({}, NOW, 600, 120)["line"] == "no ranks"


def advice_of(reports, now=NOW):
    result = job.verdict(reports, now, 600, 120)
    findings = diagnose(dict((h, "\n".join(r.get("log_lines") or [])) for h, r in reports.items()))
    return job.restart_advice(result, reports, findings)


def test_a_killed_rank_is_restartable_and_named():
    advice = advice_of(
        {
            "vm0": report("exited-1", 0, log="peer-killed", received=NOW),
            "vm1": report("killed-137", 1, log="killed", received=NOW),
        }
    )
    assert advice["restartable"] and advice["kind"] == "killed"
    assert advice["cause"] == "rank 1 (vm1) killed (SIGKILL, exit 137)"


def test_a_lost_node_is_restartable():
    advice = advice_of(
        {
            "vm0": report("running", 0, received=NOW, last_output_at=NOW - 1),
            "vm1": report("running", 1, received=NOW - 300),
        }
    )
    assert advice["restartable"] and advice["kind"] == "lost"
    assert advice["cause"] == "rank 1 (vm1) stopped answering"


def with_exit(code, rank, log_lines=(), oom=False):
    r = report("running", rank, received=NOW)
    r["container"] = dict(r["container"], state="exited", exit_code=code, oom_killed=oom)
    r["log_lines"] = list(log_lines)
    return r


AGENT_LINE = (
    "[hostnet.llamafactory agent] rank 0: stopping this rank: rank 1 (198.18.0.11:39949) has "
    "not answered for 31 s (peer_timeout 30 s): its node is gone, frozen or cut off"
)


@pytest.mark.parametrize(
    ("code", "lines", "oom", "restartable", "kind", "why"),
    [
        (75, [AGENT_LINE], False, True, "peer-lost", "another rank was lost"),
        (
            1,
            ["Connection closed by peer [198.18.0.11]:29351. This is typically caused by a remote"],
            False,
            True,
            "network",
            "peer-crashed",
        ),
        (
            1,
            ["ValueError: Cannot find dataset nope in dataset_info.json"],
            False,
            False,
            "",
            "on its own",
        ),
        (1, [], False, False, "", "exit 1"),
        (137, [], True, False, "", "out of memory"),
        (143, [], False, False, "", "stopped on purpose"),
        (124, [], False, False, "max-duration", "a cap is not retried"),
    ],
)
def test_what_a_restart_can_cure(code, lines, oom, restartable, kind, why):
    advice = advice_of(
        {"vm0": with_exit(code, 0, lines, oom), "vm1": report("running", 1, received=NOW)}
    )
    assert advice["restartable"] is restartable
    if kind:
        assert advice["kind"] == kind
    assert why in advice["why"]


def test_a_stalled_job_is_not_restarted():
    started = node.container_state(inspect("running"))["started_at"]
    reports = {
        "vm0": report("running", 0, received=started + 1000, last_output_at=started + 10),
        "vm1": report("running", 1, received=started + 1000, last_output_at=started + 10),
    }
    result = job.verdict(reports, started + 1000, 600, 120)
    assert result["state"] == "stalled"
    advice = job.restart_advice(result, reports)
    assert not advice["restartable"] and advice["kind"] == "stalled"


KILLED_AT_23 = {"restartable": True, "kind": "killed", "step": 23, "why": "killed"}


@pytest.mark.parametrize(
    ("advice", "restarts", "maximum", "restart", "why"),
    [
        (KILLED_AT_23, [], 1, True, ""),
        (KILLED_AT_23, [], 0, False, "no restart left (launch_max_restarts 0)"),
        # An agent's restart on the nodes counts against the same budget.
        (KILLED_AT_23, [{"kind": "killed", "step": 11}], 1, False, "no restart left"),
        (KILLED_AT_23, [{"kind": "killed", "step": 11}], 2, True, ""),
        (KILLED_AT_23, [{"kind": "killed", "step": 23}], 2, False, "the same failure (killed) at"),
        (KILLED_AT_23, [{"kind": "lost", "step": 23}], 2, True, ""),
        (
            {"restartable": False, "kind": "exited", "why": "it failed on its own"},
            [],
            2,
            False,
            "it failed on its own",
        ),
    ],
)
def test_decide_restart(advice, restarts, maximum, restart, why):
    decision = job.decide_restart(advice, restarts, maximum)
    assert decision["restart"] is restart
    assert decision["why"].startswith(why)


# The wait in one fork: rank 0's report carries its agent's view of the others
# (roles/launch/files/rank_agent.py, Agent.view) and the node's clock.
NODE_SKEW = 40.0  # the node's clock runs ahead of the controller's


def leader(name="running", peers=None, **extra):
    r = report(name, 0, received=NOW, **extra)
    r["now"] = NOW + NODE_SKEW
    r["agent"] = {"state": "running", "attempt": 0, "restarts": [], "peers": peers or {}}
    return r


def test_agent_reports_map_each_peers_last_answer_to_a_rank():
    peers = {
        "1": {"seen_at": NOW + NODE_SKEW - 3, "answer": {"state": "running", "quiet_s": 2.5}},
        "2": {"seen_at": NOW + NODE_SKEW - 900, "answer": {"state": "exited", "code": 0}},
        "3": {"seen_at": None, "answer": {}},
        "4": {
            "seen_at": NOW + NODE_SKEW - 1,
            "answer": {"state": "exited", "code": 137, "end": {"kind": "oom"}},
        },
        "5": {"seen_at": NOW + NODE_SKEW - 1, "answer": {"state": "restarting", "attempt": 1}},
    }
    ranks = {"vm0": 0, "vm1": 1, "vm2": 2, "vm3": 3, "vm4": 4, "vm5": 5, "vm6": 6}
    seen = job.agent_reports(leader(peers=peers), ranks, "vm0", NOW)
    assert sorted(seen) == ["vm1", "vm2", "vm3", "vm4", "vm5", "vm6"]
    # Heard from 3 s ago on the node's clock: 3 s ago on the controller's.
    assert seen["vm1"] == {
        "rank": 1,
        "container": {"state": "running"},
        "received": NOW - 3,
        "last_output_at": NOW - 5.5,
    }
    # An exited peer's last word stands, however old: it is not "stopped answering".
    assert seen["vm2"]["container"]["state"] == "exited"
    assert seen["vm2"]["container"]["exit_code"] == 0 and seen["vm2"]["received"] == NOW
    # Not heard from yet (the agents bound that with rendezvous_timeout), and not in the view.
    for host in ("vm3", "vm6"):
        assert seen[host]["container"] == {"state": "running"} and seen[host]["received"] == NOW
    assert seen["vm4"]["container"]["oom_killed"] is True
    assert seen["vm5"]["container"] == {"state": "running"}  # restarting on the nodes


def test_the_verdict_through_the_agent_names_the_killed_peer_and_finishes():
    ranks = {"vm0": 0, "vm1": 1}
    killed = {"1": {"seen_at": NOW + NODE_SKEW, "answer": {"state": "exited", "code": 137}}}
    own = leader(peers=killed)
    reports = dict(job.agent_reports(own, ranks, "vm0", NOW), vm0=own)
    result = job.verdict(reports, NOW, 600, 120)
    assert result["state"] == "failed" and result["failed"] == ["vm1"]
    assert result["reasons"] == {"vm1": "killed (SIGKILL, exit 137)"}
    done = {"1": {"seen_at": NOW + NODE_SKEW - 5, "answer": {"state": "exited", "code": 0}}}
    own = leader("exited-0", peers=done)
    reports = dict(job.agent_reports(own, ranks, "vm0", NOW), vm0=own)
    assert job.verdict(reports, NOW, 600, 120)["state"] == "finished"
    # Silent past the controller's bound (a node gone, its agent's peer_timeout longer).
    gone = {"1": {"seen_at": NOW + NODE_SKEW - 200, "answer": {"state": "running"}}}
    own = leader(peers=gone, last_output_at=NOW - 1)
    reports = dict(job.agent_reports(own, ranks, "vm0", NOW), vm0=own)
    result = job.verdict(reports, NOW, 600, 120)
    assert result["failed"] == ["vm1"] and result["reasons"]["vm1"] == "stopped answering"


def final(name, rank, log=None, **extra):
    """A node's job_status result after the wait (what wait.yml registers)."""
    r = report(name, rank, log=log, **extra)
    del r["rank"]
    return r


RANKS = {"vm0": 0, "vm1": 1}


def test_judge_a_finished_job():
    finals = {"vm0": final("exited-0", 0, log="finished"), "vm1": final("exited-0", 1)}
    finals["vm0"]["agent"] = {"restarts": [{"attempt": 1, "lost": 3}]}
    finals["vm0"]["checkpoints"] = [10, 12]
    watch = {"state": "finished", "elapsed": 30.2}
    result = job.judge_wait(watch, finals, RANKS, "demo", NOW, diagnose)
    assert result["failed"] is False and result["state"] == "finished"
    assert result["restarts"] == [{"attempt": 1, "lost": 3}]
    assert result["checkpoints"] == [10, 12] and result["elapsed"] == 30.2
    assert result["line"].endswith("rank 0 exited with code 0, rank 1 exited with code 0")


def test_judge_names_the_first_cause_not_the_rank_the_wait_stopped():
    # vm1 was killed; the wait stopped vm0 (SIGTERM) when it saw it through rank 0's agent.
    finals = {
        "vm0": final("exited-1", 0, log="peer-killed"),
        "vm1": final("killed-137", 1, log="killed"),
    }
    finals["vm0"]["container"] = dict(finals["vm0"]["container"], exit_code=143)
    watch = {"state": "failed", "stopped": True, "failed_hosts": ["vm1"]}
    result = job.judge_wait(watch, finals, RANKS, "capture", NOW, diagnose, stopped={"vm0"})
    assert result["failed"] is True and result["failed_ranks"] == [1]
    first = result["msg"].splitlines()[0]
    assert first == "job capture failed: rank 1 (vm1) killed (SIGKILL, exit 137) first."
    assert "Then:" not in result["msg"] and "Last log lines of rank 1:" in result["msg"]
    assert result["restart"]["restartable"] and result["restart"]["kind"] == "killed"
    # Without the stop, rank 0's own exit is a consequence, named after the cause.
    finals["vm0"] = final("exited-1", 0, log="peer-killed")
    result = job.judge_wait(watch, finals, RANKS, "capture", NOW, diagnose)
    assert result["msg"].splitlines()[1] == "Then: rank 0 (vm0) exited with code 1."


def test_judge_an_unreachable_node_is_a_lost_rank():
    finals = {
        "vm0": final("exited-1", 0, log="peer-killed"),
        "vm1": {"unreachable": True, "msg": "Failed to connect to the host via ssh"},
    }
    result = job.judge_wait({"state": "failed"}, finals, RANKS, "capture", NOW, diagnose)
    assert result["failed_ranks"] == [0, 1]
    assert "rank 1 (vm1) could not be queried: Failed to connect" in result["msg"]


def test_judge_a_stall_a_timeout_and_a_rank_left_running():
    finals = {"vm0": final("running", 0), "vm1": final("running", 1)}
    result = job.judge_wait(
        {"state": "stalled", "quiet": 700.4}, finals, RANKS, "stuck", NOW, diagnose, {"vm0", "vm1"}
    )
    assert result["failed"] and result["state"] == "stalled"
    assert result["msg"].startswith("job stuck stalled: no rank wrote a log line for 700 s")
    assert result["restart"]["restartable"] is False
    timeout = {"state": "running", "msg": "job stuck is still running after 60 s"}
    result = job.judge_wait(timeout, finals, RANKS, "stuck", NOW, diagnose)
    assert result["failed"] and result["msg"] == timeout["msg"]
    # Rank 0 ended and rank 1 still ran when the look after the wait gave up.
    finals["vm0"] = final("exited-0", 0)
    result = job.judge_wait({"state": "ended"}, finals, RANKS, "late", NOW, diagnose)
    assert result["failed"] and result["failed_ranks"] == [1]
    assert "rank 1 (vm1) was still running after rank 0 ended" in result["msg"]


def test_reports_without_rank_are_ordered_by_the_plans_ranks():
    # As the launch role passes them: job_status's reports as registered, ranks from the plan.
    reports = {h: dict(report("killed-137", r)) for h, r in (("vm1", 1), ("vm0", 0))}
    for each in reports.values():
        del each["rank"]
    result = job.decide_launch(reports, job="capture", ranks={"vm0": 0, "vm1": 1})
    assert result["action"] == "launch"
    assert result["why"].startswith("job capture did not finish (vm0 killed")


def test_a_reports_wanted_digest_still_counts_without_labels_match():
    reports = {"vm0": report("running", 0), "vm1": report("running", 1)}
    for each in reports.values():
        del each["labels_match"]
    reports["vm1"]["wanted"] = "fedcba9876543210"
    result = job.decide_launch(reports, digest=DIGEST_CAPTURE_RANK1, job="x")
    assert result["action"] == "refuse" and "on vm1 with a different configuration" in result["why"]


# ------------------------------------------------------------------ a job read from rank 0 alone

NODES = {"vm0": 0, "vm1": 1, "vm2": 2}
ADDRESSES = {"vm0": "10.0.0.2", "vm1": "10.0.0.3", "vm2": "10.0.0.4"}


def finished_rank0(**record):
    """Rank 0's read of a job it finished (inspect-exited-0.json), with the record the collect
    step wrote (its defaults: this container, the same nodes and ranks)."""
    read = report("exited-0", 0)
    read["record"] = {
        "job": "demo",
        "container": job.record_of(read),
        "ranks": NODES,
        "addresses": ADDRESSES,
        **record,
    }
    return read


def test_a_recorded_finished_job_stands_for_every_rank_and_is_kept():
    found = job.settled(finished_rank0(), DIGEST_DEMO_RANK0, "demo", NODES, "vm0")
    assert found["addresses"] == ADDRESSES
    assert set(found["reports"]) == set(NODES)
    assert found["reports"]["vm0"]["container"]["exit_code"] == 0
    assert found["reports"]["vm0"]["wanted"] == DIGEST_DEMO_RANK0
    decision = job.decide_launch(found["reports"], job="demo", ranks=NODES)
    assert (decision["action"], decision["state"]) == ("keep", "finished")
    # The wait's judgment over the same reports: finished, with rank 0's progress.
    watch = {"state": "finished", "elapsed": 0.1}
    judged = job.judge_wait(
        watch, found["reports"], NODES, "demo", now=epoch("2026-01-01T00:00:00")
    )
    assert judged["failed"] is False and judged["state"] == "finished"


@pytest.mark.parametrize(
    ("why", "read", "digest", "ranks"),
    [
        (
            "no record (finished before records, or never collected)",
            report("exited-0", 0),
            None,
            NODES,
        ),
        ("another job's record", finished_rank0(job="other"), None, NODES),
        (
            "a record of an earlier container (launched again since)",
            finished_rank0(container={"id": "000000000000", "started_at": 1.0}),
            None,
            NODES,
        ),
        ("rank 0's settings changed (another digest)", finished_rank0(), "0123456789abcdef", NODES),
        ("a node added", finished_rank0(), None, {**NODES, "vm3": 3}),
        ("the ranks moved", finished_rank0(), None, {"vm0": 0, "vm1": 2, "vm2": 1}),
        (
            "the record lacks a node's address",
            finished_rank0(addresses={"vm0": "10.0.0.2"}),
            None,
            NODES,
        ),
        (
            "a node's address unknown (an agent that did not say it)",
            finished_rank0(addresses={**ADDRESSES, "vm2": None}),
            None,
            NODES,
        ),
        (
            "rank 0 failed",
            dict(report("exited-1", 0), record=finished_rank0()["record"]),
            None,
            NODES,
        ),
        (
            "rank 0 runs again",
            dict(report("running", 0), record=finished_rank0()["record"]),
            None,
            NODES,
        ),
        (
            "rank 0 has no container",
            dict(report(None, 0), record=finished_rank0()["record"]),
            None,
            NODES,
        ),
    ],
)
def test_anything_but_the_recorded_job_finished_reads_every_node(why, read, digest, ranks):
    assert job.settled(read, digest or DIGEST_DEMO_RANK0, "demo", ranks, "vm0") == {}, why


def test_only_rank_0s_read_stands_for_the_others():
    assert job.settled(finished_rank0(), DIGEST_DEMO_RANK0, "demo", NODES, "vm1") == {}
    assert job.settled(None, DIGEST_DEMO_RANK0, "demo", NODES, "vm0") == {}
