"""The job's VMs made by the collection in an empty box project (role gcp_vms through the box's
Compute Engine API): a quota too small refused before any VM exists, a stock-out moving the
group to the next zone, a re-run of up.yml with changed=0; then train.yml on them with a spot VM
deleted by its preemption mid-training - created again, set up, the job resumed from the
bucket's newest checkpoint - and at the end, the model safe, the VMs and the rule deleted by the
same run (gcp_instances_when_done: delete). down.yml is tested over the fake API
(tests/unit/roles/test_gcp_vms.py)."""

import json
import threading

import docker
import pytest
from conftest import JOBS, TRAIN, assert_resumed, run_playbook, said, wait_until
from localcluster import box_api, cluster, registry, spec, train_image

pytestmark = pytest.mark.cluster  # brings up a local cluster

GROUP = "zero"
MACHINE = "n2-standard-4"  # 4 vCPUs: N2_CPUS
# The group's spec, as both tests give it (another spec for an existing group is refused).
SPEC = {
    "gcp_vms_count": 2,
    "gcp_vms_prefix": GROUP,
    "gcp_vms_machine_type": MACHINE,
    "gcp_vms_provisioning_model": "spot",
    "gcp_vms_termination_action": "delete",
}


@pytest.fixture(scope="module")
def zero(tmp_path_factory):
    """An empty project (zones us-central1-a and -b) of its own, with its registry holding the
    training image: (definition, state, Box, Storage, pull vars)."""
    # Subnets no other test cluster uses (198.18.232.0/24, 198.19.232.0/24 once shifted).
    definition = spec.load(
        name="zero",
        shift=7,
        nodes=0,
        networks={
            "vpc": {"subnet": "198.18.8.0/24", "mtu": 1460},
            "external": {"subnet": "198.19.8.0/24"},
        },
    )
    state = cluster.up(definition)
    client = cluster.client()
    try:
        train_image.ensure_assets(client, cluster.cache_dir())
        found = registry.start(definition, client, cluster.cache_dir())
        image = registry.push(client, found, train_image.TRAIN_IMAGE, registry.TRAIN_REPOSITORY)
        pull = {
            "llamafactory_image": image,
            "llamafactory_registry_username": found.username,
            "llamafactory_registry_password": found.password,
        }
        gce = box_api.Box(state["gce"])
        storage = box_api.Storage(state["gcs"])
        yield definition, state, gce, storage, pull
        gce.close()
        storage.close()
    finally:
        cluster.down(definition)
    assert cluster.leftovers(client, definition.name) == []


def up(zero, tmp_path, **extra):
    _definition, state, _gce, _storage, _pull = zero
    result, _facts, _results = run_playbook(
        state["gcp_inventory"],
        tmp_path,
        "playbooks/up.yml",
        {**SPEC, **extra},
        envvars=state["gce"]["env"],
    )
    return result


def instances(zero):
    _definition, _state, gce, _storage, _pull = zero
    return gce.instances()


def test_quota_first_then_the_zone_with_room_and_a_rerun_changes_nothing(zero, tmp_path):
    _definition, _state, gce, _storage, _pull = zero
    gce.fake("config", {"quotas": {"us-central1": {"N2_CPUS": 4}}})
    result = up(zero, tmp_path / "quota")
    assert result.rc == 2
    text = json.dumps(result.failures())
    assert "N2_CPUS: the group needs 8, 4 free (limit 4, 0 in use)" in text, text
    assert instances(zero) == {}  # refused before any VM was created

    gce.fake("config", {"quotas": {}, "capacity": {"us-central1-a": {MACHINE: 0}}})
    result = up(zero, tmp_path / "up")
    assert result.rc == 0, json.dumps(result.failures(), indent=1)
    text = said(result.events)
    assert "2 VMs in us-central1-b" in text
    assert "zones left: us-central1-a - ZONE_RESOURCE_POOL_EXHAUSTED" in text
    assert instances(zero) == {f"{GROUP}-0": "us-central1-b", f"{GROUP}-1": "us-central1-b"}
    # The wait for SSH passed: the inventory reached both new VMs as their ssh-keys say.
    again = up(zero, tmp_path / "again")
    assert (again.rc, again.stats["changed"]) == (0, {}), again.stats


def test_a_spot_vm_deleted_by_preemption_is_created_again_and_the_job_resumes(zero, tmp_path):
    """train.yml creates the group when the test before did not; rank 1 is frozen past its
    first checkpoint and its VM preempted with DELETE once that checkpoint is complete in the
    bucket: the restart names the preemption,
    creates the VM again (same name and rank), sets it up and resumes from the bucket; at the
    end the same run deletes the VMs and the rule (gcp_instances_when_done: delete)."""
    definition, state, gce, storage, pull = zero
    gce.fake("config", {"capacity": {}})
    job = "zero-spot"
    uri = f"gs://{state['gcs']['bucket']}/zero"
    outcome = {}
    settings = {**pull, **SPEC, "llamafactory_output_uri": uri}

    def run():
        outcome["result"] = run_playbook(
            state["gcp_inventory"],
            tmp_path / "train",
            TRAIN,
            {
                **settings,
                "llamafactory_job": job,
                "launch_results_dir": str(results),
                "launch_max_restarts": 1,
                "launch_peer_timeout": 30,
                "gcp_instances_restart_stopped": True,
                "gcp_instances_when_done": "delete",
                "llamafactory_train_overrides": {"max_steps": 120, "save_steps": 10},
                "gcs_outputs_interval_s": 2,
            },
            timeout=1500,
            envvars=state["gce"]["env"],
        )[0]

    results = tmp_path / "results"
    client = cluster.client()
    thread = threading.Thread(target=run)
    thread.start()

    # Rank 1 frozen once past its first checkpoint, so that the job cannot end before its VM is
    # preempted, however fast the machine trains (the sync service beside it goes on).
    def on_vm1(command):
        """The command's exit code on rank 1's VM (None while train.yml has not created it)."""
        try:
            vm = client.containers.get(f"{definition.prefix()}-{GROUP}-1")
            return vm.exec_run(["sh", "-c", command]).exit_code
        except docker.errors.APIError:  # not there yet, or not running
            return None

    later = f"ls {JOBS}/{job}/output | grep -qx 'checkpoint-[2-9]0'"
    wait_until(
        lambda: not thread.is_alive() or on_vm1(later) == 0, 900, "rank 1 past its first checkpoint"
    )
    on_vm1(f"docker pause llamafactory-{job}")
    prefix = f"zero/{job}/checkpoints/"
    wait_until(
        lambda: not thread.is_alive() or storage.complete_checkpoints(prefix),
        900,
        "the first checkpoint complete in the bucket",
    )
    assert thread.is_alive(), f"the job ended before its first checkpoint: {outcome}"
    zone = instances(zero)[f"{GROUP}-1"]
    gce.fake("preempt", {"project": definition.project, "zone": zone, "name": f"{GROUP}-1"})
    thread.join(1200)
    assert not thread.is_alive(), "the playbook did not end"
    result = outcome["result"]
    assert result.rc == 0, f"rc {result.rc}: " + json.dumps(result.failures(), indent=1)
    text = said(result.events)
    assert f"the VM of {GROUP}-1 is deleted - preempted at" in text, text[-3000:]
    assert f"{GROUP}-1: deleted" in text and "creating it again" in text
    restart = next(line for line in text.splitlines() if line.startswith("restart 1 of 1"))
    resumed_at = int(restart.split("resuming from checkpoint-")[1].split(",")[0])
    lost = int(restart.split(", ")[-1].split(" steps lost")[0])
    assert f"{GROUP}-1: checkpoint-{resumed_at} restored from " in text
    log = (results / job / "trainer_log.jsonl").read_text().splitlines()
    steps = [json.loads(line)["current_steps"] for line in log if line.strip()]
    assert_resumed(steps, resumed_at, lost, 120)
    assert (results / job / "adapter" / "SHA256SUMS").is_file()
    assert any(n.startswith(f"zero/{job}/output/") for n in storage.objects(f"zero/{job}/"))

    # Down in the same run: the model is safe (here and in the bucket), so the VMs, the rule
    # and the group's placement policy went.
    assert f"{GROUP}-1 ({GROUP}-1, {zone}): RUNNING -> " in text
    assert instances(zero) == {}
    assert not [r for r in gce.rules() if r.startswith("llamafactory-")]
