"""tools/localcluster/gce_control.py without Docker: the VMs as instances (containers stood in by
objects with Docker's fields), labels kept in labels.json, the firewall hook (the fake run as the
cluster's service: test_compute_service.py)."""

import json
from types import SimpleNamespace

import pytest
from localcluster import gce_control, spec
from localcluster.util import ClusterError

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


# -- insert, preempt, delete: the state's bookkeeping (the VM itself stood in) ------------------

PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTheUnitTests hlf-empty"


@pytest.fixture
def empty_project(tmp_path, monkeypatch):
    """An empty project's state dir (no VM; two zones); the VM making stood in (no Docker)."""
    from localcluster import cluster

    directory = tmp_path / "localcluster" / "empty"
    directory.mkdir(parents=True)
    definition = spec.parse(
        {
            "name": "empty",
            "zones": ["us-central1-a", "us-central1-b"],
            "inventory": str(tmp_path / "empty.yml"),
            "networks": {
                "vpc": {"subnet": "198.18.0.0/24"},
                "external": {"subnet": "198.19.0.0/24"},
            },
            "vms": [],
        }
    )
    state = {
        "name": "empty",
        "user": "gce",
        "ssh_key": str(directory / "id_ed25519"),
        "known_hosts": str(directory / "known_hosts"),
        "definition": spec.to_raw(definition),
        "nodes": [],
    }
    (directory / "state.json").write_text(json.dumps(state))
    made = []

    def create(self, definition, vm, extras):
        made.append((vm.name, vm.index, vm.zone))
        node = {
            "name": vm.name,
            "container": definition.container(vm),
            "index": vm.index,
            "nic": vm.nic,
            "external_nic": "ext0",
            "tags": list(vm.tags),
            "vpc_address": definition.networks["vpc"].address(vm.index),
            "vpc_prefix": 24,
            "external_address": definition.networks["external"].address(vm.index),
            "vpc_mac": "02:42:00:00:00:01",
            "host_key": f"ssh-ed25519 HOSTKEY{vm.index}",
            "instance": extras,
        }
        return container(definition.container(vm)), node

    monkeypatch.setattr(gce_control.ClusterBackend, "_create", create)
    monkeypatch.setattr(gce_control.ClusterBackend, "_after_membership_change", lambda *a: None)
    monkeypatch.setattr(cluster, "write_inventory", lambda spec_, state: None)
    return SimpleNamespace(dir=directory, made=made)


def body(name, zone="us-central1-a", **more):
    return {
        "name": name,
        "machineType": f"{LINK}/zones/{zone}/machineTypes/n2-standard-8",
        "labels": {"llamafactory": "training", "llamafactory-rank": "0"},
        "metadata": {"items": [{"key": "ssh-keys", "value": f"gce:{PUB}"}]},
        "tags": {"items": ["trainer"]},
        **more,
    }


def test_an_empty_project_has_no_instances(empty_project, docker_with):
    docker_with()
    backend = gce_control.ClusterBackend(empty_project.dir)
    assert backend.instances() == []
    assert backend.zones == ["us-central1-a", "us-central1-b"]
    assert backend.networks == ["default"]


def test_insert_records_the_vm_as_the_api_and_the_inventory_see_it(empty_project, docker_with):
    backend = gce_control.ClusterBackend(empty_project.dir)
    spot = {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"}
    backend.insert("us-central1-b", body("trainer-0", "us-central1-b", scheduling=spot))
    backend.insert("us-central1-a", body("trainer-1", machineType="n2-standard-4"))
    state = json.loads((empty_project.dir / "state.json").read_text())
    assert [(n["name"], n["index"]) for n in state["nodes"]] == [("trainer-0", 0), ("trainer-1", 1)]
    assert [(v["name"], v["index"], v["zone"]) for v in state["definition"]["vms"]] == [
        ("trainer-0", 0, "us-central1-b"),
        ("trainer-1", 1, "us-central1-a"),
    ]
    assert state["pending"] == {}
    known = (empty_project.dir / "known_hosts").read_text().splitlines()
    assert known == ["198.19.0.10 ssh-ed25519 HOSTKEY0", "198.19.0.11 ssh-ed25519 HOSTKEY1"]
    docker_with(container("hlf-empty-trainer-0"), container("hlf-empty-trainer-1"))
    first, second = backend.instances()
    assert first["zone"] == f"{LINK}/zones/us-central1-b"
    assert first["machineType"] == f"{LINK}/zones/us-central1-b/machineTypes/n2-standard-8"
    assert second["machineType"].endswith("/zones/us-central1-a/machineTypes/n2-standard-4")
    assert first["labels"] == {"llamafactory": "training", "llamafactory-rank": "0"}
    assert first["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "preemptible": True,
        "automaticRestart": False,
        "onHostMaintenance": "TERMINATE",
    }
    assert second["scheduling"]["provisioningModel"] == "STANDARD"
    assert second["scheduling"]["preemptible"] is False
    assert first["metadata"]["items"] == [{"key": "ssh-keys", "value": f"gce:{PUB}"}]
    assert first["tags"] == {"items": ["trainer"]}
    assert first["serviceAccounts"][0]["email"].endswith("-compute@developer.gserviceaccount.com")
    assert first["networkInterfaces"][0]["accessConfigs"][0]["natIP"] == "198.19.0.10"
    assert json.loads((empty_project.dir / "labels.json").read_text())["trainer-1"] == {
        "llamafactory": "training",
        "llamafactory-rank": "0",
    }


def test_parallel_inserts_take_distinct_indexes(empty_project):
    import threading

    backend = gce_control.ClusterBackend(empty_project.dir)
    threads = [
        threading.Thread(target=backend.insert, args=("us-central1-a", body(f"vm-{i}")))
        for i in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    state = json.loads((empty_project.dir / "state.json").read_text())
    assert sorted(n["index"] for n in state["nodes"]) == list(range(6))
    assert sorted(v["name"] for v in state["definition"]["vms"]) == [f"vm-{i}" for i in range(6)]


def test_index_allocation_skips_held_reserved_and_renewed_addresses():
    definition = spec.parse(
        {
            "networks": {
                "vpc": {"subnet": "198.18.0.0/24"},
                "external": {"subnet": "198.19.0.0/26"},
            },
            "vms": [{"name": "a", "index": 0}, {"name": "b", "index": 2}],
        }
    )
    state = {
        "nodes": [
            {"name": "a", "index": 0, "external_address": "198.19.0.10"},
            # b was started again: its external address is now index 3's
            {"name": "b", "index": 2, "external_address": "198.19.0.13"},
        ],
        "pending": {"c": 1},
    }
    assert gce_control.allocate_index(state, definition) == 4
    state = {"nodes": [], "pending": {f"x{i}": i for i in range(52)}}
    with pytest.raises(ClusterError, match="no free address left"):
        gce_control.allocate_index(state, definition)  # /26: indexes 0..51


def test_a_failed_insert_leaves_nothing(empty_project, monkeypatch, docker_with):
    def broken(self, definition, vm, extras):
        raise ClusterError("boom")

    monkeypatch.setattr(gce_control.ClusterBackend, "_create", broken)
    removed = []
    volumes = SimpleNamespace(
        get=lambda name: SimpleNamespace(remove=lambda **kw: removed.append(name))
    )
    monkeypatch.setattr(
        gce_control.docker, "from_env", lambda **_kw: SimpleNamespace(volumes=volumes)
    )
    backend = gce_control.ClusterBackend(empty_project.dir)
    with pytest.raises(ClusterError, match="boom"):
        backend.insert("us-central1-a", body("vm-x"))
    state = json.loads((empty_project.dir / "state.json").read_text())
    assert (state["nodes"], state["definition"]["vms"], state["pending"]) == ([], [], {})
    assert removed == ["hlf-empty-vm-x-docker"]


def test_a_bad_zone_or_label_is_refused_before_anything_is_made(empty_project):
    backend = gce_control.ClusterBackend(empty_project.dir)
    with pytest.raises(ClusterError, match="not one of the box's zones"):
        backend.insert("europe-west4-a", body("vm-x", "europe-west4-a"))
    with pytest.raises(ClusterError, match="labels"):
        backend.insert("us-central1-a", body("vm-x", labels={"Bad": "x"}))
    assert empty_project.made == []


def stand_in_docker(monkeypatch, containers):
    """Docker with these containers by name (get/list), volumes removed into `removed`."""
    removed = []

    def get(name):
        if name not in containers:
            raise gce_control.docker.errors.NotFound(name)
        return containers[name]

    found = SimpleNamespace(get=get, list=lambda **_kw: list(containers.values()))
    volumes = SimpleNamespace(
        get=lambda name: SimpleNamespace(remove=lambda **kw: removed.append(name))
    )
    monkeypatch.setattr(
        gce_control.docker,
        "from_env",
        lambda **_kw: SimpleNamespace(containers=found, volumes=volumes),
    )
    return removed


class FakeVM:
    def __init__(self, name, events, containers):
        self.name, self.status, self.id = name, "running", "cd" * 32
        self.attrs = {"Created": "2026-12-01T18:00:00.123456789Z"}
        self.events, self.containers = events, containers

    def reload(self):
        pass

    def stop(self, timeout):
        self.events.append(("stop", self.name, timeout))
        self.status = "exited"

    def remove(self, force, v):
        self.events.append(("remove", self.name))
        self.containers.pop(self.name)


@pytest.mark.parametrize("action", ["STOP", "DELETE", None])
def test_preempt_says_so_in_the_metadata_then_stops_or_deletes(empty_project, monkeypatch, action):
    from localcluster import cluster, gce_metadata

    backend = gce_control.ClusterBackend(empty_project.dir)
    spot = {
        "provisioningModel": "SPOT",
        **({"instanceTerminationAction": action} if action else {}),
    }
    backend.insert("us-central1-a", body("spot-0", scheduling=spot))
    events, containers = [], {}
    containers["hlf-empty-spot-0"] = FakeVM("hlf-empty-spot-0", events, containers)
    removed = stand_in_docker(monkeypatch, containers)
    published = {}

    def publish(name, document):
        published.update(document)
        events.append(("preempted", document["instance"]["preempted"]))

    monkeypatch.setattr(gce_metadata, "publish", publish)
    monkeypatch.setattr(
        cluster, "_exec", lambda c, script, **kw: published["instance"]["preempted"]
    )
    backend.preempt("spot-0")
    assert events[:2] == [("preempted", "TRUE"), ("stop", "hlf-empty-spot-0", 30)]
    assert published["instance"]["scheduling"]["preemptible"] == "TRUE"
    assert published["instance"]["attributes"]["ssh-keys"] == f"gce:{PUB}"
    state = json.loads((empty_project.dir / "state.json").read_text())
    if action == "DELETE":
        assert events[2:] == [("remove", "hlf-empty-spot-0")]
        assert removed == ["hlf-empty-spot-0-docker"]
        assert (state["nodes"], state["definition"]["vms"]) == ([], [])
        assert (empty_project.dir / "known_hosts").read_text() == ""
    else:  # TERMINATED: container and disk kept
        assert events[2:] == [] and removed == []
        assert [n["name"] for n in state["nodes"]] == ["spot-0"]
        assert [i["status"] for i in backend.instances()] == ["TERMINATED"]


def test_deleting_an_inserted_vm_drops_it_from_the_state(empty_project, monkeypatch):
    backend = gce_control.ClusterBackend(empty_project.dir)
    backend.insert("us-central1-a", body("vm-a"))
    backend.insert("us-central1-a", body("vm-b"))
    events, containers = [], {}
    for name in ("hlf-empty-vm-a", "hlf-empty-vm-b"):
        containers[name] = FakeVM(name, events, containers)
    removed = stand_in_docker(monkeypatch, containers)
    backend.delete("vm-a")
    assert events == [("remove", "hlf-empty-vm-a")] and removed == ["hlf-empty-vm-a-docker"]
    state = json.loads((empty_project.dir / "state.json").read_text())
    assert [n["name"] for n in state["nodes"]] == ["vm-b"]
    assert [v["name"] for v in state["definition"]["vms"]] == ["vm-b"]
    assert "vm-a" not in json.loads((empty_project.dir / "labels.json").read_text())
    assert [i["name"] for i in backend.instances()] == ["vm-b"]
    backend.insert("us-central1-a", body("vm-c"))  # index 0 is free again
    state = json.loads((empty_project.dir / "state.json").read_text())
    assert [(n["name"], n["index"]) for n in state["nodes"]] == [("vm-b", 1), ("vm-c", 0)]


def test_a_definition_vm_stays_in_the_state_when_deleted(state_dir, monkeypatch):
    events, containers = [], {}
    containers["hlf-unit-vm0"] = FakeVM("hlf-unit-vm0", events, containers)
    stand_in_docker(monkeypatch, containers)
    gce_control.ClusterBackend(state_dir).delete("vm0")
    state = json.loads((state_dir / "state.json").read_text())
    assert [n["name"] for n in state["nodes"]] == ["vm0", "vm1"]


def test_scheduling_as_gce_completes_it():
    assert gce_control.scheduling_of(
        {"scheduling": {"provisioningModel": "SPOT"}}, "n2-standard-4"
    ) == {
        "provisioningModel": "SPOT",
        "preemptible": True,
        "instanceTerminationAction": "STOP",
        "automaticRestart": False,
        "onHostMaintenance": "TERMINATE",
    }
    assert gce_control.scheduling_of({}, "a3-highgpu-8g")["onHostMaintenance"] == "TERMINATE"
    assert gce_control.scheduling_of({}, "n2-standard-4") == {
        "provisioningModel": "STANDARD",
        "preemptible": False,
        "automaticRestart": True,
        "onHostMaintenance": "MIGRATE",
    }
    assert gce_control.machine_type_name(f"{LINK}/zones/z/machineTypes/a3-highgpu-8g") == (
        "a3-highgpu-8g"
    )


def test_ssh_keys_are_read_as_gces_guest_agent_reads_them():
    from localcluster import cluster

    expired = '{"userName":"c","expireOn":"2018-12-04T20:12:00+0000"}'
    valid = '{"userName":"d","expireOn":"2999-12-04T20:12:00+0000"}'
    value = "\n".join(
        [
            f"gce:{PUB}",
            f"alice:{PUB} alice@laptop",
            "gce:ssh-rsa AAAAB3second gce@other",
            "not a key line",
            "root:ssh-ed25519 AAAAroot",
            "Bad User:ssh-ed25519 AAAA",
            "bob:ssh-ed25519",
            f"carol:ssh-ed25519 AAAAold google-ssh {expired}",
            f"dave:ssh-ed25519 AAAAnew google-ssh {valid}",
            "",
        ]
    )
    assert cluster.ssh_keys_users(value) == {
        "gce": [PUB, "ssh-rsa AAAAB3second gce@other"],
        "alice": [f"{PUB} alice@laptop"],
        "dave": [f"ssh-ed25519 AAAAnew google-ssh {valid}"],
    }
    assert cluster.ssh_keys_users(None) == {}
