"""primary_nic and the discover_network role on the local VMs: mixed NIC names, a decoy
default route, asymmetric paths, and the GCE metadata path through every VM's metadata server."""

import pytest
from conftest import VM, run_module, run_playbook
from localcluster import cluster, spec

pytestmark = pytest.mark.cluster  # brings up a local cluster

METADATA_LOG = "/var/log/hlf-gce/requests.log"  # the VM's metadata server logs every request
# Off GCE: the route-based choice alone (the local inventory asks the metadata server).
NO_METADATA = {"discover_network_gcp_metadata": "never"}


def test_discovery_picks_each_vms_nic(test_cluster, tmp_path):
    state = test_cluster[1]
    vm0, vm1 = state["nodes"]
    for check in (False, True):
        runner, facts, results = run_playbook(
            state["inventory"], tmp_path / str(check), "playbooks/discover.yml", check=check
        )
        assert runner.rc == 0, runner.stats
        assert sum(runner.stats["changed"].values()) == 0
        # The report, from primary_nic's findings alone (no fact gathering).
        report = next(r["res"]["msg"] for r in results["vm0"] if r["task"] == "Show every node")[
            "vm1"
        ]
        assert report[1].startswith(f"rank 1: trains on eth0 {vm1['vpc_address']}/")
        assert " mtu 1460 (found by peer route)" in report[1]
        assert report[2].startswith("default route via eth0 ")
        assert report[3].startswith("NICs: ") and f"eth0 {vm1['vpc_address']}/" in report[3]
        assert "ext0 " in report[3] and "no IPv4" not in report[3]
        assert not [r for r in results["vm1"] if r["task"].startswith("Gather")]
        assert facts["vm0"]["primary_nic"]["interface"] == "ens4"
        # The VM's metadata server names nic0, as on GCE.
        assert facts["vm0"]["primary_nic"]["method"] == "metadata"
        assert facts["vm0"]["primary_nic"]["metadata"] == {
            "ip": vm0["vpc_address"],
            "mac": vm0["vpc_mac"],
        }
        assert facts["vm1"]["primary_nic"]["interface"] == "eth0"
        assert facts["vm1"]["primary_nic"]["method"] == "peer route"
        assert facts["vm1"]["primary_nic"]["address"] == vm1["vpc_address"]
        for host in ("vm0", "vm1"):
            assert facts[host]["discover_network_master_addr"] == vm0["vpc_address"]
        assert facts["vm1"]["primary_nic"]["nccl_env"] == {
            "NCCL_SOCKET_IFNAME": "=eth0",
            "GLOO_SOCKET_IFNAME": "eth0",
            "NCCL_IB_DISABLE": "1",
        }


@pytest.fixture(scope="module")
def decoy_cluster():
    """vm0's default route goes through a decoy NIC (ens5); the peers sit on the VPC (ens4)."""
    definition = spec.load(
        name="decoy",
        shift=4,
        vms=[{"name": "vm0", "nic": "ens4", "decoy": "ens5"}, {"name": "vm1", "nic": "ens4"}],
    )
    state = cluster.up(definition)
    yield state
    cluster.down(definition)


def test_default_route_picks_the_decoy_but_the_peer_route_finds_the_vpc_nic(
    decoy_cluster, tmp_path
):
    vm0, vm1 = decoy_cluster["nodes"]
    inventory = decoy_cluster["inventory"]
    setup = run_module(
        inventory,
        tmp_path / "setup",
        "ansible.builtin.setup",
        "gather_subset=!all,!min,network",
        hosts="vm0",
    )
    assert setup["vm0"]["ansible_facts"]["ansible_default_ipv4"]["interface"] == "ens5"
    found = run_module(
        inventory,
        tmp_path / "nic",
        "hostnet.llamafactory.primary_nic",
        f"peer={vm1['vpc_address']}",
        hosts="vm0",
    )["vm0"]
    assert (found["interface"], found["address"], found["method"]) == (
        "ens4",
        vm0["vpc_address"],
        "peer route",
    )
    assert found["default_route_interface"] == "ens5"
    rejected = {c["name"]: c["rejected"] for c in found["candidates"]}
    assert rejected["ens5"] == "not chosen: the peer is not routed through it"

    # A TCP connection bound to the returned address reaches the other VM...
    connect = (
        'python3 -c "import socket,sys; s=socket.socket(); s.settimeout(5); '
        's.bind((sys.argv[1], 0)); s.connect((sys.argv[2], 22)); print(s.recv(8))" '
    )
    ok = VM(vm0).sh(connect + f"{found['address']} {vm1['vpc_address']}")
    assert "SSH-" in ok.stdout
    # ...one bound to the decoy's address does not: the peer cannot answer it.
    bad = VM(vm0).sh(connect + f"{vm0['decoy_address']} {vm1['vpc_address']}", check=False)
    assert bad.returncode != 0


def test_asymmetric_paths_fail_with_the_fix_then_the_override_works(decoy_cluster, tmp_path):
    inventory = decoy_cluster["inventory"]
    vm0 = decoy_cluster["nodes"][0]
    runner, _facts, results = run_playbook(
        inventory, tmp_path / "a", "playbooks/discover.yml", extravars=NO_METADATA
    )
    assert runner.rc != 0
    failed = [r["res"].get("msg", "") for r in results["vm0"] if not r["ok"]]
    assert failed and "Asymmetric paths" in failed[0]
    assert "would train on ens5" in failed[0] and "through ens4" in failed[0]
    assert "set llamafactory_master_interface" in failed[0]

    runner, facts, _results = run_playbook(
        inventory,
        tmp_path / "b",
        "playbooks/discover.yml",
        extravars={**NO_METADATA, "llamafactory_master_interface": "ens4"},
    )
    assert runner.rc == 0, runner.stats
    assert facts["vm0"]["primary_nic"]["method"] == "override"
    assert facts["vm1"]["discover_network_master_addr"] == vm0["vpc_address"]


@pytest.fixture
def metadata_log(decoy_cluster):
    """vm0 (its default route on the decoy), its metadata server's request log emptied."""
    vm = VM(decoy_cluster["nodes"][0])
    vm.sh(f": > {METADATA_LOG}")
    return vm


def requests(vm) -> list[str]:
    return vm.sh(f"cat {METADATA_LOG}").stdout.splitlines()


def test_metadata_path_beats_the_decoy_route(decoy_cluster, metadata_log, tmp_path):
    vm = metadata_log
    inventory = decoy_cluster["inventory"]
    # Off GCE (no GCE DMI product name) auto asks nothing, though the server would answer.
    auto = run_module(
        inventory,
        tmp_path / "auto",
        "hostnet.llamafactory.primary_nic",
        "",
        hosts="vm0",
    )["vm0"]
    assert (auto["interface"], auto["method"], auto["metadata"]) == ("ens5", "default route", None)
    assert requests(vm) == []

    found = run_module(
        inventory,
        tmp_path / "always",
        "hostnet.llamafactory.primary_nic",
        "gcp_metadata=always",
        hosts="vm0",
    )["vm0"]
    assert (found["interface"], found["method"]) == ("ens4", "metadata")
    assert found["address"] == vm.node["vpc_address"]
    assert any(
        "default route uses ens5, GCE metadata names ens4" in w for w in found["warnings_found"]
    )
    assert found["metadata"] == {"ip": vm.node["vpc_address"], "mac": vm.node["vpc_mac"]}
    # nic0's address and MAC, then the machine type (network_profile auto): a VM without GPU
    # NICs trains over sockets on the NIC found.
    assert requests(vm) == [
        *(
            f"GET /computeMetadata/v1/instance/network-interfaces/0/{key} Google"
            for key in ("ip", "mac")
        ),
        "GET /computeMetadata/v1/instance/machine-type Google",
    ]
    profile = found["network_profile"]
    assert (profile["profile"], profile["machine_type"]) == ("socket", vm.node["machine_type"])
    assert profile["why"] == f"machine type {vm.node['machine_type']} has no GPU NICs"
    assert profile["setup"]["env"]["NCCL_SOCKET_IFNAME"] == "=ens4"

    # The role's GCP path, as the local inventory sets it: rank 0 from metadata, the others
    # by route, symmetric.
    runner, facts, _results = run_playbook(inventory, tmp_path / "role", "playbooks/discover.yml")
    assert runner.rc == 0, runner.stats
    assert facts["vm0"]["primary_nic"]["method"] == "metadata"
    assert facts["vm1"]["discover_network_master_addr"] == vm.node["vpc_address"]


def test_metadata_server_down_with_always_fails_clearly(decoy_cluster, tmp_path):
    result = run_module(
        decoy_cluster["inventory"],
        tmp_path,
        "hostnet.llamafactory.primary_nic",
        "gcp_metadata=always metadata_url=http://127.0.0.1:9/computeMetadata/v1 metadata_timeout=1",
        hosts="vm0",
    )["vm0"]
    assert result.get("failed")
    assert "metadata server did not answer" in result["msg"]
