"""gce_instances' decisions: the insert body, the quotas a group needs and which fall short, the
group as found, and which operation errors move the group to the next zone. Machine types and
quota lists are shaped as machineTypes.get and regions.get answer them."""

import compute_contract
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _gce_instances as grp

G2_8 = {
    "name": "g2-standard-8",
    "guestCpus": 8,
    "accelerators": [{"guestAcceleratorType": "nvidia-l4", "guestAcceleratorCount": 1}],
}
N1_8 = {"name": "n1-standard-8", "guestCpus": 8}
SPEC = {
    "project": "p1",
    "prefix": "trainer",
    "machine_type": "g2-standard-8",
    "network": "default",
    "subnetwork": "",
    "external_ip": True,
    "gpu_networks": [],
    "image": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts",
    "boot_disk_size_gb": 200,
    "boot_disk_type": "pd-balanced",
    "provisioning_model": "spot",
    "termination_action": "delete",
    "vm_service_account": "",
    "vm_scopes": [grp.SCOPE_CLOUD_PLATFORM],
    "metadata": {"ssh-keys": "gce:ssh-ed25519 AAAA me"},
    "labels": {"team": "ml"},
    "accelerators": [],
    "reservation": "",
}


def test_quota_needs_by_family_gpu_and_spot():
    listed = {"G2_CPUS": 100, "NVIDIA_L4_GPUS": 8, "PREEMPTIBLE_NVIDIA_L4_GPUS": 16}
    assert grp.quota_needs(G2_8, 4, False, [], listed) == {
        "G2_CPUS": 32,
        "NVIDIA_L4_GPUS": 4,
        "IN_USE_ADDRESSES": 4,
    }
    # Spot VMs take the preemptible quota where the project has one, else the standard one.
    assert "PREEMPTIBLE_NVIDIA_L4_GPUS" in grp.quota_needs(G2_8, 4, True, [], listed)
    listed["PREEMPTIBLE_NVIDIA_L4_GPUS"] = 0
    assert "NVIDIA_L4_GPUS" in grp.quota_needs(G2_8, 4, True, [], listed)
    # N1 counts against CPUS; attached GPUs count too; no external IP, no address.
    needs = grp.quota_needs(N1_8, 2, False, [{"type": "nvidia-tesla-t4", "count": 2}], {}, False)
    assert needs == {"CPUS": 16, "NVIDIA_T4_GPUS": 4}


def test_shortfalls_name_the_quota_and_what_is_free():
    quotas = [
        {"metric": "G2_CPUS", "limit": 96.0, "usage": 0.0},
        {"metric": "NVIDIA_L4_GPUS", "limit": 1.0, "usage": 0.0},
    ]
    needs = {"G2_CPUS": 16, "NVIDIA_L4_GPUS": 2, "NVIDIA_H100_GPUS": 8}
    short = grp.shortfalls(quotas, needs)
    assert short == [{"metric": "NVIDIA_L4_GPUS", "need": 2, "free": 1, "limit": 1, "usage": 0}]
    message = grp.quota_message("p1", "us-central1", short)
    assert "NVIDIA_L4_GPUS: the group needs 2, 1 free (limit 1, 0 in use)" in message
    assert "console.cloud.google.com/iam-admin/quotas?project=p1" in message
    assert grp.shortfalls(quotas, {"G2_CPUS": 96}) == []


def test_zone_failure_kinds():
    assert grp.zone_failure([("ZONE_RESOURCE_POOL_EXHAUSTED", "no room")]) == "capacity"
    assert grp.zone_failure([("QUOTA_EXCEEDED", "Quota 'X' exceeded")]) == "quota"
    assert grp.zone_failure([("INVALID_FIELD_VALUE", "bad image")]) is None
    assert grp.zone_failure([]) is None


def test_the_insert_body_fits_google_s_schema():
    body = grp.instance_body(SPEC, "trainer-1", 1, "us-central1-b", True)
    url = "https://compute.googleapis.com/compute/v1/projects/p1/zones/us-central1-b/instances"
    assert compute_contract.validate_request("POST", url, body=body) == []
    assert body["machineType"] == "zones/us-central1-b/machineTypes/g2-standard-8"
    assert body["labels"] == {
        "team": "ml",
        "llamafactory": "training",
        "llamafactory-rank": "1",
        "llamafactory-group": "trainer",
    }
    assert body["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }
    assert body["networkInterfaces"] == [
        {
            "network": "projects/p1/global/networks/default",
            "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}],
        }
    ]
    assert body["metadata"]["items"] == [{"key": "ssh-keys", "value": "gce:ssh-ed25519 AAAA me"}]
    standard = grp.instance_body(dict(SPEC, provisioning_model="standard"), "t-0", 0, "z-a", True)
    assert standard["scheduling"]["onHostMaintenance"] == "TERMINATE"  # GPUs never live-migrate
    cpu = grp.instance_body(dict(SPEC, provisioning_model="standard"), "t-0", 0, "z-a", False)
    assert cpu["scheduling"]["onHostMaintenance"] == "MIGRATE"


def test_the_group_as_found():
    def vm(name, zone="us-central1-a", kind="g2-standard-8"):
        link = "https://www.googleapis.com/compute/v1/projects/p1/zones/" + zone
        return {"name": name, "zone": link, "machineType": link + "/machineTypes/" + kind}

    found = grp.group_as_found([vm("trainer-0"), vm("trainer-3")], "trainer", 2, "g2-standard-8")
    assert (found["zone"], found["missing"], found["extra"]) == (
        "us-central1-a",
        ["trainer-1"],
        ["trainer-3"],
    )
    found = grp.group_as_found(
        [vm("trainer-0"), vm("trainer-1", kind="n1-standard-8")], "trainer", 2, "g2-standard-8"
    )
    assert found["mismatched"] == ["trainer-1 is n1-standard-8"]
    found = grp.group_as_found(
        [vm("trainer-0"), vm("trainer-1", zone="us-central1-b")], "trainer", 2, "g2-standard-8"
    )
    assert (found["zone"], found["zones"]) == (None, ["us-central1-a", "us-central1-b"])
    assert grp.group_as_found([], "trainer", 2, "x")["missing"] == ["trainer-0", "trainer-1"]
    spot = dict(vm("trainer-0"), scheduling={"provisioningModel": "SPOT"})
    found = grp.group_as_found([spot, vm("trainer-1")], "trainer", 2, "g2-standard-8", "spot")
    assert found["mismatched"] == ["trainer-1 is STANDARD"]


def test_gpu_networks_must_match_the_machine_types_nics():
    net = {"network": "gpu-0"}
    assert grp.gpu_networks_problem("g2-standard-8", []) is None
    assert grp.gpu_networks_problem("a3-highgpu-8g", [net] * 4) is None
    assert grp.gpu_networks_problem("a3-megagpu-8g", [net] * 8) is None
    assert grp.gpu_networks_problem("a3-ultragpu-8g", [net] * 9) is None  # second gVNIC + 8
    assert grp.gpu_networks_problem("a3-ultragpu-8g", [net] * 8) == (
        "gpu_networks lists 8 networks but a3-ultragpu-8g has 9 NICs besides nic0 (its second "
        "gVNIC, then 8 GPU NICs): list the network of each, in that order"
    )
    assert grp.gpu_networks_problem("a3-megagpu-8g", []).startswith(
        "gpu_networks lists 0 networks but a3-megagpu-8g has 8 NICs besides nic0 (8 GPU NICs)"
    )
    assert "g2-standard-8 has no GPU NICs (only a3-highgpu-8g, " in grp.gpu_networks_problem(
        "g2-standard-8", [net]
    )
