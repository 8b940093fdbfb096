"""The local cluster behaves like two GCP VMs: reached over an external path by SSH only,
training NIC with a GCP-like name on a VPC, its own dockerd, host networking that sees the NIC."""

import json
import socket
import time
from pathlib import Path

import ansible_run
import pytest
from conftest import ansible_facts
from localcluster import cluster

pytestmark = pytest.mark.cluster  # brings up a local cluster

RENDEZVOUS_PORT = 29500


def test_ansible_reaches_every_vm_over_the_external_path(test_cluster, tmp_path):
    state = test_cluster[1]
    facts = ansible_facts(state["inventory"], tmp_path)
    assert sorted(facts) == ["vm0", "vm1"]
    for node in state["nodes"]:
        host = facts[node["name"]]
        # Connected through the external address, while the node's own view is the VPC one.
        assert node["external_address"] != node["vpc_address"]
        assert host["ansible_default_ipv4"]["interface"] == node["nic"]
        assert host["ansible_default_ipv4"]["address"] == node["vpc_address"]
        assert host["ansible_default_ipv4"]["mtu"] == 1460
        assert host["ansible_distribution"] == "Debian"
        assert host["ansible_distribution_major_version"] == "12"
        assert "ext0" in host["ansible_interfaces"]
    assert [node["nic"] for node in state["nodes"]] == ["ens4", "eth0"]
    text = Path(state["inventory"]).read_text()
    assert "llamafactory_platform: local" in text
    for node in state["nodes"]:
        assert f"ansible_host: {node['external_address']}" in text
        assert f"ansible_host: {node['vpc_address']}" not in text


def test_a_changed_host_key_stops_ansible(test_cluster, tmp_path):
    """Host keys are checked as in a user's run (ansible-runner's own default turns that off)."""
    state = test_cluster[1]
    vm0, vm1 = state["nodes"]
    tampered = tmp_path / "known_hosts"  # vm0's address with vm1's key
    tampered.write_text(
        "".join(f"{node['external_address']} {vm1['host_key']}\n" for node in (vm0, vm1))
    )
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        Path(state["inventory"]).read_text().replace(state["known_hosts"], str(tampered))
    )
    # Connections of their own: an open ControlMaster socket to vm0 would skip the key check.
    result = ansible_run.run(
        tmp_path / "run",
        str(inventory),
        module="ansible.builtin.ping",
        envvars={"ANSIBLE_SSH_CONTROL_PATH_DIR": str(tmp_path / "cp")},
        timeout=120,
    )
    assert result.unreachable() == ["vm0"], result.stats
    (unreachable,) = [
        e["event_data"]["res"]["msg"]
        for e in result.events
        if e.get("event") == "runner_on_unreachable"
    ]
    assert (
        "REMOTE HOST IDENTIFICATION HAS CHANGED" in unreachable
        or "Host key verification failed" in unreachable
    )


def test_nic_names_addresses_and_routes_are_as_defined(test_cluster, vms):
    definition = test_cluster[0]
    vpc = definition.networks["vpc"]
    for vm in vms:
        nic = vm.node["nic"]
        links = vm.addresses()
        assert set(links) == {"lo", nic, "ext0", "docker0"}
        assert links[nic]["ipv4"] == [(vm.node["vpc_address"], vpc.subnet.prefixlen)]
        assert links[nic]["mtu"] == 1460 and links[nic]["up"]
        assert links["ext0"]["ipv4"][0][0] == vm.node["external_address"]
        route = vm.default_route()
        assert (route["dev"], route["gateway"]) == (nic, vpc.gateway)
        # Every VM name resolves to its VPC address, as GCP's internal DNS does.
        for peer in vms:
            assert vm.sh(f"getent hosts {peer.name}").stdout.split()[0] == peer.node["vpc_address"]


def test_host_keys_are_unique_and_systemd_is_healthy(vms):
    keys = {vm.sh("cat /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[1] for vm in vms}
    assert len(keys) == len(vms)
    for vm in vms:
        state = vm.sh("systemctl is-system-running", check=False).stdout.strip()
        failed = vm.sh("systemctl --failed --no-legend").stdout.strip()
        assert state == "running", f"{vm.name}: systemd {state}; failed units: {failed}"


def test_each_vm_dockerd_runs_a_host_networked_container_that_sees_the_nic(vms):
    for vm in vms:
        seen = vm.sh(
            "docker run --rm --net=host hostnet-llamafactory/probe:busybox "
            f"ip -o -4 addr show dev {vm.node['nic']}"
        ).stdout
        assert f"inet {vm.node['vpc_address']}/" in seen
        # The trap this project exists for: on the default bridge the container sees only
        # Docker's 172.17.0.0/16, an address no other VM can reach.
        bridged = vm.sh(
            "docker run --rm hostnet-llamafactory/probe:busybox ip -o -4 addr show"
        ).stdout
        assert vm.node["vpc_address"] not in bridged and " 172.17." in bridged


def _connects(vm, address: str, port: int) -> bool:
    probe = (
        f"python3 -c \"import socket; socket.create_connection(('{address}', {port}), "
        'timeout=3).close()"'
    )
    return vm.sh(probe, check=False).returncode == 0


def test_the_rendezvous_port_is_reached_over_the_vpc_only(vms, nodes_rule):
    """With the gcp_firewall role's rule (from the nodes' VPC addresses) in force."""
    master, worker = vms[0], vms[1]
    master.sh(
        "docker run -d --rm --net=host --name rendezvous hostnet-llamafactory/probe:busybox "
        f"nc -ll -p {RENDEZVOUS_PORT} -e true"
    )
    try:
        deadline = time.monotonic() + 30
        while not _connects(master, "127.0.0.1", RENDEZVOUS_PORT):
            assert time.monotonic() < deadline, "the listener in vm0 did not come up"
            time.sleep(0.5)
        assert _connects(worker, master.node["vpc_address"], RENDEZVOUS_PORT)
        assert worker.sh(f"ping -c1 -W3 {master.node['vpc_address']}", check=False).returncode == 0
        # ansible_host is the external address: as on GCP, only SSH (and ping) get through.
        assert not _connects(worker, master.node["external_address"], RENDEZVOUS_PORT)
        assert _connects(worker, master.node["external_address"], 22)
        # The controller, not a node, reaches it on neither address; SSH only.
        for address in (master.node["vpc_address"], master.node["external_address"]):
            with pytest.raises(OSError):
                socket.create_connection((address, RENDEZVOUS_PORT), timeout=3).close()
        with socket.create_connection((master.node["external_address"], 22), timeout=5) as ssh:
            assert ssh.recv(16).startswith(b"SSH-")
    finally:
        master.sh("docker rm -f rendezvous", check=False)


def test_up_again_keeps_the_running_cluster(test_cluster):
    definition, state = test_cluster
    before = {c["container"]: c for c in cluster.status(definition)}
    ids = {name: _container_id(name) for name in before}
    again = cluster.up(definition)
    assert again["nodes"] == state["nodes"]
    assert {name: _container_id(name) for name in before} == ids


def _container_id(name: str) -> str:
    import subprocess

    out = subprocess.run(["docker", "inspect", name], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)[0]["Id"]
