"""The preflight on the local cluster: each known multi-node fault is found and named, with its
fix, before any training container starts (train.yml, real probes from containers of the
training image in the job's network mode). The healthy path runs in every launch of
test_launch.py."""

import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from conftest import NODES_RULE, OUTPUTS, PULL_VARS, put_back, run_playbook

pytestmark = pytest.mark.cluster  # brings up a local cluster

TRAIN = "playbooks/train.yml"


def train(inventory, tmp_path, job, skip_tags=None, **extravars):
    """(rc, host -> failure message, unreachable hosts)."""
    runner, _facts, _results = run_playbook(
        inventory,
        tmp_path,
        TRAIN,
        extravars={**PULL_VARS, "llamafactory_job": job, **extravars},
        skip_tags=skip_tags,
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
    """No rank's container, and nothing left: a probe whose report rank 0 gathered ends on its
    node by itself (auto-removed, at once when its own report has a fault, at the latest 2 s
    after the go's timeout), so the probes are given 30 s to go."""
    deadline = time.monotonic() + 30
    for vm in vms:
        while True:
            names = vm.sh("docker ps -a --format '{{.Names}}'").stdout.split()
            left = [n for n in names if n.startswith(f"llamafactory-{job}")]
            assert not [n for n in left if not n.endswith("-preflight")], (vm.name, names)
            if not left or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert not left, (vm.name, names)


@contextmanager
def on_vm(vm, apply, undo):
    vm.sh(apply)
    try:
        yield
    finally:
        vm.sh(undo)


def test_without_the_firewall_rule_the_preflight_names_the_dropped_ports(
    train_cluster, box, nodes_rule, tmp_path
):
    """The seed's third fault on the GCP path: the project has no rule between the VMs (the box's
    default network lacks default-allow-internal), so the VPC firewall drops their connections.
    train.yml with gcp_firewall_state=absent deletes the role's rule, and the preflight names
    what is dropped before any rank starts."""
    inventory, (vm0, vm1) = train_cluster
    try:
        rc, failures, _unreachable = train(
            inventory, tmp_path, "pf-port", gcp_firewall_state="absent"
        )
        assert box.rule(NODES_RULE) is None
    finally:
        put_back(box, nodes_rule)
    assert rc != 0
    message = failures["vm0"]
    assert "found 3 problem(s) before any rank started" in message
    for rank, vm, peer in ((0, vm0, vm1), (1, vm1, vm0)):
        assert (
            f"peer-unreachable: {vm.name} (rank {rank}) cannot reach {peer.name} at "
            f"{peer.node['vpc_address']}:" in message
        )
    assert "master-unreachable: vm1 (rank 1) cannot reach MASTER_ADDR:MASTER_PORT" in message
    assert "timed out" in message and "gcp_firewall role's rule" in message
    assert_nothing_started((vm0, vm1), "pf-port")


def test_bridge_networking(train_cluster, tmp_path):
    inventory, vms = train_cluster
    rc, failures, _unreachable = train(
        inventory,
        tmp_path,
        "pf-bridge",
        llamafactory_network_mode="bridge",
        llamafactory_allow_bridge=True,
    )
    assert rc != 0
    message = failures["vm0"]
    assert message.count("container-not-on-host-network") == 2
    assert "sends from 172.17." in message
    assert "Fix: set llamafactory_network_mode=host" in message
    assert_nothing_started(vms, "pf-bridge")


def test_an_output_bucket_missing_or_not_writable(train_cluster, bucket, tmp_path):
    """llamafactory_output_uri: a bucket that does not exist, then one the VMs' service account
    may not write (the box's Cloud Storage denies storage.objects.create): each named with its
    fix by the preflight, from every node, before any rank starts."""
    inventory, vms = train_cluster
    rc, failures, _unreachable = train(
        inventory, tmp_path / "missing", "pf-bucket", llamafactory_output_uri="gs://no-such-bkt/x"
    )
    assert rc != 0  # named by the bucket's first reader, the launch decision's look from rank 0
    assert "the bucket gs://no-such-bkt does not exist" in failures["vm0"]
    assert "gcloud storage buckets create gs://no-such-bkt" in failures["vm0"]
    assert_nothing_started(vms, "pf-bucket")
    bucket.deny("*", "storage.objects.create")
    try:
        rc, failures, _unreachable = train(inventory, tmp_path / "denied", "pf-bucket", **OUTPUTS)
    finally:
        bucket.allow_all()
    assert rc != 0
    message = failures["vm0"]
    assert "this node's service account may not use " in message
    assert "storage.objects.create" in message
    assert "--role roles/storage.objectUser" in message
    assert_nothing_started(vms, "pf-bucket")


def test_the_wrong_nic_chosen(train_cluster, test_cluster, nodes_rule, tmp_path):
    """ext0 exists on every VM (the 'public' side, SSH only): the nodes cannot train over it.
    On the GCP path the firewall role refuses it first (the API says the VMs' address on the
    rule's network is another); off GCP (the static inventory) the preflight names it."""
    inventory, vms = train_cluster
    rc, failures, _unreachable = train(
        inventory, tmp_path / "gcp", "pf-wrongnic", llamafactory_interface="ext0"
    )
    assert rc != 0
    message = " ".join(failures["vm0"].split())
    external, internal = vms[0].node["external_address"], vms[0].node["vpc_address"]
    assert (
        f"the training address of vm0 is {external} (primary_nic), but its address on network "
        f"default, which the rule is for, is {internal} (Compute Engine API)" in message
    )
    assert_nothing_started(vms, "pf-wrongnic")

    local = test_cluster[1]["inventory"]
    rc, failures, _unreachable = train(
        local, tmp_path / "local", "pf-wrongnic", llamafactory_interface="ext0"
    )
    assert rc != 0
    message = failures["vm0"]
    assert "master-unreachable: vm1 (rank 1) cannot reach MASTER_ADDR:MASTER_PORT" in message
    assert "peer-unreachable" in message
    assert "(vm0's ext0, vm1's ext0) is not on the network the nodes share" in message
    assert_nothing_started(vms, "pf-wrongnic")


def test_a_nic_that_does_not_exist(train_cluster, tmp_path):
    inventory, vms = train_cluster
    rc, failures, _unreachable = train(
        inventory, tmp_path, "pf-nonic", llamafactory_interface="ens9"
    )
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


def test_one_node_unreachable(train_cluster, test_cluster, tmp_path):
    """On the static inventory (llamafactory_platform local): its hosts' addresses can be cut."""
    _inventory, vms = train_cluster
    inventory = test_cluster[1]["inventory"]
    data = yaml.safe_load(Path(inventory).read_text())
    hosts = data["all"]["children"]["llamafactory"]["hosts"]
    hosts["vm1"]["ansible_host"] = hosts["vm1"]["ansible_host"].rsplit(".", 1)[0] + ".99"
    # Next to the original, for its group_vars (the local job).
    broken = Path(inventory).with_name("test-unreachable.yml")
    broken.write_text(yaml.safe_dump(data))
    try:
        rc, _failures, unreachable = train(str(broken), tmp_path, "pf-unreachable")
    finally:
        broken.unlink()
    assert rc != 0
    assert unreachable == ["vm1"]
    assert_nothing_started(vms, "pf-unreachable")


def test_master_port_already_taken(train_cluster, tmp_path):
    """Something else listens on MASTER_PORT on rank 0's node (a hand launch, another job)."""
    inventory, (vm0, vm1) = train_cluster
    hold = (
        'nohup timeout 300 python3 -c "import socket, time; s = socket.socket(); '
        "s.bind(('0.0.0.0', 29777)); s.listen(); time.sleep(300)\" >/dev/null 2>&1 & "
        "echo $! > /run/hold-29777.pid"
    )
    with on_vm(vm0, hold, "kill $(cat /run/hold-29777.pid); rm -f /run/hold-29777.pid"):
        rc, failures, _unreachable = train(
            inventory, tmp_path, "pf-busy", llamafactory_master_port=29777
        )
    assert rc != 0
    message = failures["vm0"]
    assert (
        "port-in-use: port 29777 (MASTER_PORT) or 49777 (preflight_port) is already "
        "taken on vm0" in message
    )
    assert "llamafactory_master_port" in message
    assert_nothing_started((vm0, vm1), "pf-busy")


def test_what_the_nodes_lack_on_the_host_a_shared_mount_and_the_gpu_driver(train_cluster, tmp_path):
    """A job of 1 GPU a node on nodes without NVIDIA's driver or runtime (the host setup
    skipped), with a shared mount they lack: the probe's start fails on Docker's missing GPU
    runtime, yet returns what it found on the host; the GPUs' health check, run in the
    background beside the probes, names the driver on each node."""
    inventory, vms = train_cluster
    rc, failures, _unreachable = train(
        inventory,
        tmp_path,
        "pf-nomount",
        skip_tags="host_setup",
        llamafactory_shared_mounts=["/srv/nowhere"],
        llamafactory_gpus_per_node=1,
    )
    assert rc != 0
    message = failures["vm0"]
    for vm in ("vm0", "vm1"):
        assert f"shared-mount-missing: {vm} has no folder /srv/nowhere" in message
        assert f"nvidia-smi-missing: {vm}: nvidia-smi is not installed" in message
    assert_nothing_started(vms, "pf-nomount")
    for vm in vms:  # the health check's status file stays in the job's folder
        assert vm.sh("ls /var/lib/llamafactory/jobs/pf-nomount/async").stdout.strip(), vm.name


def test_mtu_mismatch(train_cluster, tmp_path):
    inventory, (vm0, vm1) = train_cluster
    nic, mtu = vm1.node["nic"], vm1.node["vpc_mtu"]
    with on_vm(vm1, f"ip link set {nic} mtu {mtu - 60}", f"ip link set {nic} mtu {mtu}"):
        rc, failures, _unreachable = train(inventory, tmp_path, "pf-mtu")
    assert rc != 0
    message = failures["vm0"]
    assert (
        f"mtu-mismatch: the nodes' training NICs have different MTUs: vm0 {vm0.node['nic']} "
        f"MTU {mtu}, vm1 {nic} MTU {mtu - 60}" in message
    )
    assert_nothing_started((vm0, vm1), "pf-mtu")


def test_a_smoke_test_that_fails_names_the_rank_and_leaves_nothing(train_cluster, tmp_path):
    """The probes pass (MASTER_PORT, the preflight port and the agents' port are open) but
    Gloo's connections between the ranks, on ephemeral ports, are dropped on both nodes: the
    smoke test fails, every node is read and the rank that failed is named with its lines; no
    smoke test's or rank's container is left."""
    inventory, vms = train_cluster
    port, preflight_port, agent_port = 29778, 49778, 39778
    rules = [
        "INPUT -i {nic} -p tcp -m conntrack --ctstate NEW --dport 32768:60999 -j DROP",
        f"INPUT -i {{nic}} -p tcp --dport {preflight_port} -j ACCEPT",
        f"INPUT -i {{nic}} -p tcp --dport {agent_port} -j ACCEPT",
    ]
    for vm in vms:
        for rule in rules:
            vm.sh(f"iptables -I {rule.format(nic=vm.node['nic'])}")
    try:
        rc, failures, _unreachable = train(
            inventory,
            tmp_path,
            "pf-smoke",
            llamafactory_master_port=port,
            preflight_timeout=20,
        )
    finally:
        for vm in vms:
            for rule in rules:
                vm.sh(f"iptables -D {rule.format(nic=vm.node['nic'])}", check=False)
    assert rc != 0
    message = failures["vm0"]
    assert message.startswith("the smoke test (torchrun across 2 nodes) failed: rank "), message
    # Gloo's connections hang until the test's own deadline ends the rank (not a stop's signal).
    assert "(SIGALRM, preflight_timeout) before the ranks joined" in message, message
    assert "Fix: open every TCP port between the nodes" in message, message
    assert_nothing_started(vms, "pf-smoke")


DOCTOR = "playbooks/doctor.yml"


def doctor(inventory, tmp_path, **extravars):
    """(rc, the report's lines as one text)."""
    runner, _facts, results = run_playbook(
        inventory, tmp_path, DOCTOR, extravars={**PULL_VARS, **extravars}
    )
    shown = [
        item["res"].get("msg")
        for items in results.values()
        for item in items
        if item["task"] in ("Show the report", "Fail when the doctor found a problem")
    ]
    text = "\n".join("\n".join(m) if isinstance(m, list) else str(m) for m in shown if m)
    return runner.rc, text


def test_doctor_on_a_healthy_cluster(train_cluster, nodes_rule, tmp_path):
    inventory, vms = train_cluster
    rc, report = doctor(inventory, tmp_path, llamafactory_job="pf-doctor")
    assert rc == 0, report
    assert "doctor: 0 problem(s) found" in report
    assert "smoke test: all_reduce across 2 ranks (gloo), bus bandwidth" in report
    for vm in vms:  # nothing left behind
        assert vm.sh("test -e /var/lib/llamafactory/jobs/.doctor", check=False).returncode != 0
        assert "preflight" not in vm.sh("docker ps -a --format '{{.Names}}'").stdout


def test_doctor_names_a_port_the_vpc_firewall_drops(train_cluster, box, nodes_rule, tmp_path):
    """The role's rule deleted behind its back (the doctor does not manage the firewall)."""
    inventory = train_cluster[0]
    box.delete_rule(NODES_RULE)
    try:
        rc, report = doctor(inventory, tmp_path, llamafactory_job="pf-doctor")
    finally:
        put_back(box, nodes_rule)
    assert rc != 0
    assert "- peer-unreachable: vm0 (rank 0) cannot reach vm1" in report


def test_doctor_reads_a_hand_launched_job(train_cluster, nodes_rule, tmp_path):
    """The report's hand launch in miniature: torchrun in bridge-networked containers, rank 0
    publishing MASTER_PORT, MASTER_ADDR = rank 0's VPC address. The doctor skips nothing (the
    containers have exited) and finds the cause in their logs."""
    inventory, (vm0, vm1) = train_cluster
    image = PULL_VARS["llamafactory_image"]
    master = vm0.node["vpc_address"]
    probe = "/var/lib/llamafactory/hand/smoke.py"
    script = (
        Path(__file__).resolve().parents[2] / "roles/preflight/files/smoke_allreduce.py"
    ).read_text()
    for rank, vm in enumerate((vm0, vm1)):
        vm.sh(f"mkdir -p /var/lib/llamafactory/hand && cat > {probe} <<'EOF'\n{script}\nEOF")
        publish = "-p 29555:29555" if rank == 0 else ""
        vm.sh(
            f"docker rm -f hand-rank >/dev/null 2>&1; docker run -d --name hand-rank {publish} "
            f"-v {probe}:/smoke.py:ro {image} torchrun --nnodes 2 --node_rank {rank} "
            f"--nproc_per_node 1 --master_addr {master} --master_port 29555 /smoke.py "
            "--backend gloo --deadline 60"
        )
    try:
        for vm in (vm0, vm1):
            vm.sh("timeout 120 docker wait hand-rank", timeout=150)
        rc, report = doctor(inventory, tmp_path, preflight_doctor_container="hand-rank")
    finally:
        for vm in (vm0, vm1):
            vm.sh("docker rm -f hand-rank; rm -rf /var/lib/llamafactory/hand", check=False)
    assert rc != 0
    assert "in the logs of hand-rank" in report
    assert "gloo-bridge-address" in report or "172.17." in report, report
