"""GCP's GPU machine types in the local cluster: a VM of such a type has that type's NICs (names,
MTUs, addresses, one network each), its stand-in devices, every NIC in its metadata and in the
Compute Engine API, and nothing in its inventory that GCP's would not have.

On the session's GPU cluster (conftest.gpu_cluster, shared with test_gpu_profiles): vm0, vm1
a3-megagpu-8g (tcpxo: enp0s12 + 8 GPU NICs), vm2, vm3 a3-ultragpu-8g (gib: enp0s19, enp192s20 +
8 RDMA NICs)."""

import json
import os
import socket
import subprocess
import sys

import pytest
from conftest import ROOT, VM
from localcluster import box_api, gce_firewall

pytestmark = pytest.mark.cluster  # brings up a local cluster

ANSIBLE_INVENTORY = os.path.join(os.path.dirname(sys.executable), "ansible-inventory")
METADATA = "http://metadata.google.internal/computeMetadata/v1/instance/network-interfaces/"


@pytest.fixture(scope="module")
def gpu_box(gpu_cluster):
    """The GPU cluster's state with nodes = (vm0: a3-megagpu-8g, vm2: a3-ultragpu-8g)."""
    mega, ultra = gpu_cluster["nodes"][0], gpu_cluster["nodes"][2]
    return {**gpu_cluster, "nodes": [mega, ultra]}


def nics_of(node: dict) -> list[dict]:
    return [*node["control_nics"], *node["gpu_nics"]]


def test_each_vm_has_its_machine_types_nics(gpu_box):
    mega, ultra = gpu_box["nodes"]
    assert (mega["nic"], ultra["nic"]) == ("enp0s12", "enp0s19")
    assert [n["name"] for n in mega["gpu_nics"]] == [
        f"enp{n}s0" for n in (6, 7, 13, 14, 134, 135, 141, 142)
    ]
    assert [n["name"] for n in ultra["control_nics"]] == ["enp0s19", "enp192s20"]
    assert [n["name"] for n in ultra["gpu_nics"]] == [f"gpu{i}rdma0" for i in range(8)]
    for node, gpu_mtu in ((mega, 8244), (ultra, 8896)):
        links = VM(node).addresses()
        # Its NICs and nothing else (no eth*, no ens4): lo, ext0, the VM's docker0.
        assert set(links) - {"lo", "ext0", "docker0"} == {n["name"] for n in nics_of(node)}
        for nic in nics_of(node):
            link = links[nic["name"]]
            assert link["up"], nic["name"]
            assert link["ipv4"] == [(nic["address"], 24)], nic["name"]
            assert link["mtu"] == nic["mtu"], nic["name"]
            mac = VM(node).sh(f"cat /sys/class/net/{nic['name']}/address").stdout.strip()
            assert mac == nic["mac"]
        assert {n["mtu"] for n in node["gpu_nics"]} == {gpu_mtu}
        assert links[node["nic"]]["mtu"] == 1460  # the shared vpc network's MTU
        assert VM(node).default_route()["dev"] == node["nic"]
    assert ultra["control_nics"][1]["mtu"] == 8896
    # One network per GPU NIC: each its own subnet.
    subnets = {n["address"].rsplit(".", 1)[0] for node in (mega, ultra) for n in node["gpu_nics"]}
    assert len(subnets) == 16


def test_stand_in_devices(gpu_box):
    mega, ultra = (VM(node) for node in gpu_box["nodes"])
    listed = mega.sh("ls /dev/aperture_devices").stdout.split()
    assert listed == sorted(
        n["pci_slot"][:-1] + "1" for n in gpu_box["nodes"][0]["gpu_nics"]
    )  # 0000:06:00.1 ... as Google's udev rule names them
    assert "0000:06:00.1" in listed and len(listed) == 8
    assert mega.sh("stat -c '%F %t:%T' /dev/dmabuf_import_helper").stdout.strip() == (
        "character special file 1:3"
    )
    assert mega.sh("test -e /dev/infiniband", check=False).returncode != 0
    devices = ultra.sh("stat -c '%n %F %t:%T' /dev/infiniband/uverbs*").stdout.splitlines()
    assert devices == [f"/dev/infiniband/uverbs{i} character special file 1:3" for i in range(8)]
    ultra.sh("head -c 1 /dev/infiniband/uverbs0 >/dev/null && echo x > /dev/infiniband/uverbs7")
    assert ultra.sh("test -e /dev/aperture_devices", check=False).returncode != 0


def test_the_metadata_server_lists_every_nic_in_gcps_order(gpu_box):
    for node in gpu_box["nodes"]:
        answer = VM(node).sh(f"curl -sf -H 'Metadata-Flavor: Google' '{METADATA}?recursive=true'")
        interfaces = json.loads(answer.stdout)
        nics = nics_of(node)
        assert [i["ip"] for i in interfaces] == [n["address"] for n in nics]
        assert [i["mac"] for i in interfaces] == [n["mac"] for n in nics]
        assert [i["mtu"] for i in interfaces] == [n["mtu"] for n in nics]
        assert [i["network"].rsplit("/", 1)[1] for i in interfaces] == [
            n["gce_network"] for n in nics
        ]
        assert interfaces[0]["accessConfigs"][0]["externalIp"] == node["external_address"]
        assert all("accessConfigs" not in i for i in interfaces[1:])
        assert {i["subnetmask"] for i in interfaces} == {"255.255.255.0"}
    mega, ultra = gpu_box["nodes"]
    assert ultra["control_nics"][1]["gce_network"] == "gpubox-net-1"
    assert mega["gpu_nics"][0]["gce_network"] == "gpubox-gpu0"


def _inventory(gpu_box, *args: str) -> dict:
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("GCP_", "LLAMAFACTORY_"))
    }
    environment.update(gpu_box["gce"]["env"], ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    environment["ANSIBLE_INVENTORY_UNPARSED_FAILED"] = "1"
    result = subprocess.run(
        [ANSIBLE_INVENTORY, "-i", gpu_box["gcp_inventory"], *args],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr

    def unwrap(value):
        return value["__ansible_unsafe"] if set(value) == {"__ansible_unsafe"} else value

    return json.loads(result.stdout, object_hook=unwrap)


def test_the_inventories_are_gcps_and_the_api_lists_every_nic(gpu_box):
    """Nothing per VM that GCP would not have (no host_vars: the PCI addresses come from the
    NICs' names under the one local-only setting, llamafactory_local_cluster, which the group
    vars carry); the Compute Engine API lists every NIC, nic0 first."""
    import yaml

    static = yaml.safe_load(open(gpu_box["inventory"]).read())  # noqa: SIM115
    hosts = static["all"]["children"]["llamafactory"]["hosts"]
    login = {"ansible_host", "llamafactory_node_rank"}
    assert {key for host in hosts.values() for key in host} <= login
    assert not (ROOT / gpu_box["gcp_inventory"] / "host_vars").exists()
    listed = _inventory(gpu_box, "--list")
    hostvars = listed["_meta"]["hostvars"]
    for node in gpu_box["nodes"]:
        host = hostvars[node["name"]]
        assert host["ansible_host"] == node["external_address"]
        assert host["llamafactory_local_cluster"] is True
        interfaces = host["gcp_networkInterfaces"]
        assert [i["networkIP"] for i in interfaces] == [n["address"] for n in nics_of(node)]
        assert host["gcp_firewall_network"] == "default"


def test_tcpxo_gpu_vpcs_are_filtered_rdma_nics_not(gpu_box):
    mega, ultra = gpu_box["nodes"]
    chains0 = VM(mega).sh("iptables -w -t mangle -S HLF-GCE-PREROUTING").stdout
    assert "-i enp6s0 -j HLF-GCE-INGRESS-1" in chains0
    implied = VM(mega).sh("iptables -w -t mangle -S HLF-GCE-INGRESS-1").stdout
    assert "implied-deny-ingress 65535" in implied
    chains1 = VM(ultra).sh("iptables -w -t mangle -S HLF-GCE-PREROUTING").stdout
    assert "-i enp192s20 -j HLF-GCE-INGRESS-1" in chains1  # net-1: a regular VPC
    assert "rdma0" not in chains1  # RoCE: no firewall rules on GCP
    assert gce_firewall.vm_views(gpu_box)[ultra["container"]]["more_networks"].keys() == {
        "gpubox-net-1"
    }


def reach(address: str, port: int = 22, seconds: float = 1) -> str:
    """From this machine (on every cluster network's bridge): 'open', 'refused' or 'timeout'."""
    try:
        socket.create_connection((address, port), timeout=seconds).close()
        return "open"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "timeout"


def test_a_gpu_vpcs_own_rule_opens_it(gpu_box):
    """default-allow-ssh (network default) lets SSH in on nic0 only: a tcpxo GPU VPC and net-1
    stay closed (implied deny) until a rule of theirs opens them; RDMA NICs are unfiltered."""
    mega, ultra = gpu_box["nodes"]
    enp6s0, enp7s0 = mega["gpu_nics"][:2]
    assert reach(mega["vpc_address"]) == "open"
    assert reach(enp6s0["address"]) == "timeout"
    assert reach(ultra["control_nics"][1]["address"]) == "timeout"
    assert reach(ultra["gpu_nics"][0]["address"]) == "open"
    box = box_api.Box(gpu_box["gce"])
    link = f"https://www.googleapis.com/compute/v1/projects/{gpu_box['gce']['project']}"
    rule = {
        "name": "gpu0-allow-ssh",
        "network": f"{link}/global/networks/gpubox-gpu0",
        "sourceRanges": ["0.0.0.0/0"],
        "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
    }
    try:
        box.insert_rule(rule)
        assert reach(enp6s0["address"]) == "open"
        assert reach(enp7s0["address"]) == "timeout"  # gpu1: another VPC
    finally:
        box.delete_rule("gpu0-allow-ssh")
        box.close()
    assert reach(enp6s0["address"]) == "timeout"


def test_a_reset_vm_gets_its_nics_and_devices_back(gpu_box):
    """/dev is a fresh tmpfs at every container start: configure_network makes the stand-ins
    again, and names all eleven NICs again (the API's reset: a restart)."""
    box = box_api.Box(gpu_box["gce"])
    try:
        box.act(gpu_box["nodes"][1]["name"], "reset")
    finally:
        box.close()
    ultra = gpu_box["nodes"][1]
    links = VM(ultra).addresses()
    assert {n["name"] for n in nics_of(ultra)} <= set(links)
    assert links["gpu7rdma0"]["mtu"] == 8896
    assert VM(ultra).sh("ls /dev/infiniband").stdout.split() == [f"uverbs{i}" for i in range(8)]
    assert VM(ultra).default_route()["dev"] == "enp0s19"
