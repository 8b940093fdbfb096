"""The gcp_firewall role on a GPU machine type's networks (issue 17): each tcpxo GPU NIC is on a
VPC of its own, closed to ingress until a rule of that network opens it. Through the box's
Compute Engine API and the GCP path's inventory, the role makes the nodes rule and one rule per
GPU VPC, a second run changes nothing, check mode writes nothing, and cleanup.yml deletes the
nine rules it made and nothing else.

One cluster of its own, 'gpufw' (module scope): vm0, vm1 a3-megagpu-8g. shift 3 (the shift of
test_cluster_options' 'ubuntu') with the vpc and external networks on /24s no other test
cluster uses (198.18.105.0/24, 198.19.105.0/24) and the GPU networks derived at
198.18.112-119 (no other cluster of shift 3 has GPU VMs), so that it can be up beside every
other test cluster."""

import subprocess
import time

import pytest
from conftest import ROOT, run_playbook
from localcluster import box_api, cluster, spec

pytestmark = pytest.mark.cluster  # brings up a local cluster

CLUSTER = "gpufw"  # gcp_firewall_cluster_name too: the rules are gpufw-nodes, gpufw-nodes-gpuN
PORT = 31500  # vm1 listens on every NIC (0.0.0.0)
OPEN_WITHIN_S = 5.0
FIREWALL = "tests/integration/playbooks/firewall.yml"
CLEANUP = "playbooks/cleanup.yml"
GPU_NETWORKS = [f"{CLUSTER}-gpu{i}" for i in range(8)]
RULES = {f"{CLUSTER}-nodes", *(f"{CLUSTER}-nodes-gpu{i}" for i in range(8))}
PROBED = (0, 7)  # two of the GPU VPCs are dialled: the first and the last
# A rule of the project with a name of the role's pattern but not its mark (made by hand).
BY_HAND = f"{CLUSTER}-nodes-by-hand"

# Serves one line to every connection, forever (the VM's python3; detached by docker exec -d).
SERVE = f"""
import socket
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", {PORT}))
server.listen(16)
while True:
    peer, _ = server.accept()
    peer.sendall(b"pong\\n")
    peer.close()
"""

# Dials (address, port) from the given source address: open, refused or timeout.
DIAL = """
import socket, sys
target, source, wait = sys.argv[1], sys.argv[2], float(sys.argv[3])
try:
    socket.create_connection((target, int(sys.argv[4])), wait, (source, 0)).close()
    print("open")
except ConnectionRefusedError:
    print("refused")
except OSError:
    print("timeout")
"""


def definition() -> spec.ClusterSpec:
    return spec.load(
        name=CLUSTER,
        shift=3,
        networks={
            "vpc": {"subnet": "198.18.9.0/24", "mtu": 1460},
            "external": {"subnet": "198.19.9.0/24"},
        },
        vms=[
            {"name": "vm0", "machine_type": "a3-megagpu-8g"},
            {"name": "vm1", "machine_type": "a3-megagpu-8g"},
        ],
    )


@pytest.fixture(scope="module")
def gpufw():
    """(state, the box's API); vm1 serving on PORT."""
    found = definition()
    started = time.monotonic()
    state = cluster.up(found)
    print(f"cluster up in {time.monotonic() - started:.1f} s")
    api = box_api.Box(state["gce"])
    try:
        vm1 = state["nodes"][1]
        subprocess.run(
            ["docker", "exec", "-d", vm1["container"], "python3", "-c", SERVE], check=True
        )
        deadline = time.monotonic() + 10
        while dial(vm1, vm1["vpc_address"], "127.0.0.1", 1) != "open":
            assert time.monotonic() < deadline, "vm1's listener did not start"
            time.sleep(0.2)
        yield state, api
    finally:
        api.close()
        cluster.down(found)


def dial(node: dict, target: str, source: str, wait: float = 2) -> str:
    arguments = [target, source, str(wait), str(PORT)]
    result = subprocess.run(
        ["docker", "exec", node["container"], "python3", "-c", DIAL, *arguments],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return result.stdout.strip()


def paths(state) -> dict[str, tuple[str, str]]:
    """network -> (vm1's address there, vm0's address there): what vm0 dials, bound to what."""
    vm0, vm1 = state["nodes"]
    found = {"default": (vm1["vpc_address"], vm0["vpc_address"])}
    for index in PROBED:
        nic0, nic1 = vm0["gpu_nics"][index], vm1["gpu_nics"][index]
        assert nic0["gce_network"] == nic1["gce_network"] == GPU_NETWORKS[index]
        found[nic1["gce_network"]] = (nic1["address"], nic0["address"])
    return found


def reach(state, wait: float = 2) -> dict[str, str]:
    vm0 = state["nodes"][0]
    return {net: dial(vm0, to, source, wait) for net, (to, source) in paths(state).items()}


def reached_within(state, seconds: float = OPEN_WITHIN_S) -> float:
    started = time.monotonic()
    while True:
        found = reach(state, wait=1)
        if set(found.values()) == {"open"}:
            return time.monotonic() - started
        assert time.monotonic() - started < seconds, f"not open after {seconds} s: {found}"


def rules(api) -> dict[str, dict]:
    listed = api.call("GET", api.rules_url)
    return {rule["name"]: rule for rule in listed.get("items", [])}


def role(state, tmp_path, playbook: str, check: bool = False, **extravars):
    """One run on the GCP path: (changed tasks in all, the recap, failures, seconds)."""
    started = time.monotonic()
    result, _facts, _results = run_playbook(
        state["gcp_inventory"],
        tmp_path,
        playbook,
        {
            "llamafactory_job": CLUSTER,
            "llamafactory_config": str(ROOT / "examples/local-demo/llama3_lora_sft_ds3.yaml"),
            "gcp_firewall_cluster_name": CLUSTER,
            **extravars,
        },
        check=check,
        envvars=state["gce"]["env"],
    )
    took = time.monotonic() - started
    assert result.rc == 0, result.failures()
    return sum((result.stats.get("changed") or {}).values()), result, took


def summary(result) -> list[str]:
    """The role's report (its debug task's lines)."""
    for host_results in result.results().values():
        for item in host_results:
            if str(item["task"]).startswith("Report the rules"):
                return item["res"]["msg"]
    raise AssertionError("the role reported nothing")


def test_the_role_opens_each_gpu_vpc_between_the_nodes_and_cleanup_closes_them(gpufw, tmp_path):
    state, api = gpufw
    vm0, vm1 = state["nodes"]
    link = f"https://www.googleapis.com/compute/v1/projects/{state['gce']['project']}"
    boot = rules(api)
    assert not RULES & set(boot)
    by_hand = {
        "name": BY_HAND,
        "description": "made by hand",
        "network": f"{link}/global/networks/{GPU_NETWORKS[1]}",
        "sourceRanges": ["198.18.105.99/32"],
        "allowed": [{"IPProtocol": "tcp", "ports": ["1"]}],
    }
    api.insert_rule(by_hand)
    # Before: the VMs' VPC (no default-allow-internal) and each GPU VPC drop vm0's connection.
    assert set(reach(state).values()) == {"timeout"}, reach(state)

    # Check mode: the report, nothing written.
    changed, result, took = role(state, tmp_path / "check", FIREWALL, check=True)
    print(f"check mode: {took:.1f} s")
    assert changed >= 1
    lines = summary(result)
    assert f"{CLUSTER}-nodes-gpu0: create (allow icmp:all, tcp:0-65535, udp:0-65535 from " in (
        "\n".join(lines)
    )
    assert set(rules(api)) == set(boot) | {BY_HAND}

    changed, result, took = role(state, tmp_path / "first", FIREWALL)
    print(f"first run: {took:.1f} s, {changed} changed")
    assert changed >= 1
    held = rules(api)
    assert set(held) == set(boot) | RULES | {BY_HAND}
    assert held[BY_HAND]["description"] == "made by hand"  # not the role's: untouched
    for index, network in enumerate(GPU_NETWORKS):
        rule = held[f"{CLUSTER}-nodes-gpu{index}"]
        assert rule["network"] == f"{link}/global/networks/{network}"
        sources = sorted(f"{n['gpu_nics'][index]['address']}/32" for n in (vm0, vm1))
        assert sorted(rule["sourceRanges"]) == sources
        assert rule["description"].startswith(f"hostnet.llamafactory cluster {CLUSTER}:")
    assert sorted(held[f"{CLUSTER}-nodes"]["sourceRanges"]) == sorted(
        f"{n['vpc_address']}/32" for n in (vm0, vm1)
    )
    print(f"open {reached_within(state):.2f} s after the run: {sorted(paths(state))}")

    changed, result, took = role(state, tmp_path / "again", FIREWALL)
    print(f"second run: {took:.1f} s, {changed} changed")
    assert changed == 0, summary(result)
    assert all(line.endswith(": no change") for line in summary(result)), summary(result)

    changed, result, took = role(state, tmp_path / "cleanup", CLEANUP)
    print(f"cleanup.yml: {took:.1f} s, {changed} changed")
    assert set(rules(api)) == set(boot) | {BY_HAND}
    assert set(reach(state).values()) == {"timeout"}, reach(state)
    api.delete_rule(BY_HAND)
