"""GCE firewall semantics on live VMs: a locked-down project (the default rules without
default-allow-internal), then rules added, outranked and deleted with gce_firewall.enforce(), as
the Compute Engine API's firewall calls will do. Cluster 'fw', shift 5: vm0 tagged rank0 (ens4),
vm1 tagged worker (eth0)."""

import json
import socket
import subprocess
import time

import pytest
from conftest import VM
from localcluster import cluster, gce_firewall, images, spec

pytestmark = pytest.mark.cluster  # brings up a local cluster

HOST_PORT = 31000  # a listener in vm0's own network namespace (host networking)
BRIDGE_PORT = 29500  # a container on vm0's Docker bridge, published with -p 29500:29500
REFUSED_WAIT_S = 2.0  # no answer to a SYN within this on a local bridge: dropped
OPEN_WITHIN_S = 5.0
NETWORK = "https://www.googleapis.com/compute/v1/projects/hlf-local/global/networks/default"
ALLOW_WORKERS = {
    "kind": "compute#firewall",
    "name": "allow-rendezvous",
    "network": NETWORK,
    "direction": "INGRESS",
    "priority": 1000,
    "sourceTags": ["worker"],
    "targetTags": ["rank0"],
    "allowed": [{"IPProtocol": "tcp", "ports": [str(BRIDGE_PORT), "30000-65535"]}],
}

# Connects to each (address, port) at once; prints {"address:port": first line | "error: ..."}.
REACH = """
import json, socket, sys, threading
targets, wait, found = json.loads(sys.argv[1]), float(sys.argv[2]), {}
def probe(address, port):
    try:
        with socket.create_connection((address, port), timeout=wait) as sock:
            sock.settimeout(wait)
            found[f"{address}:{port}"] = sock.recv(16).decode().strip()
    except OSError as exc:
        found[f"{address}:{port}"] = f"error: {exc}"
threads = [threading.Thread(target=probe, args=t) for t in targets]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def fw_cluster():
    """Up with the locked-down rules; vm0 serves 'pong' on HOST_PORT and BRIDGE_PORT."""
    boot = list(spec.load().firewall)  # the definition's rules (no default-allow-internal)
    definition = spec.load(
        name="fw",
        shift=5,
        firewall=boot,
        vms=[
            {"name": "vm0", "nic": "ens4", "tags": ["rank0"]},
            {"name": "vm1", "nic": "eth0", "tags": ["worker"]},
        ],
    )
    state = cluster.up(definition)
    try:
        vm0 = VM(state["nodes"][0])
        vm0.sh(
            f"docker run -d --rm --net=host --name fw-host {images.PROBE_IMAGE} "
            f"nc -ll -p {HOST_PORT} -e echo pong"
        )
        vm0.sh(
            f"docker run -d --rm --name fw-bridge -p {BRIDGE_PORT}:{BRIDGE_PORT} "
            f"{images.PROBE_IMAGE} nc -ll -p {BRIDGE_PORT} -e echo pong"
        )
        local = [("127.0.0.1", HOST_PORT), ("127.0.0.1", BRIDGE_PORT)]
        deadline = time.monotonic() + 30
        while set(reach(vm0, local).values()) != {"pong"}:
            assert time.monotonic() < deadline, f"vm0's listeners: {reach(vm0, local)}"
            time.sleep(0.3)
        yield state, list(definition.firewall)
    finally:
        cluster.down(definition)


def reach(vm: VM, targets: list[tuple[str, int]], wait: float = REFUSED_WAIT_S) -> dict:
    result = subprocess.run(
        [
            "docker",
            "exec",
            vm.node["container"],
            "python3",
            "-c",
            REACH,
            json.dumps(targets),
            str(wait),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return json.loads(result.stdout)


def vm0_ports(state) -> list[tuple[str, int]]:
    address = state["nodes"][0]["vpc_address"]
    return [(address, HOST_PORT), (address, BRIDGE_PORT)]


def assert_refused(found: dict) -> None:
    for target, answer in found.items():
        assert answer.startswith("error: timed out"), f"{target} answered {answer!r}"


def reached_within(vm, targets, seconds: float = OPEN_WITHIN_S) -> float:
    started = time.monotonic()
    while True:
        found = reach(vm, targets, wait=1)
        if set(found.values()) == {"pong"}:
            return time.monotonic() - started
        assert time.monotonic() - started < seconds, f"not open after {seconds} s: {found}"


def test_locked_down_project_lets_only_ssh_and_icmp_in(fw_cluster):
    state, _boot = fw_cluster
    vm0, vm1 = (VM(node) for node in state["nodes"])
    # Between the VMs: the host's listener and the published container alike are dropped.
    assert_refused(reach(vm1, vm0_ports(state)))
    assert vm1.sh(f"ping -c1 -W3 {vm0.node['vpc_address']}", check=False).returncode == 0
    # From the controller, over ext0 (the external IP): SSH and ICMP only.
    external = vm0.node["external_address"]
    ping = subprocess.run(
        ["busybox", "ping", "-c1", "-W3", external], capture_output=True, check=False
    )
    assert ping.returncode == 0, ping.stderr
    with socket.create_connection((external, 22), timeout=5) as ssh:
        assert ssh.recv(16).startswith(b"SSH-")
    with pytest.raises(OSError):
        socket.create_connection((external, HOST_PORT), timeout=REFUSED_WAIT_S).close()
    # The rules sit in our own mangle chains, hooked once, before Docker's DNAT.
    mangle = vm0.sh("iptables -t mangle -S").stdout
    assert mangle.count(f"-j {gce_firewall.PREROUTING_CHAIN}") == 1
    assert "default-allow-internal" not in mangle and "default-allow-ssh 65534" in mangle


def test_an_allow_rule_opens_both_ports_and_its_deletion_closes_them(fw_cluster):
    state, boot = fw_cluster
    vm0, vm1 = (VM(node) for node in state["nodes"])
    nat_before = vm0.sh("iptables -t nat -S DOCKER").stdout
    gce_firewall.enforce(state, [*boot, ALLOW_WORKERS])
    # Replies included: 'pong' travels back through both VMs' filters.
    took = reached_within(vm1, vm0_ports(state))
    print(f"open {took:.2f} s after enforce()")
    # The controller carries no 'worker' tag: its connection still is dropped.
    with pytest.raises(OSError):
        socket.create_connection((vm0.node["vpc_address"], HOST_PORT), timeout=REFUSED_WAIT_S)
    gce_firewall.enforce(state, boot)  # the rule deleted
    assert_refused(reach(vm1, vm0_ports(state)))
    # Docker's own chains untouched; our hooks still there once.
    assert vm0.sh("iptables -t nat -S DOCKER").stdout == nat_before
    assert f"--dport {BRIDGE_PORT}" in nat_before
    for hook in (gce_firewall.PREROUTING_CHAIN, gce_firewall.POSTROUTING_CHAIN):
        assert vm0.sh("iptables -t mangle -S").stdout.count(f"-j {hook}") == 1


def test_a_priority_900_deny_beats_the_1000_allow_and_egress_is_filtered(fw_cluster):
    state, boot = fw_cluster
    vm0, vm1 = (VM(node) for node in state["nodes"])
    host_port, bridge_port = vm0_ports(state)
    deny_bridge = {
        "name": "deny-bridge-port",
        "network": NETWORK,
        "priority": 900,
        "sourceRanges": [f"{vm1.node['vpc_address']}/32"],
        "denied": [{"IPProtocol": "tcp", "ports": [str(BRIDGE_PORT)]}],
    }
    no_egress = {
        "name": "workers-no-egress-31000",
        "network": NETWORK,
        "direction": "EGRESS",
        "targetTags": ["worker"],
        "destinationRanges": [f"{vm0.node['vpc_address']}/32"],
        "denied": [{"IPProtocol": "tcp", "ports": [str(HOST_PORT)]}],
    }
    try:
        gce_firewall.enforce(state, [*boot, ALLOW_WORKERS, deny_bridge])
        reached_within(vm1, [host_port])
        assert_refused(reach(vm1, [bridge_port]))
        gce_firewall.enforce(state, [*boot, ALLOW_WORKERS, no_egress])
        reached_within(vm1, [bridge_port])
        # Dropped on its way out of vm1 (a local sender learns at once: EPERM, not a timeout).
        (answer,) = reach(vm1, [host_port]).values()
        assert answer.startswith("error:"), answer
    finally:
        gce_firewall.enforce(state, boot)
