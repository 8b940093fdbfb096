"""The preflight on the local cluster: each known multi-node fault is found and named, with its
fix, before any training container starts (train.yml, real probes from containers of the
training image in the job's network mode). The healthy path runs in every launch of
test_launch.py."""

from contextlib import contextmanager
from pathlib import Path

import yaml
from conftest import PULL_VARS, run_playbook

TRAIN = "playbooks/train.yml"


def train(inventory, tmp_path, job, **extravars):
    """(rc, host -> failure message, unreachable hosts)."""
    runner, _facts, _results = run_playbook(
        inventory, tmp_path, TRAIN, extravars={**PULL_VARS, "llamafactory_job": job, **extravars}
    )
    failures, unreachable = {}, []
    for event in runner.events:
        data = event.get("event_data", {})
        if event.get("event") == "runner_on_failed" and not data.get("ignore_errors"):
            failures[data["host"]] = data["res"].get("msg", "")
        if event.get("event") == "runner_on_unreachable":
            unreachable.append(data["host"])
    return runner.rc, failures, unreachable


def assert_nothing_started(vms, job):
    for vm in vms:
        names = vm.sh("docker ps -a --format '{{.Names}}'").stdout.split()
        assert not [n for n in names if n.startswith(f"llamafactory-{job}")], (vm.name, names)


@contextmanager
def on_vm(vm, apply, undo):
    vm.sh(apply)
    try:
        yield
    finally:
        vm.sh(undo)


def test_a_blocked_port_between_the_nodes(train_cluster, tmp_path):
    inventory, (vm0, vm1) = train_cluster
    nic = vm1.node["nic"]
    rule = f"INPUT -i {nic} -p tcp -m conntrack --ctstate NEW --dport 30000:65535 -j DROP"
    with on_vm(vm1, f"iptables -I {rule}", f"iptables -D {rule}"):
        rc, failures, _ = train(inventory, tmp_path, "pf-port")
    assert rc != 0
    message = failures["vm0"]
    assert "found 1 problem(s) before any rank started" in message
    assert (
        f"peer-unreachable: vm0 (rank 0) cannot reach vm1 at {vm1.node['vpc_address']}" in message
    )
    assert "timed out" in message and "gcp_firewall" in message
    assert_nothing_started((vm0, vm1), "pf-port")


def test_bridge_networking(train_cluster, tmp_path):
    inventory, vms = train_cluster
    rc, failures, _ = train(
        inventory,
        tmp_path,
        "pf-bridge",
        llamafactory_network_mode="bridge",
        launch_allow_bridge=True,
    )
    assert rc != 0
    message = failures["vm0"]
    assert message.count("container-not-on-host-network") == 2
    assert "sends from 172.17." in message
    assert "Fix: set llamafactory_network_mode=host" in message
    assert_nothing_started(vms, "pf-bridge")


def test_the_wrong_nic_chosen(train_cluster, tmp_path):
    """ext0 exists on every VM (the 'public' side, SSH only): the nodes cannot train over it."""
    inventory, vms = train_cluster
    rc, failures, _ = train(inventory, tmp_path, "pf-wrongnic", llamafactory_interface="ext0")
    assert rc != 0
    message = failures["vm0"]
    assert "master-unreachable: vm1 (rank 1) cannot reach MASTER_ADDR:MASTER_PORT" in message
    assert "peer-unreachable" in message
    assert "(vm0's ext0, vm1's ext0) is not on the network the nodes share" in message
    assert_nothing_started(vms, "pf-wrongnic")


def test_a_nic_that_does_not_exist(train_cluster, tmp_path):
    inventory, vms = train_cluster
    rc, failures, _ = train(inventory, tmp_path, "pf-nonic", llamafactory_interface="ens9")
    assert rc != 0
    assert "interface 'ens9' does not exist on this host. Its NICs:" in failures["vm0"]
    assert_nothing_started(vms, "pf-nonic")
    for vm in vms:
        assert vm.sh("test -e /var/lib/llamafactory/jobs/pf-nonic", check=False).returncode != 0


def test_a_public_master_addr_override(train_cluster, tmp_path):
    inventory, vms = train_cluster
    rc, failures, unreachable = train(
        inventory, tmp_path, "pf-public", llamafactory_master_addr="34.120.1.2"
    )
    assert rc != 0 and not unreachable
    assert "llamafactory_master_addr 34.120.1.2 is a public address" in " ".join(
        " ".join(m.split()) for m in failures.values()
    )
    assert_nothing_started(vms, "pf-public")


def test_one_node_unreachable(train_cluster, tmp_path):
    inventory, vms = train_cluster
    data = yaml.safe_load(Path(inventory).read_text())
    hosts = data["all"]["children"]["llamafactory"]["hosts"]
    hosts["vm1"]["ansible_host"] = hosts["vm1"]["ansible_host"].rsplit(".", 1)[0] + ".99"
    broken = tmp_path / "inventory.yml"
    tmp_path.mkdir(parents=True, exist_ok=True)
    broken.write_text(yaml.safe_dump(data))
    rc, _failures, unreachable = train(str(broken), tmp_path / "run", "pf-unreachable")
    assert rc != 0
    assert unreachable == ["vm1"]
    assert_nothing_started(vms, "pf-unreachable")


def test_mtu_mismatch(train_cluster, tmp_path):
    inventory, (vm0, vm1) = train_cluster
    nic, mtu = vm1.node["nic"], vm1.node["vpc_mtu"]
    with on_vm(vm1, f"ip link set {nic} mtu {mtu - 60}", f"ip link set {nic} mtu {mtu}"):
        rc, failures, _ = train(inventory, tmp_path, "pf-mtu")
    assert rc != 0
    message = failures["vm0"]
    assert (
        f"mtu-mismatch: the nodes' training NICs have different MTUs: vm0 {vm0.node['nic']} "
        f"MTU {mtu}, vm1 {nic} MTU {mtu - 60}" in message
    )
    assert_nothing_started((vm0, vm1), "pf-mtu")
