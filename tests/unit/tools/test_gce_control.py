"""tools/localcluster/gce_control.py without Docker: the VMs as instances (containers stood in by
objects with Docker's fields), labels kept in labels.json, the firewall hook (the fake run as the
cluster's service: test_compute_service.py)."""

import json
from types import SimpleNamespace

import pytest
from localcluster import gce_control, spec

LINK = "https://www.googleapis.com/compute/v1/projects/hostnet-box"


@pytest.fixture
def state_dir(tmp_path):
    definition = spec.parse(
        {
            "name": "unit",
            "networks": {
                "vpc": {"subnet": "198.18.0.0/24"},
                "external": {"subnet": "198.19.0.0/24"},
                "secondary": {"subnet": "198.18.1.0/24"},
            },
            "vms": [
                {"name": "vm0"},
                {
                    "name": "vm1",
                    "nic": "eth0",
                    "second_nic": "ens5",
                    "machine_type": "a2-highgpu-1g",
                },
            ],
        }
    )
    nodes = [
        {
            "name": vm.name,
            "container": definition.container(vm),
            "index": vm.index,
            "vpc_address": definition.networks["vpc"].address(vm.index),
            "external_address": definition.networks["external"].address(vm.index),
            "second_address": (
                definition.networks["secondary"].address(vm.index) if vm.second_nic else None
            ),
        }
        for vm in definition.vms
    ]
    state = {"name": "unit", "definition": spec.to_raw(definition), "nodes": nodes}
    (tmp_path / "state.json").write_text(json.dumps(state))
    return tmp_path


def container(name, status="running"):
    attrs = {"Created": "2026-12-01T18:00:00.123456789Z"}
    return SimpleNamespace(name=name, status=status, id="ab" * 32, attrs=attrs)


@pytest.fixture
def docker_with(monkeypatch):
    """Docker answering with the given containers."""

    def install(*containers):
        found = SimpleNamespace(list=lambda **_kw: list(containers))
        monkeypatch.setattr(
            gce_control.docker, "from_env", lambda **_kw: SimpleNamespace(containers=found)
        )

    return install


def test_running_and_stopped_vms_as_instances(state_dir, docker_with):
    docker_with(container("hlf-unit-vm0"), container("hlf-unit-vm1", status="exited"))
    backend = gce_control.ClusterBackend(state_dir)
    assert (backend.project, backend.zone, backend.networks) == (
        "hostnet-box",
        "us-central1-a",
        ["default", "secondary"],
    )
    vm0, vm1 = backend.instances()
    assert vm0["selfLink"] == f"{LINK}/zones/us-central1-a/instances/vm0"
    assert vm0["status"] == "RUNNING"
    assert vm0["machineType"] == f"{LINK}/zones/us-central1-a/machineTypes/n2-standard-4"
    assert vm0["labels"] == {"llamafactory": "training", "llamafactory-rank": "0"}
    assert vm0["creationTimestamp"] == "2026-12-01T18:00:00.000+00:00"
    nic0 = vm0["networkInterfaces"][0]
    assert (nic0["name"], nic0["networkIP"]) == ("nic0", "198.18.0.10")
    assert nic0["network"] == f"{LINK}/global/networks/default"
    assert nic0["subnetwork"] == f"{LINK}/regions/us-central1/subnetworks/default"
    assert nic0["accessConfigs"][0]["natIP"] == "198.19.0.10"
    assert nic0["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"
    assert len(vm0["networkInterfaces"]) == 1

    assert vm1["status"] == "TERMINATED"
    assert vm1["machineType"].endswith("/machineTypes/a2-highgpu-1g")
    assert "natIP" not in vm1["networkInterfaces"][0]["accessConfigs"][0]  # stopped: released
    nic1 = vm1["networkInterfaces"][1]
    assert (nic1["name"], nic1["networkIP"]) == ("nic1", "198.18.1.11")
    assert nic1["network"] == f"{LINK}/global/networks/secondary"


def test_a_placement_policy_holds_every_vm(state_dir, docker_with):
    docker_with(container("hlf-unit-vm0"), container("hlf-unit-vm1"))
    assert gce_control.ClusterBackend(state_dir).resource_policies() == []
    assert "resourcePolicies" not in gce_control.ClusterBackend(state_dir).instances()[0]
    state = json.loads((state_dir / "state.json").read_text())
    state["definition"]["placement_policy"] = {"name": "compact", "collocation": "COLLOCATED"}
    (state_dir / "state.json").write_text(json.dumps(state))
    backend = gce_control.ClusterBackend(state_dir)
    (policy,) = backend.resource_policies()
    assert policy["selfLink"] == f"{LINK}/regions/us-central1/resourcePolicies/compact"
    assert policy["groupPlacementPolicy"] == {"vmCount": 2, "collocation": "COLLOCATED"}
    assert [i["resourcePolicies"] for i in backend.instances()] == [[policy["selfLink"]]] * 2


def test_a_deleted_vm_is_no_instance_and_an_acting_one_says_so(state_dir, docker_with):
    docker_with(container("hlf-unit-vm1"))
    backend = gce_control.ClusterBackend(state_dir)
    with backend._acting("vm1", "STOPPING"):
        assert [(i["name"], i["status"]) for i in backend.instances()] == [("vm1", "STOPPING")]
    assert backend.instances()[0]["status"] == "RUNNING"


def test_labels_are_kept_in_the_state_dir(state_dir, docker_with):
    docker_with(container("hlf-unit-vm0"), container("hlf-unit-vm1"))
    backend = gce_control.ClusterBackend(state_dir)
    backend.set_labels("vm1", {"llamafactory": "idle"})
    assert json.loads((state_dir / "labels.json").read_text()) == {"vm1": {"llamafactory": "idle"}}
    again = gce_control.ClusterBackend(state_dir)  # a restarted fake reads them back
    assert {i["name"]: i["labels"] for i in again.instances()} == {
        "vm0": {"llamafactory": "training", "llamafactory-rank": "0"},
        "vm1": {"llamafactory": "idle"},
    }


def test_firewalls_that_land_reach_the_hook_with_the_state(state_dir, monkeypatch):
    seen = []
    monkeypatch.setattr(
        gce_control, "on_firewalls", lambda state, rules: seen.append((state, rules))
    )
    gce_control.ClusterBackend(state_dir).firewalls_landed([{"name": "r1"}])
    assert seen == [(json.loads((state_dir / "state.json").read_text()), [{"name": "r1"}])]


def test_a_gpu_vm_lists_its_machine_types_nics(tmp_path, docker_with):
    from localcluster import cluster

    definition = spec.load(
        name="gpubox",
        shift=6,
        vms=[
            {"name": "vm0", "machine_type": "a3-megagpu-8g"},
            {"name": "vm1", "machine_type": "a3-ultragpu-8g"},
        ],
    )
    nodes = []
    for vm in definition.vms:
        control, gpus = cluster.nic_entries(definition, vm)
        nodes.append(
            {
                "name": vm.name,
                "container": definition.container(vm),
                "index": vm.index,
                "vpc_address": definition.networks["vpc"].address(vm.index),
                "external_address": definition.networks["external"].address(vm.index),
                "control_nics": control,
                "gpu_nics": gpus,
            }
        )
    state = {"name": "gpubox", "definition": spec.to_raw(definition), "nodes": nodes}
    (tmp_path / "state.json").write_text(json.dumps(state))
    docker_with(container("hlf-gpubox-vm0"), container("hlf-gpubox-vm1"))
    backend = gce_control.ClusterBackend(tmp_path)
    assert {"default", "gpubox-gpu0", "gpubox-net-1", "gpubox-rdma-net"} <= set(backend.networks)
    mega, ultra = backend.instances()
    nics = mega["networkInterfaces"]
    assert [n["name"] for n in nics] == [f"nic{i}" for i in range(9)]
    assert nics[1]["networkIP"] == "198.18.208.10"
    assert nics[1]["network"] == f"{LINK}/global/networks/gpubox-gpu0"
    assert ["accessConfigs" in n for n in nics] == [True] + [False] * 8
    nics = ultra["networkInterfaces"]
    assert [(n["networkIP"], n["subnetwork"].rsplit("/", 1)[1]) for n in nics[1:3]] == [
        ("198.18.207.11", "gpubox-net-1"),
        ("198.18.216.11", "gpubox-rdma-sub-0"),
    ]
    assert nics[2]["network"] == f"{LINK}/global/networks/gpubox-rdma-net"
