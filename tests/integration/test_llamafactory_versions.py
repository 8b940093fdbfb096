"""The support matrix's LLaMA-Factory row: train.yml with LLaMA-Factory 0.9.0, the last release
that reads RANK for the node rank (0.9.1 and newer read NODE_RANK; the launch sets both).

The 0.9.0 image is a layer on the session's 0.9.5 image (tools/localcluster/train_image.py),
pushed to the cluster's registry and pulled through the role like the default image. The job is
the demo's LoRA SFT without DeepSpeed: with 0.9.0's newest usable transformers (4.44.2) on the
CPU image's torch 2.13, ZeRO-3 fails at the first scheduler step (DeepSpeed drops LoRA's empty
no-decay parameter group, and torch 2.13 zips the groups strictly), so the ranks use plain DDP
over Gloo.

The same run reads its dataset from a shared mount (a folder every node has mounted, as from
Filestore or gcsfuse): two independent checks of one training run.
"""

import json
import subprocess

import pytest
from conftest import JOBS, ROOT, container, play
from localcluster import cluster, registry, train_image

pytestmark = pytest.mark.cluster  # brings up a local cluster

VERSION = "0.9.0"
JOB = "lf090"
STEPS = 4
SHARED = "/srv/shared"


def _messages(events, task):
    return [
        str(e["event_data"]["res"].get("msg"))
        for e in events
        if e.get("event") == "runner_on_ok" and task in str(e["event_data"].get("task"))
    ]


def _trainer_log(vm):
    text = vm.sh(f"cat {JOBS}/{JOB}/output/trainer_log.jsonl", check=False).stdout
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def lf090(test_cluster, train_cluster, tmp_path_factory):
    """Two nodes train with the 0.9.0 image; cleaned up afterwards."""
    inventory, vms = train_cluster
    client = cluster.client()
    local = train_image.ensure_train_image(client, cluster.cache_dir(), VERSION)
    found = registry.start(test_cluster[0], client, cluster.cache_dir())  # the session's
    image = registry.push(client, found, local, f"hostnet/llamafactory:{VERSION}-cpu")
    tmp = tmp_path_factory.mktemp(JOB)
    data = ROOT / ".cache" / "assets" / "data"
    for vm in vms:
        vm.sh(f"rm -rf {SHARED} && mkdir -p {SHARED}/data")
        subprocess.run(
            ["docker", "cp", f"{data}/.", f"{vm.node['container']}:{SHARED}/data"],
            check=True,
            timeout=60,
        )
    rc, _stats, failures, events = play(
        inventory,
        tmp / "train",
        JOB,
        llamafactory_image=image,
        llamafactory_shared_mounts=[SHARED],
        llamafactory_train_overrides={
            "deepspeed": None,
            "max_steps": STEPS,
            "save_steps": STEPS,
            "dataset_dir": f"{SHARED}/data",
        },
    )
    yield {
        "rc": rc,
        "failures": failures,
        "events": events,
        "image": image,
        "vms": vms,
        "tmp": tmp,
    }
    rc, _stats, failures, _events = play(
        inventory, tmp / "cleanup", JOB, "playbooks/cleanup.yml", job_admin_cleanup_outputs=True
    )
    for vm in vms:
        vm.sh(f"rm -rf {SHARED}", check=False)
    assert rc == 0, failures


def test_lf090_trains_two_nodes_and_the_preflight_says_it_reads_rank(lf090):
    assert lf090["rc"] == 0, lf090["failures"]
    reports = _messages(lf090["events"], "Report the preflight")
    assert reports, "no preflight report"
    assert f"LLaMA-Factory {VERSION} (reads RANK)" in reports[0], reports[0]
    vm0, vm1 = lf090["vms"]
    for vm, rank in ((vm0, 0), (vm1, 1)):
        info = container(vm, JOB)
        assert info["Config"]["Image"] == lf090["image"]
        assert info["State"]["Status"] == "exited" and info["State"]["ExitCode"] == 0
        assert info["Config"]["Labels"]["hostnet.llamafactory.rank"] == str(rank)
        lines = vm.sh(f"cat {JOBS}/{JOB}/env").stdout.splitlines()
        env = dict(line.split("=", 1) for line in lines)
        assert env["RANK"] == env["NODE_RANK"] == str(rank)
        # Every node saved the finished adapter (save_on_each_node).
        vm.sh(f"test -s {JOBS}/{JOB}/output/checkpoint-{STEPS}/adapter_model.safetensors")
    # rank 0 logged every step; 4 samples per step per rank over 64 samples: a step is 1/8 of an
    # epoch only when both ranks joined one process group (1/16 with one rank).
    log = [r for r in _trainer_log(vm0) if "loss" in r]
    assert [r["current_steps"] for r in log] == list(range(1, STEPS + 1))
    assert log[-1]["epoch"] == pytest.approx(STEPS / 8)
    text = vm0.sh(f"docker logs llamafactory-{JOB} 2>&1", timeout=60).stdout
    assert "Total train batch size (w. parallel, distributed & accumulation) = 8" in text
    summary = _messages(lf090["events"], "Summarize")
    assert summary and f"job {JOB} finished: {STEPS} steps" in summary[0], summary


def test_data_on_a_shared_mount_is_read_in_place(lf090):
    """The ranks read the dataset in the shared folder through a read-only mount; nothing is
    copied to the job's folder."""
    assert lf090["rc"] == 0, lf090["failures"]
    for vm in lf090["vms"]:
        info = container(vm, JOB)
        assert info["State"]["ExitCode"] == 0
        mounts = {m["Destination"]: m for m in info["Mounts"]}
        assert mounts[SHARED]["Source"] == SHARED
        assert mounts[SHARED]["RW"] is False
        config = vm.sh(f"cat {JOBS}/{JOB}/config.yaml").stdout
        assert f"dataset_dir: {SHARED}/data" in config
        assert vm.sh(f"test -e {JOBS}/{JOB}/data", check=False).returncode != 0
