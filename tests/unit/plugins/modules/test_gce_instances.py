"""The gce_instances module, run by ansible against the fake Compute Engine API
(tools/localcluster/compute_api.py, checked against Google's published contract): a group
created in the first zone with room, a stock-out moving it whole to the next zone, a quota too
small refused before any VM is created, a re-run that changes nothing, a VM of another machine
type named, check mode, and a delete that touches only the group."""

import compute_contract
import gce_module
import pytest
import requests

PROJECT = "hlf-test"
ZONES = ["us-central1-a", "us-central1-b"]
GROUP = {
    "prefix": "trainer",
    "count": 2,
    "zones": ZONES,
    "machine_type": "g2-standard-8",
    "provisioning_model": "spot",
    "termination_action": "delete",
    "metadata": {"ssh-keys": "gce:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE0 me"},
}


@pytest.fixture
def fake(fake_api):
    session = requests.Session()
    session.trust_env = False
    control = fake_api["control"]
    session.post(f"{control}/reset").raise_for_status()
    # A VM that is not the group's: never touched.
    body = {"labels": {"llamafactory": "training", "team": "ml"}}
    session.put(f"{control}/instances/{PROJECT}/us-central1-a/other", json=body).raise_for_status()
    yield fake_api, session
    entries = [e for e in session.get(f"{control}/requests").json() if not e.get("refused")]
    assert compute_contract.validate_log(entries) == []
    session.close()


def configure(fake, **config):
    info, session = fake
    session.post(f"{info['control']}/config", json=config).raise_for_status()


def instances(fake):
    info, session = fake
    listed = session.get(f"{info['control']}/instances").json()
    return {i["name"]: i for i in listed.values()}


def inserts(fake):
    info, session = fake
    return [
        e
        for e in session.get(f"{info['control']}/requests").json()
        if e["method"] == "POST" and e["path"].endswith("/instances")
    ]


def run(fake, check=False, **args):
    info, _session = fake
    return gce_module.run_module("gce_instances", info, {"project": PROJECT, **args}, check)


def test_a_stockout_moves_the_whole_group_to_the_next_zone_and_a_rerun_changes_nothing(fake):
    configure(fake, capacity={"us-central1-a": {"g2-standard-8": 1}})
    result = run(fake, **GROUP)
    assert result.get("failed") is not True, result.get("msg")
    assert (result["changed"], result["zone"]) == (True, "us-central1-b")
    assert result["created"] == ["trainer-0", "trainer-1"]
    assert [z["zone"] for z in result["zones_tried"]] == ["us-central1-a"]
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in result["zones_tried"][0]["error"]
    found = instances(fake)
    assert sorted(found) == ["other", "trainer-0", "trainer-1"]  # nothing left in zone a
    for rank in (0, 1):
        vm = found[f"trainer-{rank}"]
        assert vm["zone"].endswith("/us-central1-b")
        assert vm["labels"]["llamafactory-rank"] == str(rank)
        assert vm["scheduling"]["provisioningModel"] == "SPOT"
        assert vm["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert [(i["name"], i["rank"], i["status"]) for i in result["instances"]] == [
        ("trainer-0", 0, "RUNNING"),
        ("trainer-1", 1, "RUNNING"),
    ]
    again = run(fake, **GROUP)
    assert (again["changed"], again["created"], again["zone"]) == (False, [], "us-central1-b")


def test_a_quota_too_small_is_refused_before_any_vm_is_created(fake):
    configure(fake, quotas={"us-central1": {"PREEMPTIBLE_NVIDIA_L4_GPUS": 0, "NVIDIA_L4_GPUS": 1}})
    result = run(fake, **GROUP)
    assert result["failed"] is True
    assert "NVIDIA_L4_GPUS: the group needs 2, 1 free (limit 1, 0 in use)" in result["msg"]
    assert "iam-admin/quotas" in result["msg"]
    assert inserts(fake) == []
    assert sorted(instances(fake)) == ["other"]


def test_every_zone_out_of_stock_leaves_nothing(fake):
    configure(fake, capacity={z: {"g2-standard-8": 1} for z in ZONES})
    result = run(fake, **GROUP)
    assert result["failed"] is True
    assert [z["zone"] for z in result["zones_tried"]] == ZONES
    assert "no zone had room" in result["msg"]
    assert sorted(instances(fake)) == ["other"]


def test_check_mode_creates_nothing_and_another_machine_type_is_named(fake):
    result = run(fake, check=True, **GROUP)
    assert (result["changed"], result["created"]) == (True, ["trainer-0", "trainer-1"])
    assert inserts(fake) == []
    assert run(fake, **GROUP)["changed"] is True
    result = run(fake, **{**GROUP, "machine_type": "g2-standard-16"})
    assert result["failed"] is True
    assert "trainer-0 is g2-standard-8" in result["msg"]


def test_absent_deletes_only_the_group(fake):
    assert run(fake, **GROUP)["changed"] is True
    result = run(fake, state="absent", prefix="trainer", zones=ZONES)
    assert (result["changed"], result["deleted"]) == (True, ["trainer-0", "trainer-1"])
    assert sorted(instances(fake)) == ["other"]
    assert run(fake, state="absent", prefix="trainer", zones=ZONES)["changed"] is False


def test_a_vm_missing_from_the_group_is_created_in_its_zone_retried_then_named(fake):
    # trainer-0 exists in zone a; trainer-1 is missing (as after its preemption deleted it).
    assert run(fake, **{**GROUP, "count": 1})["zone"] == "us-central1-a"
    configure(fake, capacity={"us-central1-a": {"g2-standard-8": 1}})
    result = run(fake, **GROUP, capacity_retries=2, capacity_backoff=0.1)
    assert result["failed"] is True
    # Only the group's zone is tried (its VMs share it): once, then twice more.
    assert [z["zone"] for z in result["zones_tried"]] == ["us-central1-a"] * 3
    assert {e["path"].split("/zones/")[1].split("/")[0] for e in inserts(fake)} == {"us-central1-a"}
    configure(fake, capacity={})
    result = run(fake, **GROUP)
    assert (result["created"], result["zone"]) == (["trainer-1"], "us-central1-a")


def test_a_compact_placement_policy_holds_the_group_and_goes_with_it(fake):
    result = run(fake, **GROUP, placement="compact")
    assert result["changed"] is True, result.get("msg")
    policy = "projects/hlf-test/regions/us-central1/resourcePolicies/trainer-compact"
    for name in ("trainer-0", "trainer-1"):
        assert instances(fake)[name]["resourcePolicies"][0].endswith(policy)
    assert run(fake, **GROUP, placement="compact")["changed"] is False
    result = run(fake, state="absent", prefix="trainer", zones=ZONES)
    assert result["placement_policies_deleted"] == ["trainer-compact"]
    assert run(fake, state="absent", prefix="trainer", zones=ZONES)["changed"] is False


def test_gpu_nics_without_their_networks_are_refused_before_any_api_call(fake):
    info, session = fake
    a3_mega = {**GROUP, "machine_type": "a3-megagpu-8g"}
    result = run(fake, **a3_mega)
    assert result["failed"] and result["msg"].startswith(
        "gpu_networks lists 0 networks but a3-megagpu-8g has 8 NICs besides nic0"
    )
    assert [e for e in session.get(f"{info['control']}/requests").json() if e.get("path")] == []
