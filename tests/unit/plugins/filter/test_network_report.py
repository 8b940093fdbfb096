"""The filter network_report: discover_network's one report for every node."""

from ansible_collections.hostnet.llamafactory.plugins.filter.network_report import network_report

# A primary_nic fact as the module returns it on a local VM (rank 1, found by its route).
VM1_NIC = {
    "interface": "eth0",
    "address": "198.18.0.3",
    "prefix": 24,
    "mtu": 1460,
    "method": "peer route",
    "default_route_interface": "eth0",
    "nccl_env": {"NCCL_SOCKET_IFNAME": "=eth0", "GLOO_SOCKET_IFNAME": "eth0"},
    "candidates": [
        {"name": "lo", "ipv4": ["127.0.0.1/8"]},
        {"name": "eth0", "ipv4": ["198.18.0.3/24"]},
        {"name": "docker0", "ipv4": ["172.17.0.1/16"]},
        {"name": "ext0", "ipv4": []},
        {"name": "veth12ab", "ipv4": []},
    ],
}


def test_lines_per_node_in_input_order():
    rank0 = dict(VM1_NIC, interface="ens4", address="198.18.0.2", method="metadata")
    rank0["default_route_interface"] = None
    rank0["candidates"] = [{"name": "ens4", "ipv4": ["198.18.0.2/24", "198.18.9.2/24"]}]
    report = network_report(
        {"vm1": VM1_NIC, "vm0": rank0},
        ranks={"vm0": 0, "vm1": 1},
        reached_at={"vm0": "", "vm1": "198.18.0.3"},
        master_addrs={"vm0": "198.18.0.2", "vm1": "198.18.0.2"},
        platform="gcp",
    )
    assert list(report) == ["vm1", "vm0"]
    assert report["vm1"] == [
        "reached at 198.18.0.3, platform gcp",
        "rank 1: trains on eth0 198.18.0.3/24 mtu 1460 (found by peer route), "
        "MASTER_ADDR 198.18.0.2, NCCL_SOCKET_IFNAME==eth0",
        "default route via eth0 198.18.0.3/24",
        "NICs: eth0 198.18.0.3/24, ext0 no IPv4",
    ]
    # No ansible_host: the node's name; no default route: none.
    assert report["vm0"][0] == "reached at vm0, platform gcp"
    assert report["vm0"][2] == "default route via none"
    assert report["vm0"][3] == "NICs: ens4 198.18.0.2/24 198.18.9.2/24"


def test_call_site(call_sites):
    # (llamafactory's `when` that loads every filter once is a bare expression: every run uses it)
    assert call_sites("network_report", network_report) == [
        (
            "roles/discover_network/tasks/nodes.yml",
            0,
            ["ranks", "master_addrs", "reached_at", "platform"],
        )
    ]


def test_the_network_profile_is_one_line():
    tcpxo = dict(
        VM1_NIC,
        network_profile={
            "profile": "tcpxo",
            "why": "machine type a3-megagpu-8g",
            "control": ["enp0s12"],
            "gpu": ["enp6s0", "enp7s0"],
            "setup": {"env": {"NCCL_SOCKET_IFNAME": "=enp0s12"}},
        },
    )
    socket = dict(VM1_NIC, network_profile={"profile": "socket", "why": "set", "setup": {}})
    report = network_report(
        {"vm0": tcpxo, "vm1": socket},
        ranks={"vm0": 0, "vm1": 1},
        reached_at={},
        master_addrs={"vm0": "198.18.0.2", "vm1": "198.18.0.2"},
        platform="gcp",
    )
    assert "NCCL_SOCKET_IFNAME==enp0s12" in report["vm0"][1]
    assert report["vm0"][-1] == (
        "network profile tcpxo (machine type a3-megagpu-8g): control enp0s12, GPU NICs "
        "enp6s0,enp7s0"
    )
    assert report["vm1"][-1] == "network profile socket (set)"
