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
container and its disk removed (a VM insert made: its node and definition entry too, so that
state.json, known_hosts and the inventory lose it).

insert(zone, body) makes a VM as `up` does (cluster._create_vm, _configure_vm: a fresh disk,
the VPC and external networks, a GPU machine type's NICs on networks made when first needed,
the lowest index no VM holds, so that its addresses are no other VM's), from a compute#instance
as instances.insert takes it: its name, zone, machineType, labels, tags, scheduling (SPOT:
preemptible), serviceAccounts, resourcePolicies and metadata items, which its metadata server
serves as instance attributes; its `ssh-keys` item's users (`USER:KEY` lines) are made with
those keys and passwordless sudo, as GCE's guest agent makes them. The box's CA, the wheelhouse,
the probe image, the registry's CA (where the cluster has one) and the firewall rules in force
as on the definition's VMs. The VM lands in state.json (its node, with the insert's extras under
"instance", and an entry of the definition's `vms` with its index and zone), known_hosts, the
static inventory and labels.json. preempt(name) is GCE's preemption of a spot VM:
instance/preempted TRUE in its metadata, the ACPI shutdown (the container's stop signal,
SIGRTMIN+3: systemd powers off) with STOP_TIMEOUT_S before it is forced, then TERMINATED or
deleted per its instanceTerminationAction (STOP when none). state.json is read and rewritten
under cluster.state_lock (a file lock: inserts run in parallel threads, and the CLI writes too).

compute_service.py runs the fake as a service of the cluster (cluster.up and cluster.down call
it); the fake, in its own process, makes the backend here (compute_api.cluster_backend).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import subprocess
import threading
from pathlib import Path

import docker
import docker.errors

from . import cluster, gce_firewall, gce_metadata, images, spec
from .util import ClusterError, log, wait_until

LINK = "https://www.googleapis.com/compute/v1/"
STOP_TIMEOUT_S = 30  # a preempted VM's grace, and stop's, before the VM is powered off hard
NETWORKS = {"vpc": "default", "secondary": "secondary"}  # cluster network role -> GCE network
DEFAULT_SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
# One image check (and build, where missing) at a time for the process's inserts.
_IMAGES_LOCK = threading.Lock()


def machine_type_name(value: str) -> str:
    """n2-standard-4 of a short name, zones/Z/machineTypes/n2-standard-4 or its full URL."""
    return str(value).rstrip("/").rsplit("/", 1)[-1]


def scheduling_of(body: dict, machine_type: str) -> dict:
    """The instance's compute#scheduling as GCE completes it: SPOT gets preemptible true,
    instanceTerminationAction STOP and no automatic restart unless given; STANDARD automatic
    restart; onHostMaintenance TERMINATE for spot and GPU types, MIGRATE otherwise."""
    scheduling = dict(body.get("scheduling") or {})
    gpu = machine_type in spec.MACHINE_TYPES or bool(body.get("guestAccelerators"))
    if scheduling.get("provisioningModel") == "SPOT" or scheduling.get("preemptible"):
        scheduling.setdefault("provisioningModel", "SPOT")
        scheduling["preemptible"] = True
        scheduling.setdefault("instanceTerminationAction", "STOP")
        scheduling.setdefault("automaticRestart", False)
        scheduling.setdefault("onHostMaintenance", "TERMINATE")
    else:
        scheduling.setdefault("provisioningModel", "STANDARD")
        scheduling.setdefault("preemptible", False)
        scheduling.setdefault("automaticRestart", True)
        scheduling.setdefault("onHostMaintenance", "TERMINATE" if gpu else "MIGRATE")
    return scheduling


def instance_extras(body: dict, machine_type: str) -> dict:
    """What an insert's body says beyond the definition's fields, kept in the VM's state node
    ("instance"): its metadata items (and as attributes, the metadata server's), scheduling,
    serviceAccounts, resourcePolicies, labels (at insert) and disks."""
    items = [
        {"key": str(item["key"]), "value": str(item.get("value", ""))}
        for item in (body.get("metadata") or {}).get("items") or []
    ]
    return {
        "metadata_items": items,
        "attributes": {item["key"]: item["value"] for item in items},
        "scheduling": scheduling_of(body, machine_type),
        "serviceAccounts": [
            {"email": a.get("email", "default"), "scopes": list(a.get("scopes") or DEFAULT_SCOPES)}
            for a in body.get("serviceAccounts") or []
        ]
        if "serviceAccounts" in body
        else None,
        "resourcePolicies": list(body.get("resourcePolicies") or []),
        "labels": dict(body.get("labels") or {}),
        "disks": list(body.get("disks") or []),
    }


def metadata_fingerprint(items: list[dict]) -> str:
    return hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()[:16]


def allocate_index(state: dict, definition: spec.ClusterSpec) -> int:
    """The lowest index no VM holds: none of the definition's, none of a node's (state.json),
    none an insert under way reserved ("pending"), and none whose external address a started VM
    took (renew_external_address), so that a new VM's addresses are no other VM's."""
    taken = {node["index"] for node in state["nodes"]}
    taken |= set((state.get("pending") or {}).values())
    external = definition.networks["external"]
    in_use = {node["external_address"] for node in state["nodes"]}
    taken |= {i for i in range(definition.capacity()) if external.address(i) in in_use}
    return definition.free_index(taken)


def with_vm(raw_definition: dict, entry: dict) -> dict:
    """The raw definition (state.json's) with one more VM entry, as parse() checks it."""
    raw = json.loads(json.dumps(raw_definition))
    raw["vms"] = [*raw.get("vms", []), entry]
    return spec.to_raw(spec.parse(raw))  # a GPU type's derived networks recorded too


def without_vm(state: dict, name: str) -> dict:
    """The state without VM `name`: its node, definition entry and reservation."""
    state = dict(state)
    state["nodes"] = [n for n in state["nodes"] if n["name"] != name]
    definition = dict(state["definition"])
    definition["vms"] = [v for v in definition.get("vms", []) if v.get("name") != name]
    state["definition"] = definition
    pending = dict(state.get("pending") or {})
    pending.pop(name, None)
    state["pending"] = pending
    return state


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
        definition = self.definition
        self.project, self.zone = definition.project, definition.zone
        self.zones = list(definition.zones or (definition.zone,))  # the project's zones
        # The rules in force: the project's own at boot (the API lists them), then what lands.
        self.rules: list[dict] = list(self.state().get("firewall") or [])

    def state(self) -> dict:
        return json.loads((self.state_dir / "state.json").read_text())

    @property
    def definition(self) -> spec.ClusterSpec:
        """The definition as state.json has it now (inserts and deletes change its VMs)."""
        return spec.parse(self.state()["definition"])

    @property
    def networks(self) -> list[str]:
        """The project's GCE networks: default, secondary where defined, and the VPCs of the
        GPU machine types its VMs have (rules may name them)."""
        definition = self.definition
        networks = [NETWORKS[role] for role in NETWORKS if role in definition.networks]
        used = {n.role for vm in definition.vms for n in spec.machine_nics(vm)} - {"vpc"}
        for role in definition.networks:
            name = definition.gce_network(role)
            if role in used and name not in networks:
                networks.append(name)
        return networks

    # -- reading --------------------------------------------------------------------------------

    def labels(self, definition: spec.ClusterSpec | None = None) -> dict[str, dict[str, str]]:
        definition = definition or self.definition
        path = self.state_dir / "labels.json"
        kept = json.loads(path.read_text()) if path.exists() else {}
        return {vm.name: kept.get(vm.name, vm.initial_labels()) for vm in definition.vms}

    def instances(self) -> list[dict]:
        """Every VM whose container exists, as instances.get answers it."""
        state = self.state()
        definition = spec.parse(state["definition"])
        label = {"label": f"{cluster.CLUSTER_LABEL}={definition.name}"}
        containers = {c.name: c for c in docker.from_env().containers.list(all=True, filters=label)}
        labels = self.labels(definition)
        found = []
        for node in state["nodes"]:
            container = containers.get(node["container"])
            if container is not None:
                found.append(self._instance(node, container, labels[node["name"]], definition))
        return found

    def _instance(
        self, node: dict, container, labels: dict, definition: spec.ClusterSpec | None = None
    ) -> dict:
        definition = definition or self.definition
        vm = definition.vm(node["name"])
        extras = node.get("instance") or {}
        zone_link = f"{LINK}projects/{self.project}/zones/{vm.zone}"
        region = vm.zone.rsplit("-", 1)[0]
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
                    definition.gce_network(role),
                    definition.gce_subnetwork(role),
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
        if node.get("instance") is not None:  # insert's own (links or names, as given)
            policies = list(extras.get("resourcePolicies") or [])
        else:  # the definition's placement policy holds the definition's VMs
            policies = [p["selfLink"] for p in self.resource_policies(definition)]
        items = extras.get("metadata_items") or []
        accounts = extras.get("serviceAccounts")
        if accounts is None:  # the project's default compute account, as the VMs' metadata has
            document = gce_metadata.vm_document(
                project=self.project, zone=vm.zone, name=vm.name, instance_id=0,
                machine_type=vm.machine_type, ip="", mac="", prefix=24, gateway="", mtu=1500,
                external_ip="",
            )  # fmt: skip
            email = document["instance"]["serviceAccounts"]["default"]["email"]
            accounts = [{"email": email, "scopes": list(DEFAULT_SCOPES)}]
        scheduling = extras.get("scheduling") or scheduling_of({}, vm.machine_type)
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
            **({"tags": {"items": list(vm.tags)}} if vm.tags else {}),
            "scheduling": dict(scheduling),
            "metadata": {
                "kind": "compute#metadata",
                "fingerprint": metadata_fingerprint(items),
                "items": [dict(item) for item in items],
            },
            "serviceAccounts": accounts,
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

    def resource_policies(self, definition: spec.ClusterSpec | None = None) -> list[dict]:
        """The definition's placement policy, holding the definition's VMs (not those insert
        made), as resourcePolicies.get answers."""
        state = self.state()
        definition = definition or spec.parse(state["definition"])
        policy = definition.placement_policy
        if not policy:
            return []
        inserted = {n["name"] for n in state["nodes"] if n.get("instance") is not None}
        region = self.zone.rsplit("-", 1)[0]
        region_link = f"{LINK}projects/{self.project}/regions/{region}"
        created = state.get("created") or "2026-01-01T00:00:00"
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
                    "vmCount": len([vm for vm in definition.vms if vm.name not in inserted]),
                    "collocation": policy["collocation"],
                },
            }
        ]

    # -- acting (blocking: the fake runs each in its operation's thread) ------------------------

    def _vm_and_container(self, name: str):
        definition = self.definition
        vm = definition.vm(name)
        return vm, docker.from_env(timeout=300).containers.get(definition.container(vm))

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
        _vm, container = self._vm_and_container(name)
        with self._acting(name, "STOPPING"):
            self._remove(name, container)

    def _remove(self, name: str, container=None) -> None:
        """The VM's container and disk removed; a VM insert made leaves state.json, known_hosts
        and the inventory too (the definition's VMs stay there, as `up` made them)."""
        definition = self.definition
        vm = definition.vm(name)
        if container is not None:
            container.remove(force=True, v=True)
        with contextlib.suppress(docker.errors.NotFound):
            docker.from_env().volumes.get(definition.volume(vm)).remove(force=True)
        with cluster.state_lock(self.state_dir):
            state = self.state()
            node = next((n for n in state["nodes"] if n["name"] == name), None)
            if node is not None and node.get("instance") is not None:
                state = without_vm(state, name)
                cluster.write_state(self.state_dir, state)
                cluster.write_known_hosts(self.state_dir, state["nodes"])
                cluster.write_inventory(spec.parse(state["definition"]), state)
        self._save_labels(name, None)

    # -- insert and preempt ---------------------------------------------------------------------

    def insert(self, zone: str, body: dict) -> None:
        """Create the VM an instances.insert asked for (the fake checked the body, the name's
        uniqueness, capacity and quotas); see the module's docstring. Blocking."""
        name = str(body["name"])
        machine_type = machine_type_name(body["machineType"])
        extras = instance_extras(body, machine_type)
        tags = list((body.get("tags") or {}).get("items") or [])
        entry = {
            "name": name,
            "zone": zone,
            "machine_type": machine_type,
            "labels": extras["labels"],
            "tags": tags,
        }
        with cluster.state_lock(self.state_dir):  # reserve an index: no other insert takes it
            state = self.state()
            definition = spec.parse(state["definition"])
            if zone not in (definition.zones or (definition.zone,)):
                raise ClusterError(f"zone {zone} is not one of the box's zones {definition.zones}")
            if name in {vm.name for vm in definition.vms} | set(state.get("pending") or {}):
                raise ClusterError(f"an instance named {name} exists already")
            entry["index"] = allocate_index(state, definition)
            definition = spec.parse(with_vm(state["definition"], entry))
            state.setdefault("pending", {})[name] = entry["index"]
            cluster.write_state(self.state_dir, state)
        vm = definition.vm(name)
        container = None
        try:
            container, node = self._create(definition, vm, extras)
            with cluster.state_lock(self.state_dir):
                state = self.state()
                state["definition"] = with_vm(state["definition"], entry)
                state["nodes"] = [*state["nodes"], node]
                state["pending"].pop(name, None)
                cluster.write_state(self.state_dir, state)
                cluster.write_known_hosts(self.state_dir, state["nodes"])
                definition = spec.parse(state["definition"])
                cluster.write_inventory(definition, state)
            self._save_labels(name, extras["labels"])
            self._after_membership_change(state, definition)
        except BaseException:
            with contextlib.suppress(Exception):
                self._undo_insert(definition, vm, container)
            raise

    def _create(self, definition: spec.ClusterSpec, vm: spec.VM, extras: dict):
        """The VM's container made, started and set up as `up` sets one up; (container, node)."""
        started = cluster.time.monotonic()
        docker_client = cluster.client()
        cache = self.state_dir.parents[1]  # STATE_DIR is CACHE/localcluster/NAME
        with _IMAGES_LOCK:
            images.ensure_vm_image(docker_client, images.PLATFORMS[vm.platform], cache)
            probe = images.ensure_probe_image(docker_client, cache)
            wheelhouse = images.ensure_wheelhouse(cache)
        count = len(self.state()["nodes"]) + 1
        cluster.ensure_inotify(1)
        cluster.ensure_neighbours(count)
        roles = {role for role, _nic in cluster._vm_networks(definition, vm)}
        cluster.ensure_networks(docker_client, definition, roles)
        container = cluster._create_vm(
            docker_client, definition, vm, "api", wheelhouse, inserted=True
        )
        container.start()
        node = cluster._configure_vm(definition, vm, container, None, probe, instance=extras)
        state = self.state()
        if state.get("gce", {}).get("ca"):
            cluster._trust_box(container.name, Path(state["gce"]["ca"]).read_text())
        registry = self.state_dir / "registry"
        if (registry / "address").is_file() and (registry / "ca.crt").is_file():
            target = f"/etc/docker/certs.d/{(registry / 'address').read_text().strip()}"
            subprocess.run(
                ["docker", "exec", "-i", container.name, "sh", "-c",
                 f"mkdir -p {target} && cat > {target}/ca.crt"],
                input=(registry / "ca.crt").read_bytes(), check=True, timeout=60,
            )  # fmt: skip
        address = node["external_address"]

        def banner() -> bool:
            with socket.create_connection((address, 22), timeout=3) as sock:
                return sock.recv(64).startswith(b"SSH-")

        wait_until(f"{vm.name}: sshd on {address}", banner, deadline_s=cluster.BOOT_DEADLINE_S)
        log(
            f"cluster {definition.name}: {vm.name} ({vm.machine_type}, {vm.zone}) created in "
            f"{cluster.time.monotonic() - started:.1f} s at {address}"
        )
        return container, node

    def _after_membership_change(self, state: dict, definition: spec.ClusterSpec) -> None:
        """Every running VM's hosts file names the VMs now, and the rules in force hold for
        them all (a rule's sourceTags/targetTags may take in the new VM)."""
        containers = docker.from_env(timeout=300).containers
        for node in state["nodes"]:
            with contextlib.suppress(docker.errors.NotFound):
                container = containers.get(node["container"])
                if container.status == "running":
                    cluster.write_hosts(definition, definition.vm(node["name"]), container)
        on_firewalls(state, self.rules)

    def _undo_insert(self, definition: spec.ClusterSpec, vm: spec.VM, container) -> None:
        """What a failed insert made, removed: its container, disk, reservation and node."""
        if container is not None:
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True, v=True)
        with contextlib.suppress(docker.errors.NotFound):
            docker.from_env().volumes.get(definition.volume(vm)).remove(force=True)
        with cluster.state_lock(self.state_dir):
            state = without_vm(self.state(), vm.name)
            cluster.write_state(self.state_dir, state)
            cluster.write_known_hosts(self.state_dir, state["nodes"])

    def preempt(self, name: str) -> None:
        """Preempt a running VM as GCE preempts a spot VM (see the module's docstring)."""
        state = self.state()
        definition = spec.parse(state["definition"])
        vm, container = self._vm_and_container(name)
        container.reload()
        if container.status != "running":
            raise ClusterError(f"{name} is not running ({container.status}): nothing to preempt")
        node = next(n for n in state["nodes"] if n["name"] == name)
        scheduling = (node.get("instance") or {}).get("scheduling") or {}
        action = scheduling.get("instanceTerminationAction") or "STOP"
        with self._acting(name, "STOPPING"):
            gce_metadata.publish(
                container.name, cluster.node_document(definition, node, preempted=True)
            )
            url = f"http://{gce_metadata.ADDRESS}/computeMetadata/v1/instance/preempted"
            wait_until(
                f"{vm.name}: its metadata server saying preempted",
                lambda: (
                    cluster._exec(container, f"curl -sf -H 'Metadata-Flavor: Google' {url}").strip()
                    == "TRUE"
                ),
                deadline_s=10,
                interval=0.1,
            )
            container.stop(timeout=STOP_TIMEOUT_S)  # SIGRTMIN+3, SIGKILL after the grace
            if action == "DELETE":
                self._remove(name, container)

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
