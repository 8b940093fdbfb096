"""The local cluster's control plane: the fake Compute Engine API (compute_api.py) answering for
the cluster's VMs and acting on them, as Compute Engine does for real VMs.

`ClusterBackend` is what the fake uses when started with `--cluster STATE_DIR`: its instances
are the cluster's VM containers, read live from Docker and STATE_DIR/state.json at every request:

- name, zone and project (the definition's `project` and `zone`), machineType (a VM's
  `machine_type`), labels (a VM's `labels`, else llamafactory=training and
  llamafactory-rank=INDEX; every setLabels is kept in STATE_DIR/labels.json, so later reads and
  the inventory see it);
- status from the container: RUNNING while it runs, TERMINATED when stopped, STOPPING or STAGING
  while an operation acts on it;
- nic0 on network "default" with networkIP = the VPC address and, while RUNNING, accessConfigs
  [{ONE_TO_ONE_NAT, "External NAT", natIP = the external address}] (a stopped VM has no natIP);
  nic1 on network "secondary" for a VM with a second NIC; a GPU machine type's further NICs
  after nic0 in GCP's order (the second control NIC, then the GPU NICs), each on its network
  (spec.ClusterSpec.gce_network: <cluster>-net-1, <cluster>-gpu0.., <cluster>-rdma-net with a
  subnetwork <cluster>-rdma-sub-N per RDMA NIC), as in the VM's metadata.

The actions (run by the fake in an operation's thread; the operation is DONE when they return):
stop = the container stopped, its disk (volume) and container kept; start = the container started
with a new external address, as Compute Engine gives a started VM a new ephemeral external IP
(cluster.renew_external_address: state.json, known_hosts, the static inventory and the VM's
metadata follow), and what a restart loses set again (NIC names, routes, the external path's
filter, the hosts file: cluster.configure_network), then systemd, sshd and dockerd awaited;
reset = a restart (the external address kept, as on GCE), the same re-applied; delete = the
container and its disk removed.

compute_service.py runs the fake as a service of the cluster (cluster.up and cluster.down call
it); the fake, in its own process, makes the backend here (compute_api.cluster_backend).
"""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path

import docker
import docker.errors

from . import cluster, gce_firewall, spec

LINK = "https://www.googleapis.com/compute/v1/"
STOP_TIMEOUT_S = 30
NETWORKS = {"vpc": "default", "secondary": "secondary"}  # cluster network role -> GCE network


def on_firewalls(state: dict, rules: list[dict]) -> None:
    """Called when a firewall write landed, with the cluster's state and every rule of its
    project (as the API returns them): the rules take effect in every VM (within a second or so,
    as on GCE)."""
    gce_firewall.enforce(state, rules)


class ClusterBackend:
    """The cluster's VMs as Compute Engine instances (see the module's docstring)."""

    def __init__(self, state_dir: Path):
        self.state_dir = Path(state_dir)
        self.lock = threading.Lock()
        self.transitions: dict[str, str] = {}  # VM name -> STOPPING or STAGING while acting
        definition = spec.parse(self.state()["definition"])
        self.definition = definition
        self.project, self.zone = definition.project, definition.zone
        self.networks = [NETWORKS[role] for role in NETWORKS if role in definition.networks]
        used = {n.role for vm in definition.vms for n in spec.machine_nics(vm)} - {"vpc"}
        for role in definition.networks:  # a GPU machine type's VPCs (rules may name them)
            name = definition.gce_network(role)
            if role in used and name not in self.networks:
                self.networks.append(name)
        # The rules in force: the project's own at boot (the API lists them), then what lands.
        self.rules: list[dict] = list(self.state().get("firewall") or [])

    def state(self) -> dict:
        return json.loads((self.state_dir / "state.json").read_text())

    # -- reading --------------------------------------------------------------------------------

    def labels(self) -> dict[str, dict[str, str]]:
        path = self.state_dir / "labels.json"
        kept = json.loads(path.read_text()) if path.exists() else {}
        return {vm.name: kept.get(vm.name, vm.initial_labels()) for vm in self.definition.vms}

    def instances(self) -> list[dict]:
        """Every VM whose container exists, as instances.get answers it."""
        label = {"label": f"{cluster.CLUSTER_LABEL}={self.definition.name}"}
        containers = {c.name: c for c in docker.from_env().containers.list(all=True, filters=label)}
        labels = self.labels()
        found = []
        for node in self.state()["nodes"]:
            container = containers.get(node["container"])
            if container is not None:
                found.append(self._instance(node, container, labels[node["name"]]))
        return found

    def _instance(self, node: dict, container, labels: dict) -> dict:
        zone_link = f"{LINK}projects/{self.project}/zones/{self.zone}"
        region = self.zone.rsplit("-", 1)[0]
        vm = self.definition.vms[node["index"]]
        status = {"running": "RUNNING", "restarting": "STAGING", "paused": "SUSPENDED"}.get(
            container.status, "TERMINATED"
        )
        status = self.transitions.get(vm.name, status)
        nics = [("default", "default", node["vpc_address"])]
        if node.get("second_address"):
            nics.append(("secondary", "secondary", node["second_address"]))
        for nic in [*node.get("control_nics", [])[1:], *node.get("gpu_nics", [])]:
            role = nic["network"]
            nics.append(
                (
                    self.definition.gce_network(role),
                    self.definition.gce_subnetwork(role),
                    nic["address"],
                )
            )
        interfaces = []
        for index, (network, subnetwork, address) in enumerate(nics):
            interface = {
                "kind": "compute#networkInterface",
                "name": f"nic{index}",
                "network": f"{LINK}projects/{self.project}/global/networks/{network}",
                "subnetwork": f"{LINK}projects/{self.project}/regions/{region}/subnetworks/"
                + subnetwork,
                "networkIP": address,
                "stackType": "IPV4_ONLY",
            }
            if index == 0:
                access = {
                    "kind": "compute#accessConfig",
                    "type": "ONE_TO_ONE_NAT",
                    "name": "External NAT",
                    "networkTier": "PREMIUM",
                }
                if status == "RUNNING":
                    access["natIP"] = node["external_address"]
                interface["accessConfigs"] = [access]
            interfaces.append(interface)
        created = container.attrs["Created"]
        policies = [p["selfLink"] for p in self.resource_policies()]
        return {
            "kind": "compute#instance",
            "id": str(int(container.id[:15], 16)),
            "creationTimestamp": f"{created[:19]}.000+00:00",
            "name": vm.name,
            "zone": zone_link,
            "selfLink": f"{zone_link}/instances/{vm.name}",
            "status": status,
            "machineType": f"{zone_link}/machineTypes/{vm.machine_type}",
            "labels": labels,
            "networkInterfaces": interfaces,
            **({"resourcePolicies": policies} if policies else {}),
            "canIpForward": False,
            "disks": [
                {
                    "kind": "compute#attachedDisk",
                    "deviceName": "persistent-disk-0",
                    "boot": True,
                    "autoDelete": True,
                    "source": f"{zone_link}/disks/{vm.name}",
                }
            ],
        }

    def resource_policies(self) -> list[dict]:
        """The definition's placement policy, holding every VM, as resourcePolicies.get answers."""
        policy = self.definition.placement_policy
        if not policy:
            return []
        region = self.zone.rsplit("-", 1)[0]
        region_link = f"{LINK}projects/{self.project}/regions/{region}"
        created = self.state().get("created") or "2026-01-01T00:00:00"
        return [
            {
                "kind": "compute#resourcePolicy",
                "id": str(int.from_bytes(policy["name"].encode()[:7], "big")),
                "creationTimestamp": f"{created[:19]}.000-00:00",
                "selfLink": f"{region_link}/resourcePolicies/{policy['name']}",
                "region": region_link,
                "name": policy["name"],
                "status": "READY",
                "groupPlacementPolicy": {
                    "vmCount": len(self.definition.vms),
                    "collocation": policy["collocation"],
                },
            }
        ]

    # -- acting (blocking: the fake runs each in its operation's thread) ------------------------

    def _vm_and_container(self, name: str):
        vm = next(v for v in self.definition.vms if v.name == name)
        return vm, docker.from_env(timeout=300).containers.get(self.definition.container(vm))

    @contextlib.contextmanager
    def _acting(self, name: str, transition: str):
        """The status reads say `transition` while the action runs."""
        self.transitions[name] = transition
        try:
            yield
        finally:
            self.transitions.pop(name, None)

    def stop(self, name: str) -> None:
        _vm, container = self._vm_and_container(name)
        with self._acting(name, "STOPPING"):
            container.stop(timeout=STOP_TIMEOUT_S)

    def start(self, name: str) -> None:
        vm, container = self._vm_and_container(name)
        container.reload()
        if container.status == "running":
            return  # as on Compute Engine: starting a running VM changes nothing
        with self._acting(name, "STAGING"):
            container.start()
            # Its ephemeral external IP was released at stop: a new one (reset keeps it).
            cluster.renew_external_address(self.definition, vm, container, self.state_dir)
            self._restore(vm, container)

    def reset(self, name: str) -> None:
        vm, container = self._vm_and_container(name)
        with self._acting(name, "STAGING"):
            container.restart(timeout=STOP_TIMEOUT_S)
            self._restore(vm, container)

    def _restore(self, vm, container) -> None:
        cluster.configure_network(self.definition, vm, container)
        on_firewalls(self.state(), self.rules)  # a restarted VM lost its filter
        cluster.wait_booted(vm, container)

    def delete(self, name: str) -> None:
        vm, container = self._vm_and_container(name)
        with self._acting(name, "STOPPING"):
            container.remove(force=True, v=True)
            with contextlib.suppress(docker.errors.NotFound):
                docker.from_env().volumes.get(self.definition.volume(vm)).remove(force=True)
        self._save_labels(name, None)

    def set_labels(self, name: str, labels: dict[str, str]) -> None:
        self._save_labels(name, labels)

    def _save_labels(self, name: str, labels: dict | None) -> None:
        with self.lock:
            path = self.state_dir / "labels.json"
            kept = json.loads(path.read_text()) if path.exists() else {}
            if labels is None:
                kept.pop(name, None)
            else:
                kept[name] = labels
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(kept, indent=2, sort_keys=True) + "\n")
            tmp.replace(path)

    def firewalls_landed(self, rules: list[dict]) -> None:
        self.rules = list(rules)
        on_firewalls(self.state(), rules)
