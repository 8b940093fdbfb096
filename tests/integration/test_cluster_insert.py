"""The box's empty project: `vms: []` comes up with its networks and services and no VM, and a VM
made through ClusterBackend.insert (what the fake's instances.insert calls) is reachable over SSH
as its `ssh-keys` metadata says, listed as the API lists it, and preempted as GCE preempts a spot
VM. About 30 s."""

import json
import subprocess

import pytest
from localcluster import cluster, gce_control, gce_metadata, spec

pytestmark = pytest.mark.cluster  # brings up a local cluster


def empty_project_definition(name: str = "vmapi", **overrides) -> spec.ClusterSpec:
    """An empty project (no VM; zones us-central1-a and -b) on /24s of shift 6 that no other
    test cluster uses (198.18.198.0/24, 198.19.196.0/24)."""
    return spec.load(
        name=name,
        shift=6,
        zones=["us-central1-a", "us-central1-b"],
        networks={
            "vpc": {"subnet": "198.18.6.0/24", "mtu": 1460},
            "external": {"subnet": "198.19.4.0/24"},
        },
        vms=[],
        **overrides,
    )


@pytest.fixture(scope="module")
def empty_project():
    """(definition, its ClusterBackend) of a running empty project; torn down at the end."""
    definition = empty_project_definition()
    cluster.up(definition)
    try:
        yield definition, gce_control.ClusterBackend(cluster.state_dir(definition))
    finally:
        cluster.down(definition)
    assert cluster.leftovers(cluster.client(), definition.name) == []


def test_a_spot_vm_inserted_reached_and_preempted(empty_project):
    definition, backend = empty_project
    directory = cluster.state_dir(definition)
    assert backend.instances() == []
    public_key = (directory / "id_ed25519.pub").read_text().strip()
    backend.insert(
        "us-central1-b",
        {
            "name": "spot-0",
            "machineType": "zones/us-central1-b/machineTypes/n2-standard-4",
            "labels": {"llamafactory": "training", "llamafactory-rank": "0"},
            "metadata": {"items": [{"key": "ssh-keys", "value": f"gce:{public_key}"}]},
            "scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"},
        },
    )
    (instance,) = backend.instances()
    assert instance["status"] == "RUNNING"
    assert instance["zone"].endswith("/zones/us-central1-b")
    assert instance["scheduling"]["preemptible"] is True
    state = json.loads((directory / "state.json").read_text())
    address = instance["networkInterfaces"][0]["accessConfigs"][0]["natIP"]
    assert address == state["nodes"][0]["external_address"]
    url = "http://metadata.google.internal/computeMetadata/v1/instance"
    shown = subprocess.run(
        cluster.ssh_command(
            state, address, f"sudo -n true && curl -sfH 'Metadata-Flavor: Google' {url}/zone"
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert shown.endswith("/zones/us-central1-b")
    assert "spot-0" in definition.inventory.read_text()
    waiter = subprocess.Popen(
        [
            "docker",
            "exec",
            state["nodes"][0]["container"],
            "curl",
            "-s",
            "-H",
            "Metadata-Flavor: Google",
            # Waits from FALSE's ETag: answers at once should the change come before it asks.
            f"{url}/preempted?wait_for_change=true&last_etag={gce_metadata.etag_of(b'FALSE')}",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    backend.preempt("spot-0")
    assert waiter.communicate(timeout=30)[0] == "TRUE"  # told before the VM went down
    assert backend.instances() == []
    state = json.loads((directory / "state.json").read_text())
    assert (state["nodes"], state["definition"]["vms"]) == ([], [])
    assert "spot-0" not in definition.inventory.read_text()
