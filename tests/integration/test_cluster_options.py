"""Cluster options (NIC names, a second NIC, a decoy default route), teardown, other platforms.
Each test brings up its own one-VM cluster on subnets of its own."""

import docker
import pytest
from conftest import VM, ansible_facts
from localcluster import cluster, images, spec
from localcluster.images import ArchiveUnreachable

pytestmark = pytest.mark.cluster  # brings up a local cluster


def test_second_nic_and_decoy_default_route_then_teardown_leaves_nothing(tmp_path):
    definition = spec.load(
        name="opts",
        shift=2,
        vms=[{"name": "vm0", "nic": "enp0s12", "second_nic": "ens5", "decoy": "ens6"}],
    )
    # The disk of a VM whose `down` was interrupted: a new VM must not inherit it.
    client = docker.from_env()
    stale = definition.volume(definition.vms[0])
    client.volumes.create(stale)
    client.containers.run(
        images.ensure_probe_image(client, cluster.cache_dir()),
        ["touch", "/disk/stale-marker"],
        volumes={stale: {"bind": "/disk", "mode": "rw"}},
        remove=True,
    )
    state = cluster.up(definition)
    try:
        vm = VM(state["nodes"][0])
        vm.sh("test -d /var/lib/docker/image && test ! -e /var/lib/docker/stale-marker")
        links = vm.addresses()
        nets = definition.networks
        assert links["enp0s12"]["ipv4"] == [(nets["vpc"].address(0), 24)]
        assert links["ens5"]["ipv4"] == [(nets["secondary"].address(0), 24)]
        assert links["ens6"]["ipv4"] == [(nets["decoy"].address(0), 24)]
        assert not [name for name in links if name.startswith(("eth", "hlftmp"))]
        route = vm.default_route()
        assert (route["dev"], route["gateway"]) == ("ens6", nets["decoy"].gateway)
        # The VPC is still reached directly through the primary NIC.
        peer = nets["vpc"].address(5)
        assert "dev enp0s12" in vm.sh(f"ip -4 route get {peer}").stdout
        # ...and this is why the default route is the wrong guide to the training NIC:
        facts = ansible_facts(state["inventory"], tmp_path)["vm0"]
        assert facts["ansible_default_ipv4"]["interface"] == "ens6"
    finally:
        cluster.down(definition)
    assert cluster.leftovers(client, "opts") == []
    assert not definition.inventory.exists()
    assert not cluster.state_dir(definition).exists()


def test_ubuntu_2204_vm():
    platform = images.PLATFORMS["ubuntu2204"]
    try:
        images.ensure_vm_image(docker.from_env(), platform, cluster.cache_dir())
    except ArchiveUnreachable as exc:
        pytest.skip(f"Ubuntu 22.04 not tested: {exc} (not a promised source on this machine)")
    definition = spec.load(
        name="ubuntu", shift=3, vms=[{"name": "vm0", "nic": "eth0", "platform": "ubuntu2204"}]
    )
    state = cluster.up(definition)
    try:
        vm = VM(state["nodes"][0])
        assert 'VERSION_ID="22.04"' in vm.sh("cat /etc/os-release").stdout
        seen = vm.sh(
            "docker run --rm --net=host hostnet-llamafactory/probe:busybox "
            "ip -o -4 addr show dev eth0"
        ).stdout
        assert f"inet {state['nodes'][0]['vpc_address']}/" in seen
    finally:
        cluster.down(definition)
