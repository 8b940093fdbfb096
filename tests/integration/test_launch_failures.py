"""Jobs that end on their own when a node is lost, with the controller gone, and re-attaching
to them (real LLaMA-Factory ranks on the session's cluster, under their agents)."""

import json
import threading
import time

import pytest
from conftest import (
    JOBS,
    OUTPUTS,
    PULL_VARS,
    assert_resumed,
    container,
    follow_restarts,
    forget_job,
    play,
    run_playbook,
    said,
    summarize,
    wait_until,
)
from test_launch import logs

pytestmark = pytest.mark.cluster

# Still training when the node vanishes, with a checkpoint every 10 steps to restart from.
LONG = {"max_steps": 1000, "save_steps": 10}
BOUND = 20  # launch_peer_timeout of this test


def attach(inventory, tmp_path, job, timeout=600, overrides=None, **extravars):
    result, _facts, _results = run_playbook(
        inventory,
        tmp_path,
        "playbooks/wait.yml",
        {
            **PULL_VARS,
            "llamafactory_job": job,
            "launch_results_dir": str(tmp_path.parent / "results"),
            "llamafactory_train_overrides": LONG if overrides is None else overrides,
            **extravars,
        },
        timeout=timeout,
    )
    return summarize(result)


def shown(events):
    return "\n".join(str(e.get("stdout", "")) for e in events)


def test_a_vanished_node_ends_the_job_within_the_bound_without_the_controller(
    train_cluster, tmp_path
):
    """Detached, re-attached, then the controller is killed in its wait; then a node vanishes
    and the other rank ends within the bound. (The agents' restart after a killed worker is
    test_launch.py's killed-worker test.)"""
    inventory, (vm0, vm1) = train_cluster
    job = "e2e-vanish"
    forget_job((vm0, vm1), job)
    rc, _stats, failures, events = play(
        inventory,
        tmp_path / "start",
        job,
        launch_wait=False,
        launch_peer_timeout=BOUND,
        llamafactory_train_overrides=LONG,
    )
    assert rc == 0, failures
    assert "Re-attach with playbooks/wait.yml" in said(events)
    assert all(container(vm, job)["State"]["Running"] for vm in (vm0, vm1))
    # Every other wait is bounded too: torchrun's rendezvous, and the collective timeout (the
    # demo's config keeps upstream's ddp_timeout: 180000000, lowered with a warning).
    assert "ddp_timeout 180000000 in llama3_lora_sft_ds3.yaml is lowered to 3600 s" in said(events)
    assert "ddp_timeout: 3600" in vm0.sh(f"cat {JOBS}/{job}/config.yaml").stdout
    env = vm0.sh(f"cat {JOBS}/{job}/env").stdout.splitlines()
    assert "PET_RDZV_CONF=timeout=600,join_timeout=600" in env
    shard = f"{JOBS}/{job}/output/checkpoint-10/global_step10"
    wait_until(
        lambda: all(vm.sh(f"test -d {shard}", check=False).returncode == 0 for vm in (vm0, vm1)),
        600,
        "the first checkpoint on both nodes",
    )

    # Re-attach, then the controller is killed in the middle of its wait (ansible-runner's
    # timeout kills ansible-playbook): the ranks go on, with progress shown until then.
    rc, _stats, _failures, events = attach(inventory, tmp_path / "attach", job, timeout=25)
    assert rc != 0  # killed
    assert f"[{job}] step " in shown(events)
    assert all(container(vm, job)["State"]["Running"] for vm in (vm0, vm1))

    agent = json.loads(vm0.sh(f"cat {JOBS}/{job}/agent.json").stdout)
    address0, address1 = agent["address"], agent["peers"]["1"]
    # vm1 vanishes: every packet between it and vm0 dropped, its rank frozen (no reset sent).
    cut = f"iptables -I INPUT -s {address0} -j DROP && iptables -I OUTPUT -d {address0} -j DROP"
    vm1.sh(f"{cut} && docker pause llamafactory-{job}")
    vanished = time.monotonic()
    try:
        wait_until(
            lambda: not container(vm0, job)["State"]["Running"],
            BOUND + 120,
            "rank 0 stopped after rank 1 vanished",
        )
        took = time.monotonic() - vanished
        print(f"BENCH peer-lost-bound {BOUND} s: rank 0 exited {took:.1f} s after the cut")
        # The bound, one poll interval, one unanswered ask, the stop (SIGTERM) and the polls here.
        assert BOUND <= took <= BOUND + 5 + 3 + 10 + 15
        assert container(vm0, job)["State"]["ExitCode"] == 75
        line = [line for line in logs(vm0, job).splitlines() if "stopping this rank" in line][-1]
        assert f"rank 0: stopping this rank: rank 1 ({address1}:{agent['port']}) has not " in line
    finally:
        vm1.sh(
            f"docker unpause llamafactory-{job}; "
            f"iptables -D INPUT -s {address0} -j DROP; iptables -D OUTPUT -d {address0} -j DROP",
            check=False,
        )
    # Rank 1 comes back to a job that is over: its agent stops it too.
    wait_until(lambda: not container(vm1, job)["State"]["Running"], 120, "rank 1 stopped")

    # Re-attaching to the failed job reports it at once, with the cause.
    started = time.monotonic()
    rc, _stats, failures, _events = attach(inventory, tmp_path / "again", job)
    assert rc != 0
    assert time.monotonic() - started < 60
    message = failures["vm0"]["msg"]
    assert message.startswith(f"job {job} failed at step"), message
    assert "Cause (peer-lost, vm0)" in message and f"rank 1 ({address1}:" in message
    # Stopped by its own agent, not by a fork of the killed controller.
    assert "rank 1 (vm1) stopped (SIGTERM" not in message


def test_a_job_past_its_time_limit_stops_without_the_controller_and_its_vms_stop(
    train_cluster, test_cluster, box, tmp_path
):
    """gcp_instances_max_duration, detached: every rank's agent stops its training at the limit
    with nobody watching; the re-attach names the limit, does not restart, brings the logs and
    stops the VMs (gcp_instances_when_failed: stop), as after any failure."""
    inventory, vms = train_cluster
    job = "e2e-limit"
    limit = 45  # from the launch step: the ranks may still be loading the model
    forget_job(vms, job)
    launched = time.time()
    rc, _stats, failures, _events = play(
        inventory,
        tmp_path / "start",
        job,
        launch_wait=False,
        gcp_instances_max_duration=limit,
        llamafactory_train_overrides=LONG,
    )
    assert rc == 0, failures
    agent = json.loads(vms[0].sh(f"cat {JOBS}/{job}/agent.json").stdout)
    assert agent["max_duration"] == limit and launched < agent["deadline"] - limit < time.time()
    wait_until(
        lambda: not any(container(vm, job)["State"]["Running"] for vm in vms),
        limit + 180,
        "every rank stopped at the time limit",
    )
    for vm in vms:
        state = container(vm, job)["State"]
        assert state["ExitCode"] == 124, state
        said_by_agent = f"stopping this rank: the job ran to gcp_instances_max_duration ({limit} s)"
        assert said_by_agent in logs(vm, job)
    try:
        rc, _stats, failures, events = attach(
            inventory, tmp_path / "attach", job, gcp_instances_when_failed="stop"
        )
        assert rc != 0
        message = failures["vm0"]["msg"]
        assert "stopped at the job's time limit (gcp_instances_max_duration, exit 124)" in message
        text = said(events)
        assert "restart 1 of" not in text
        assert (tmp_path / "results" / job / "logs").is_dir()
        for vm in vms:
            assert box.instance(vm.name)["status"] == "TERMINATED"
            assert (
                f"{vm.name} ({vm.name}, {box.zone}): RUNNING -> TERMINATED (stop) "
                "(gcp_instances_when_failed: stop)" in text
            )
    finally:
        for vm in vms:
            if box.instance(vm.name)["status"] != "RUNNING":
                box.act(vm.name, "start")
        follow_restarts(test_cluster, vms)  # new external addresses, for the later tests


def test_a_stopped_vm_is_started_the_job_resumes_and_the_vms_stop_when_done(
    train_cluster, test_cluster, box, bucket, tmp_path
):
    """A VM whose rank is frozen, its disk wiped, and which is then stopped through the API
    mid-training (the box's preemption of a VM that comes back on a fresh disk) with
    gcp_instances_restart_stopped and llamafactory_output_uri: started again, its part of the
    checkpoint complete in the bucket downloaded, the job resumes from it and finishes;
    gcp_instances_when_done: stop then TERMINATES both VMs once the results are on the
    controller. Re-attached with delete: without an output URI and the adapter too large for the
    controller every VM is kept; with the model verified in the bucket the delete goes ahead,
    and VMs the launch did not label are refused."""
    inventory, vms = train_cluster
    job = "e2e-vm"
    forget_job(vms, job)
    longer = {"max_steps": 100, "save_steps": 10}
    outcome = {}

    def run():
        outcome["result"] = play(
            inventory,
            tmp_path / "train",
            job,
            launch_max_restarts=1,
            # The wait sees the VM's loss through rank 0's agent: within launch_peer_timeout.
            launch_peer_timeout=30,
            gcp_instances_restart_stopped=True,
            gcp_instances_when_done="stop",
            llamafactory_train_overrides=longer,
            # Each checkpoint in the bucket within seconds: the VM stops mid-training.
            gcs_outputs_interval_s=2,
            # The wait for a checkpoint, the stop, the restart and 100 steps: one run.
            timeout=1500,
            **OUTPUTS,
        )

    thread = threading.Thread(target=run)
    thread.start()
    try:
        # Rank 1 frozen once past its first checkpoint, so that the job cannot end before its VM
        # stops, however fast the machine trains (the sync service beside it goes on).
        later = f"ls {JOBS}/{job}/output | grep -qx 'checkpoint-[2-9]0'"
        wait_until(
            lambda: not thread.is_alive() or vms[1].sh(later, check=False).returncode == 0,
            600,
            "rank 1 past its first checkpoint",
        )
        vms[1].sh(f"docker pause llamafactory-{job}", check=False)
        prefix = OUTPUTS["llamafactory_output_uri"].split("/", 3)[3] + f"/{job}/checkpoints/"
        complete = wait_until(
            lambda: not thread.is_alive() or bucket.complete_checkpoints(prefix),
            600,
            "the first checkpoint complete in the bucket",
        )
        assert thread.is_alive(), f"the job ended before its first checkpoint: {outcome}"
        # vm1's disk lost: its whole output folder (every checkpoint part) gone, then the VM.
        vms[1].sh(f"rm -rf {JOBS}/{job}/output/*")
        box.act(vms[1].name, "stop")  # the box's preemption
        thread.join(900)
        assert not thread.is_alive(), "the playbook did not end"
        rc, _stats, failures, events = outcome["result"]
        assert rc == 0, f"rc {rc} (254: the run's timeout): " + json.dumps(failures, indent=1)
        text = said(events)
        assert f"{vms[1].name} ({vms[1].name}) was TERMINATED (stopped: " in text
        restart = next(line for line in text.splitlines() if line.startswith("restart 1 of 1"))
        assert restart.startswith(f"restart 1 of 1 after the VM of {vms[1].name} is TERMINATED")
        failed_at = int(restart.split(" at step ")[1].split(":")[0])
        resumed_at = int(restart.split("resuming from checkpoint-")[1].split(",")[0])
        lost = int(restart.split(", ")[-1].split(" steps lost")[0])
        assert resumed_at >= complete[-1] and lost == failed_at - resumed_at
        assert f"{vms[1].name}: checkpoint-{resumed_at} restored from " in text
        assert f"resuming from checkpoint-{resumed_at} (from the bucket on {vms[1].name})" in text
        log = (tmp_path / "results" / job / "trainer_log.jsonl").read_text().splitlines()
        steps = [json.loads(line)["current_steps"] for line in log if line.strip()]
        assert_resumed(steps, resumed_at, lost, longer["max_steps"])
        for vm in vms:
            assert box.instance(vm.name)["status"] == "TERMINATED"
            assert (
                f"{vm.name} ({vm.name}, {box.zone}): RUNNING -> TERMINATED (stop) "
                "(gcp_instances_when_done: stop)" in text
            )
        tasks = [e["event_data"]["task"] for e in events if e.get("event") == "runner_on_ok"]
        assert tasks.index(
            "Bring the training log, the loss plot and the trained model to the controller, "
            "and record the job's end on rank 0"
        ) < tasks.index("Stop or delete the VM through the Compute Engine API")
    finally:
        thread.join(900)
        for vm in vms:
            if box.instance(vm.name)["status"] != "RUNNING":
                box.act(vm.name, "start")
        follow_restarts(test_cluster, vms)  # new external addresses, for the later tests
    # Delete with the adapter too large to bring to the controller: every VM is kept, and the
    # play says why and where the adapter is.
    rc, _stats, failures, events = attach(
        inventory,
        tmp_path / "keep",  # a runner folder of its own: ansible-runner keeps a run's extra vars
        job,
        overrides=longer,
        gcp_instances_when_done="delete",
        launch_fetch_model_max_mb=0.000001,
        llamafactory_output_uri="",
    )
    assert rc != 0
    message = failures["vm0"]["msg"]
    kept = "The job finished, but every VM is kept (gcp_instances_when_done: delete)"
    assert message.startswith(kept)
    assert "over launch_fetch_model_max_mb 1e-06" in message
    assert f"vm0:{JOBS}/{job}/output yourself" in message
    assert "Stop or delete the VM through the Compute Engine API" not in [
        e["event_data"]["task"] for e in events if e.get("event") == "runner_on_ok"
    ]
    for vm in vms:
        assert box.instance(vm.name)["status"] == "RUNNING"
    # With the model verified in the bucket (and too large for the controller), the delete goes
    # ahead - and is refused for VMs the launch did not label.
    rc, _stats, failures, events = attach(
        inventory,
        tmp_path / "delete",
        job,
        overrides=longer,
        gcp_instances_when_done="delete",
        launch_fetch_model_max_mb=0.000001,
        **OUTPUTS,
    )
    assert rc != 0
    # A finished job, reported at once.
    assert f"job {job} finished: {longer['max_steps']} steps" in said(events)
    message = failures["vm0"]["msg"]
    assert "not deleted: it lacks the labels that make it this job's own" in message
    assert f"llamafactory-job={job} (has none)" in message
    for vm in vms:
        assert box.instance(vm.name)["status"] == "RUNNING"
