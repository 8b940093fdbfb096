"""Every local-cluster VM answers as a GCE VM's metadata server does, at
metadata.google.internal and 169.254.169.254, for itself, its host-networked containers and its
bridged ones; a published change wakes a waiting request; the server outlives a VM restart."""

import json
import subprocess
import time

import pytest
from conftest import VM
from localcluster import cluster, gce_metadata, images, spec

pytestmark = pytest.mark.cluster  # brings up a local cluster

V1 = "computeMetadata/v1"
CURL = "curl -sf -H 'Metadata-Flavor: Google'"
WGET = "wget -q -O - --header 'Metadata-Flavor: Google'"


@pytest.fixture(scope="module")
def md_cluster():
    definition = spec.load(name="md", shift=7)
    state = cluster.up(definition)
    yield definition, state
    cluster.down(definition)


def test_each_vm_answers_with_its_own_gce_metadata(md_cluster):
    definition, state = md_cluster
    recorded = json.loads((cluster.state_dir(definition) / "state.json").read_text())
    for node in state["nodes"]:
        vm = VM(node)
        base = f"http://metadata.google.internal/{V1}"
        ip = vm.sh(f"{CURL} {base}/instance/network-interfaces/0/ip").stdout
        assert ip == node["vpc_address"]
        mac = vm.sh(f"{CURL} {base}/instance/network-interfaces/0/mac").stdout
        assert mac == vm.sh(f"cat /sys/class/net/{node['nic']}/address").stdout.strip()
        assert vm.sh(f"{CURL} http://169.254.169.254/{V1}/instance/name").stdout == node["name"]
        instance = json.loads(vm.sh(f"{CURL} '{base}/instance/?recursive=true'").stdout)
        assert instance["zone"].endswith("/zones/us-central1-a")
        assert instance["machineType"].endswith("/machineTypes/n2-standard-4")
        assert instance["id"] == node["instance_id"]
        access = instance["networkInterfaces"][0]["accessConfigs"][0]
        assert access["externalIp"] == node["external_address"]
        assert vm.sh(f"{CURL} {base}/project/project-id").stdout == "hostnet-box"
        refused = vm.sh(f"curl -s -o /dev/null -w '%{{http_code}}' {base}/instance/name")
        assert refused.stdout == "403"
    for record in recorded["nodes"]:
        assert (record["project"], record["zone"], record["machine_type"]) == (
            "hostnet-box",
            "us-central1-a",
            "n2-standard-4",
        )


def test_containers_on_the_vm_reach_it(md_cluster):
    node = md_cluster[1]["nodes"][1]
    vm = VM(node)
    path = f"{V1}/instance/network-interfaces/0/ip"
    host = vm.sh(
        f"docker run --rm --net=host {images.PROBE_IMAGE} "
        f"{WGET} http://metadata.google.internal/{path}"
    )
    assert host.stdout == node["vpc_address"]
    # On Docker's bridge, through the VM's routing (by address: the bridge has no GCE DNS).
    bridged = vm.sh(f"docker run --rm {images.PROBE_IMAGE} {WGET} http://169.254.169.254/{path}")
    assert bridged.stdout == node["vpc_address"]


def test_a_published_change_wakes_a_waiting_request(md_cluster):
    definition, state = md_cluster
    node = state["nodes"][0]
    vm = VM(node)
    url = f"http://metadata.google.internal/{V1}/instance/preempted"
    etag = vm.sh(f"{CURL} -D - -o /dev/null {url}").stdout
    etag = next(line.split(":", 1)[1].strip() for line in etag.splitlines() if "ETag" in line)
    waiter = subprocess.Popen(
        [
            "docker",
            "exec",
            node["container"],
            "sh",
            "-c",
            f"{CURL} '{url}?wait_for_change=true&last_etag={etag}&timeout_sec=60'",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1)
        assert waiter.poll() is None, "the request did not wait for a change"
        vm_spec = definition.vms[0]
        document = cluster.metadata_document(definition, vm_spec, node["vpc_mac"])
        document["instance"]["preempted"] = "TRUE"
        published = time.monotonic()
        gce_metadata.publish(node["container"], document)
        out, _err = waiter.communicate(timeout=20)
    finally:
        waiter.kill()
    assert out == "TRUE"
    # Woken by the change, not by its 60 s timeout (generous: the suite shares 2 cores).
    assert time.monotonic() - published < 10


def test_the_server_comes_back_after_a_vm_restart(md_cluster):
    node = md_cluster[1]["nodes"][1]
    vm = VM(node)
    subprocess.run(["docker", "restart", "-t", "5", node["container"]], check=True, timeout=60)
    url = f"http://metadata.google.internal/{V1}/instance/name"
    deadline = time.monotonic() + 30
    while True:
        result = vm.sh(f"{CURL} {url}", check=False)
        if result.returncode == 0:
            break
        assert time.monotonic() < deadline, f"no metadata server after the restart: {result}"
        time.sleep(0.5)
    assert result.stdout == node["name"]
