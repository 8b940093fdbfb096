"""The local cluster's fake Compute Engine API (tools/localcluster/gce_control.py) answers for its
VMs and acts on them: the gcp_compute inventory plugin, authenticated with the service-account
file the fake wrote, lists the VMs; stop, start and setLabels through the API change the VMs and
what the inventory shows. One two-VM cluster of its own ('cp', shift 6)."""

import json
import os
import subprocess
import sys
import time

import docker
import pytest
from conftest import ROOT, VM, run_playbook
from localcluster import box_api, cluster, gce_firewall, images, spec

pytestmark = pytest.mark.cluster  # brings up a local cluster

LINK = "https://www.googleapis.com/compute/v1/"
ANSIBLE_INVENTORY = os.path.join(os.path.dirname(sys.executable), "ansible-inventory")


@pytest.fixture(scope="module")
def cp():
    # A fresh project's rules: default-allow-internal lets the VMs reach each other.
    definition = spec.load(
        name="cp",
        shift=6,
        firewall=[*spec.load().firewall, spec.DEFAULT_ALLOW_INTERNAL],
        placement_policy={"name": "hlf-compact"},
    )
    state = cluster.up(definition)
    yield definition, state
    cluster.down(definition)
    assert not cluster.state_dir(definition).exists()


@pytest.fixture(scope="module")
def box(cp):
    client = box_api.Box(cp[1]["gce"])
    yield client
    client.close()


def inventory(cp):
    """ansible-inventory --list on the cluster's GCP-path inventory (the shipped dynamic
    inventory pointed at the box, and its SSH login); (groups, hostvars)."""
    gce = cp[1]["gce"]
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("GCP_", "LLAMAFACTORY_"))
    }
    environment.update(gce["env"], ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    environment["ANSIBLE_INVENTORY_UNPARSED_FAILED"] = "1"
    result = subprocess.run(
        [ANSIBLE_INVENTORY, "-i", cp[1]["gcp_inventory"], "--list"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr

    def unwrap(value):
        return value["__ansible_unsafe"] if set(value) == {"__ansible_unsafe"} else value

    listed = json.loads(result.stdout, object_hook=unwrap)
    return listed, listed["_meta"]["hostvars"]


def ssh(state, node):
    return subprocess.run(
        cluster.ssh_command(state, node["external_address"], "hostname"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_inventory_stop_start_and_labels_through_the_api(cp, box, tmp_path):
    definition, state = cp
    vm0, vm1 = state["nodes"]
    groups, hostvars = inventory(cp)
    assert sorted(groups["llamafactory"]["hosts"]) == ["vm0", "vm1"]
    for node in (vm0, vm1):
        host = hostvars[node["name"]]
        assert host["ansible_host"] == node["external_address"]
        assert host["llamafactory_node_rank"] == node["index"]
        assert host["gcp_status"] == "RUNNING"
        assert host["gcp_networkInterfaces"][0]["networkIP"] == node["vpc_address"]
        assert host["gcp_machineType"] == "n2-standard-4"  # the plugin keeps the name
        assert (host["llamafactory_gcp_project"], host["gcp_firewall_network"]) == (
            "hostnet-box",
            "default",
        )
        assert host["ansible_user"] == state["user"]  # box.yml, beside the dynamic inventory

    # The compact placement policy the VMs are in (resourcePolicies.get, instances' links).
    policy = box.call("GET", f"{box.project_url}/regions/us-central1/resourcePolicies/hlf-compact")
    assert policy["groupPlacementPolicy"] == {"vmCount": 2, "collocation": "COLLOCATED"}
    assert box.instance("vm1")["resourcePolicies"] == [policy["selfLink"]]

    # stop: the container stops, its disk stays; the inventory shows TERMINATED, no natIP.
    box.act("vm1", "stop")
    client = docker.from_env()
    assert client.containers.get(vm1["container"]).status == "exited"
    client.volumes.get(definition.volume(definition.vms[1]))
    _groups, hostvars = inventory(cp)
    assert hostvars["vm1"]["gcp_status"] == "TERMINATED"
    assert "natIP" not in hostvars["vm1"]["gcp_networkInterfaces"][0]["accessConfigs"][0]
    assert hostvars["vm1"]["ansible_host"] == vm1["vpc_address"]
    # train.yml on the GCP path names the stopped VM before any node is contacted.
    result, _facts, _results = run_playbook(
        state["gcp_inventory"],
        tmp_path / "stopped",
        "playbooks/train.yml",
        {"llamafactory_job": "cp-stopped"},
        envvars=state["gce"]["env"],
    )
    assert result.rc != 0 and not result.unreachable()
    message = " ".join(result.failures()["vm0"]["msg"].split())
    assert "vm1 is TERMINATED in Compute Engine" in message
    assert "gcloud compute instances start vm1 --zone us-central1-a" in message

    # start: a new ephemeral external IP, as on GCE (known_hosts and the metadata follow); SSH
    # with the controller's key and the recorded host key; the NIC is back.
    box.act("vm1", "start")
    state = json.loads((cluster.state_dir(definition) / "state.json").read_text())
    old_address, vm1 = vm1["external_address"], state["nodes"][1]
    assert vm1["external_address"] != old_address
    metadata = VM(vm1).sh(
        "curl -sf -H 'Metadata-Flavor: Google' http://metadata.google.internal/computeMetadata/"
        "v1/instance/network-interfaces/0/access-configs/0/external-ip"
    )
    assert metadata.stdout.strip() == vm1["external_address"]
    answer = ssh(state, vm1)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip() == "vm1"
    links = VM(vm1).addresses()
    assert links[vm1["nic"]]["ipv4"] == [(vm1["vpc_address"], vm1["vpc_prefix"])]
    # renamed again (Docker names them eth0, eth1 at every start), with the external filter
    assert links[cluster.EXTERNAL_NIC]["ipv4"][0][0] == vm1["external_address"]
    assert not [n for n in links if n.startswith("hlftmp") or n == "eth1"]
    # the VPC firewall is in force again on both NICs (it lives in the VM's netfilter)
    chains = gce_firewall.show(vm1["container"])
    assert f"-i {cluster.EXTERNAL_NIC} -j HLF-GCE-INGRESS" in chains
    assert f"-i {vm1['nic']} -j HLF-GCE-INGRESS" in chains
    assert VM(vm1).default_route()["dev"] == vm1["nic"]
    assert "vm0" in VM(vm1).sh("getent hosts vm0").stdout
    _groups, hostvars = inventory(cp)
    assert hostvars["vm1"]["gcp_status"] == "RUNNING"
    assert hostvars["vm1"]["ansible_host"] == vm1["external_address"]

    # setLabels: a stale fingerprint is refused; the current one takes vm0 out of the group.
    fingerprint = box.instance("vm0")["labelFingerprint"]
    stale = box.session.post(
        f"{box.zone_url}/instances/vm0/setLabels",
        json={"labels": {"llamafactory": "idle"}, "labelFingerprint": "c3RhbGU="},
    )
    assert stale.status_code == 412, stale.text
    box.act(
        "vm0", "setLabels", {"labels": {"llamafactory": "idle"}, "labelFingerprint": fingerprint}
    )
    groups, hostvars = inventory(cp)
    assert groups["llamafactory"]["hosts"] == ["vm1"]
    assert sorted(hostvars) == ["vm1"]  # the API's filter leaves vm0 out
    labels = json.loads((cluster.state_dir(definition) / "labels.json").read_text())
    assert labels == {"vm0": {"llamafactory": "idle"}}


# Connects to ADDRESS:PORT from the VM, prints the first line answered or "error: ...".
ASK = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2) as sock:
        sock.settimeout(2)
        print(sock.recv(16).decode().strip())
except OSError as exc:
    print(f"error: {exc}")
"""


def answer(vm, address, port):
    return vm.sh(f"python3 -c '{ASK}' {address} {port}").stdout.strip()


def answered_within(vm, address, port, wanted, seconds=15):
    started = time.monotonic()
    while (found := answer(vm, address, port)) != wanted and not (
        wanted == "error" and found.startswith("error")
    ):
        assert time.monotonic() - started < seconds, f"{address}:{port} answered {found!r}"
        time.sleep(0.3)


def test_a_rule_made_through_the_api_is_enforced_and_its_deletion_taken_back(cp, box):
    """The API lists the project's own rules; a deny inserted through it drops vm1's connections
    to vm0 at once, and deleting it lets them through again."""
    _definition, state = cp
    vm0, vm1 = (VM(node) for node in state["nodes"])
    project = state["gce"]["project"]
    assert {"default-allow-internal", "default-allow-ssh"} <= set(box.rules())
    port, address = 31000, vm0.node["vpc_address"]
    vm0.sh(
        f"docker run -d --rm --net=host --name cp-listen {images.PROBE_IMAGE} "
        f"nc -ll -p {port} -e echo pong"
    )
    try:
        answered_within(vm1, address, port, "pong")  # default-allow-internal lets it in
        box.insert_rule(
            {
                "name": "cp-deny-from-vm1",
                "network": f"{LINK}projects/{project}/global/networks/default",
                "priority": 900,
                "sourceRanges": [f"{vm1.node['vpc_address']}/32"],
                "denied": [{"IPProtocol": "tcp", "ports": [str(port)]}],
            }
        )
        answered_within(vm1, address, port, "error")
        assert "cp-deny-from-vm1" in gce_firewall.show(vm0.node["container"])
        box.delete_rule("cp-deny-from-vm1")
        answered_within(vm1, address, port, "pong")
    finally:
        vm0.sh("docker rm -f cp-listen", check=False)
