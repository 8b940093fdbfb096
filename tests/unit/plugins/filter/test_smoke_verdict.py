"""The filter smoke_verdict as roles/preflight/tasks/smoke.yml calls it: rank 0's output (the
smoke test's lines, NCCL's INFO lines, the result's JSON line, from which the task takes
`result`), and the node profile's NCCL network and expected bandwidth as primary_nic reports them
(module_utils/_network_profile.py)."""

import json

import pytest
from ansible_collections.hostnet.llamafactory.plugins.filter.smoke_verdict import (
    FilterModule,
    smoke_verdict,
)
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _network_profile

GIB = 1 << 30


def rank0_output(world, backend, collective, size, busbw, network=None, sweep=None):
    """rank 0's `docker logs` lines, as roles/preflight/files/smoke_allreduce.py prints them;
    sweep: {bytes: busbw} of the smaller sizes before `size`."""
    factor = {"all_reduce": 2 * (world - 1) / world, "all_gather": (world - 1) / world}
    algbw = round(busbw / factor[collective], 3)  # smoke_allreduce.py's BUS_FACTOR
    sizes = [
        {"bytes": b, "busbw_GBps": bw, "algbw_GBps": round(bw / factor[collective], 3)}
        for b, bw in {**(sweep or {}), size: busbw}.items()
    ]
    lines = [f"smoke test: rank 0 of {world} joined in 3.2 s"]
    if network:
        lines.append(f"a3mega-vm-0:606:642 [0] NCCL INFO Using network {network}")
        lines.append(
            "a3mega-vm-0:606:642 [0] NCCL INFO comm 0x5581 rank 0 nRanks 16 - Init COMPLETE"
        )
    result = {
        "world_size": world,
        "backend": backend,
        "collective": collective,
        "bytes": size,
        "iterations": 5,
        "seconds_per_call": 0.0701,
        "algbw_GBps": algbw,
        "busbw_GBps": busbw,
        "joined_s": 3.2,
        "sizes": sizes,
    }
    lines.append(json.dumps({"smoke": result}))
    return lines


def judge(lines, machine_type=None, profile="socket", gpus_per_node=0):
    """smoke.yml's task: `result` from the last '{"smoke"' line, the profile's values."""
    result = json.loads([line for line in lines if line.startswith('{"smoke"')][-1])["smoke"]
    return smoke_verdict(
        result,
        log_lines=lines,
        network=_network_profile.NCCL_NETWORKS[profile],
        expected=_network_profile.expected_bandwidth(machine_type, profile),
        gpus_per_node=gpus_per_node,
    )


def test_the_demos_gloo_run_on_cpus_passes_with_its_line():
    lines = rank0_output(2, "gloo", "all_reduce", 64_000_000, 0.91)
    assert judge(lines) == {
        "findings": [],
        "warnings": [],
        "line": "all_reduce of 64.0 MB across 2 ranks (gloo): bus bandwidth 0.91 GB/s "
        "(algorithm 0.91 GB/s)",
        "passed": True,
    }


def test_an_a3_mega_job_on_fastrak_is_judged_on_the_average_over_2_4_8_gib():
    # cluster-health-scanner's rule: the average busbw of the 2, 4 and 8 GiB all_gather.
    sweep = {2 * GIB: 140.0, 4 * GIB: 150.0}
    lines = rank0_output(16, "nccl", "all_gather", 8 * GIB, 160.0, "FasTrak", sweep)
    verdict = judge(lines, "a3-megagpu-8g", "tcpxo", gpus_per_node=8)
    assert verdict["findings"] == [] and verdict["warnings"] == []
    assert verdict["line"].endswith(
        "; NCCL network FasTrak; average busbw over 2, 4, 8 GiB 150.0 GB/s, 100% of the pass "
        "mark 150 GB/s; 85% of the published 188.5 GB/s (peak, 8 GiB)"
    )
    # 8 GiB alone above the mark, the average under it: a warning.
    sweep = {2 * GIB: 120.0, 4 * GIB: 140.0}
    lines = rank0_output(16, "nccl", "all_gather", 8 * GIB, 160.0, "FasTrak", sweep)
    low = judge(lines, "a3-megagpu-8g", "tcpxo", gpus_per_node=8)
    assert low["warnings"][0].startswith(
        "average bus bandwidth 140.0 GB/s is under the pass mark 150 GB/s"
    )


def test_a3_high_over_tcpxo_has_no_pass_mark_and_says_so():
    sweep = {2 * GIB: 40.0, 4 * GIB: 45.0}
    lines = rank0_output(16, "nccl", "all_gather", 8 * GIB, 50.0, "FasTrak", sweep)
    verdict = judge(lines, "a3-highgpu-8g", "tcpxo", gpus_per_node=8)
    assert verdict["warnings"] == []
    assert "average busbw over 2, 4, 8 GiB 45.0 GB/s (no pass mark known" in verdict["line"]
    assert "for TCPX" in verdict["line"]


def test_plain_sockets_under_the_tcpxo_profile_stop_the_launch():
    lines = rank0_output(16, "nccl", "all_gather", 8 << 30, 3.1, network="Socket")
    verdict = judge(lines, "a3-megagpu-8g", "tcpxo", gpus_per_node=8)
    assert [f["id"] for f in verdict["findings"]] == ["network-plugin-not-used"]
    assert verdict["passed"] is False
    # smoke.yml's message: the causes, then "Fix:" and the fixes.
    assert verdict["findings"][0]["cause"].startswith("NCCL used Socket, not FasTrak")
    assert "role nccl_plugin" in verdict["findings"][0]["fix"]
    unseen = judge(
        [line for line in lines if "Using network" not in line], "a3-ultragpu-8g", "gib", 8
    )
    assert [f["id"] for f in unseen["findings"]] == ["nccl-network-unseen"]


def test_a_missing_size_or_another_shape_gets_no_fraction():
    sweep = {2 * GIB: 60.0, 4 * GIB: 60.0}
    lines = rank0_output(16, "nccl", "all_gather", 8 * GIB, 60.0, "FasTrak", sweep)
    four = judge(lines, "a3-megagpu-8g", "tcpxo", gpus_per_node=4)
    assert four["warnings"] == []
    assert four["line"].endswith(
        "(no fraction: the pass mark is for all_gather averaged over 2, 4, 8 GiB on nodes of "
        "8 GPUs)"
    )
    # 8 GiB alone (no sweep): the rule cannot be applied.
    alone = judge(
        rank0_output(16, "nccl", "all_gather", 8 * GIB, 60.0, "FasTrak"),
        "a3-megagpu-8g",
        "tcpxo",
        8,
    )
    assert alone["warnings"] == [] and "(no fraction" in alone["line"]


RANKS = {"vm0": 0, "vm1": 1, "vm2": 2}


def status(state, code=None, finished=None, lines=()):
    """A node's job_status report of its smoke container (module_utils/_job_status.py's keys)."""
    container = {"state": state}
    if state == "exited":
        container.update(exit_code=code, finished_at=finished, oom_killed=False)
    return {"container": container, "log_lines": list(lines)}


def test_a_failed_smoke_test_names_the_rank_that_failed_first_with_its_lines():
    # rank 2 could not reach rank 0's store first; rank 0 then timed out in its collective.
    statuses = {
        "vm0": status("exited", 1, 1796000105.0, ["smoke test: rank 0 of 3 joined in 1.0 s"]),
        "vm1": status("exited", 0, 1796000104.0),
        "vm2": status(
            "exited",
            1,
            1796000100.0,
            ["Traceback (most recent call last):", "RuntimeError: connect() timed out.", ""],
        ),
    }
    verdict = smoke_verdict(
        None, log_lines=["smoke test: rank 0 of 3 joined in 1.0 s"], ranks=RANKS, statuses=statuses
    )
    assert verdict["passed"] is False and verdict["line"] == ""
    [finding] = verdict["findings"]
    assert finding["id"] == "smoke-test-failed"
    assert finding["cause"] == (
        "the smoke test (torchrun across 3 nodes) failed: rank 2 (vm2) exited with code 1 "
        "first; then rank 0 (vm0) exited with code 1. Its errors: RuntimeError: connect() "
        "timed out."
    )
    assert "preflight_smoke_test: false" in finding["fix"]


def test_the_errors_torchrun_printed_are_shown_once_each():
    lines = [
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "/smoke.py", line 96, in main',
        "[rank0]: RuntimeError: Gloo connectFullMesh failed with [../gloo/transport/tcp/pair.cc]",
        "[rank0]: RuntimeError: Gloo connectFullMesh failed with [../gloo/transport/tcp/pair.cc]",
        "E1204 torch/distributed/elastic/multiprocessing/api.py failed (exitcode: 1)",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "/smoke.py FAILED",
    ]
    statuses = {"vm0": status("exited", 1, 5.0, lines), "vm1": status("exited", 0, 4.0)}
    [finding] = smoke_verdict(None, log_lines=[], ranks={"vm0": 0, "vm1": 1}, statuses=statuses)[
        "findings"
    ]
    assert finding["cause"].endswith(
        "rank 0 (vm0) exited with code 1. Its errors: [rank0]: RuntimeError: Gloo "
        "connectFullMesh failed with [../gloo/transport/tcp/pair.cc] | "
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"
    )


def test_a_rank_at_the_deadline_before_joining_points_at_the_ports_between_the_nodes():
    # torchrun's summary of a child ended by smoke_allreduce.py's SIGALRM.
    lines = [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "/smoke.py FAILED",
        "Root Cause (first observed failure):",
        "  exitcode  : -14 (pid: 57)",
        "  error_file: <N/A>",
        "  traceback : Signal 14 (SIGALRM) received by PID 57",
    ]
    statuses = {"vm0": status("exited", 1, 9.0), "vm1": status("exited", 1, 5.0, lines)}
    [finding] = smoke_verdict(None, log_lines=[], ranks={"vm0": 0, "vm1": 1}, statuses=statuses)[
        "findings"
    ]
    assert finding["cause"] == (
        "the smoke test (torchrun across 2 nodes) failed: rank 1 (vm1) exited with code 1 "
        "first; then rank 0 (vm0) exited with code 1. Its errors: "
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: | exitcode  : -14 "
        "(pid: 57) | traceback : Signal 14 (SIGALRM) received by PID 57. It reached the smoke "
        "test's deadline (SIGALRM, preflight_timeout) before the ranks joined: their "
        "connections to each other hang"
    )
    assert finding["fix"].startswith("open every TCP port between the nodes")
    statuses["vm1"]["log_lines"] = ["smoke test: rank 1 of 2 joined in 0.1 s", *lines]
    [late] = smoke_verdict(None, log_lines=[], ranks={"vm0": 0, "vm1": 1}, statuses=statuses)[
        "findings"
    ]
    assert late["cause"].endswith("(SIGALRM, preflight_timeout) in its collective")


def test_a_known_cause_in_the_failed_ranks_lines_gives_its_fix():
    line = "NCCL WARN socketStartConnect: Connect to 172.17.0.2<49113> failed : Software"
    statuses = {"vm0": status("exited", 1, 5.0, [line]), "vm1": status("exited", 143, 9.0)}
    [finding] = smoke_verdict(None, log_lines=[], ranks={"vm0": 0, "vm1": 1}, statuses=statuses)[
        "findings"
    ]
    assert finding["cause"].startswith(
        "the smoke test (torchrun across 2 nodes) failed: rank 0 (vm0) exited with code 1 first; "
        "then rank 1 (vm1) stopped (SIGTERM, exit 143). Its last lines: NCCL WARN"
    )
    assert finding["cause"].endswith(
        "a Docker bridge address: the containers run on Docker's "
        "bridge network and advertise addresses that only their own VM can reach."
    )
    assert finding["fix"].startswith("Run the training containers with host networking")


def test_rank_0_without_a_result_and_no_rank_read_is_named_from_its_own_output():
    # Rank 0 stopped at the wait's timeout (still running, then stopped): its own lines.
    statuses = {"vm0": status("exited", 137, 3.0, ["smoke test: rank 0 of 2 joined in 1.0 s"])}
    [finding] = smoke_verdict(None, log_lines=[], ranks={"vm0": 0}, statuses=statuses)["findings"]
    assert finding["cause"].startswith(
        "the smoke test (torchrun across 1 node) failed: rank 0 (vm0) killed (SIGKILL, exit 137). "
        "Its last lines: smoke test: rank 0 of 2"
    )
    alone = smoke_verdict(None, log_lines=["torchrun: not found"], network="Socket")
    assert alone["findings"][0]["cause"] == (
        "the smoke test failed: rank 0 printed no result. Its last lines: torchrun: not found"
    )


def test_options_by_name_only():
    with pytest.raises(TypeError):
        smoke_verdict(None, [], "Socket")  # pylint: disable=too-many-function-args,missing-kwoa


def test_the_call_site_names_every_option(call_sites):
    assert FilterModule().filters()["smoke_verdict"] is smoke_verdict
    calls = call_sites("smoke_verdict", smoke_verdict)
    assert [(c[0], c[1], sorted(c[2])) for c in calls] == [
        (
            "roles/preflight/tasks/smoke.yml",
            0,
            ["expected", "gpus_per_node", "log_lines", "network", "ranks", "statuses"],
        )
    ]
