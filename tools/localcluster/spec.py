"""The cluster definition: one YAML file shared by the demo and the tests."""

from __future__ import annotations

import copy
import importlib.util
import ipaddress
import re
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from . import gce_firewall
from .images import PLATFORMS
from .util import ClusterError

# Every simulated network lives in the range set aside for network tests (RFC 2544).
ALLOWED_RANGE = ipaddress.ip_network("198.18.0.0/15")
DEFAULT_DEFINITION = Path(__file__).resolve().parent / "cluster.yml"
# A fresh project's rule between the VMs of its default network (GCP: 10.128.0.0/9; here the
# VPC's subnet, moved with it under `shift`). The default definition leaves it out.
DEFAULT_ALLOW_INTERNAL = {
    "kind": "compute#firewall",
    "name": "default-allow-internal",
    "description": "Allow internal traffic on the default network",
    "network": "https://www.googleapis.com/compute/v1/projects/hostnet-box/global/networks/default",
    "direction": "INGRESS",
    "priority": 65534,
    "sourceRanges": ["198.18.0.0/24"],
    "allowed": [
        {"IPProtocol": "tcp", "ports": ["0-65535"]},
        {"IPProtocol": "udp", "ports": ["0-65535"]},
        {"IPProtocol": "icmp"},
    ],
    "disabled": False,
    "logConfig": {"enable": False},
    "selfLink": "https://www.googleapis.com/compute/v1/projects/hostnet-box/global/firewalls/"
    "default-allow-internal",
}
NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,20}$")
NIC_RE = re.compile(r"^[a-z][a-z0-9]{1,14}$")
HOST_OFFSET = 10  # VM i gets address .(10 + i) on every network
SHIFT_BLOCK = 32 * 256  # addresses a `shift` of 1 moves a subnet by (32 /24s, a /19)
# Compute Engine's rules for label keys and values, project IDs and zone names.
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
PROJECT_RE = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
MACHINE_TYPE_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)+$")


def _network_profile():
    """The collection's table of GCP's GPU machine types (plugins/module_utils, pure stdlib),
    loaded by path: their NIC layout has that one home, the box reads it from there."""
    path = Path(__file__).resolve().parents[2] / "plugins/module_utils/_network_profile.py"
    loader = importlib.util.spec_from_file_location("hlf_box_network_profile", path)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module


MACHINE_TYPES = _network_profile().MACHINE_TYPES
# The networks of a GPU machine type's NICs beyond nic0. On GCP each of them is on a VPC (or a
# subnet) of its own: control1 is the gib types' second gVNIC (the blueprints' net-1), gpu0..7
# the tcpxo types' GPU VPCs (cluster-toolkit's multivpc "gpunets"), rdma0..7 the gib types'
# RoCE subnets (gpu-rdma-vpc: one VPC, a subnet per CX-7 NIC). tcpxo and gib NICs never share a
# network (a RoCE VPC takes MRDMA NICs only), so a cluster may mix both.
GPU_ROLE_RE = re.compile(r"^(control[1-9]|gpu[0-9]|rdma[0-9])$")
# Unless the definition's `networks:` names them, their subnets are derived: the /24 number
# SLOT in the first /19 of 198.18.0.0/15 (198.18.SLOT.0/24), moved by `shift` like the others:
# control<i> 16-i (control1: 198.18.15.0/24), gpu<i> 16+i (198.18.16-23), rdma<i> 24+i
# (198.18.24-31). The default definition's own networks sit at 198.18.0-2 and 198.19.0.
DERIVED_BASE = ipaddress.ip_network("198.18.0.0/24")
# MTUs: the gib types' control and RDMA networks 8896 (gpu_nic_mtu; cluster-toolkit's
# a3ultra/a4 blueprints set net-0/net-1 to 8896 too). The tcpxo types' recipe sets no GPU VPC
# MTU (gpu_nic_mtu None): 8244, the value dstack's documented GCP recipe creates them with
# (dstackai/dstack examples/clusters/gcp/README.md, `--mtu=8244`), which is also the a3-high and
# a3-mega blueprints' system VPC MTU. nic0's network is the shared "vpc" network, one Docker
# network for every VM of the cluster: its MTU stays the definition's (GCP's would be 8244 for
# A3, 8896 for A3 Ultra/A4 per those blueprints; a definition may set it).
TCPXO_GPU_MTU = 8244
CONTROL_MTU = {"tcpxo": 8244, "gib": 8896}
_PCI_NAME_RE = re.compile(r"^enp(\d+)s(\d+)(?:f(\d+))?$")


@dataclass(frozen=True)
class Network:
    """One simulated network: the VPC, the external path, a second NIC's or the decoy's."""

    role: str
    subnet: ipaddress.IPv4Network
    mtu: int = 1500

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    def address(self, index: int) -> str:
        return str(self.subnet.network_address + HOST_OFFSET + index)


@dataclass(frozen=True)
class VM:
    name: str
    index: int
    nic: str = "ens4"
    platform: str = "debian12"
    second_nic: str | None = None  # a second real NIC on the "secondary" network
    decoy: str | None = None  # a NIC named like a real one that carries the default route
    tags: tuple[str, ...] = ()  # network tags, as on a GCE instance
    machine_type: str = "n2-standard-4"  # what the fake Compute Engine API reports
    labels: dict[str, str] | None = None  # its labels; None: the training label and rank
    zone: str = "us-central1-a"  # its zone (one of the definition's zones)

    @property
    def layout(self) -> dict | None:
        """Its machine type's entry of MACHINE_TYPES (a GPU type's NIC layout), or None."""
        return MACHINE_TYPES.get(self.machine_type)

    def initial_labels(self) -> dict[str, str]:
        if self.labels is not None:
            return dict(self.labels)
        return {"llamafactory": "training", "llamafactory-rank": str(self.index)}


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    user: str
    networks: dict[str, Network]
    vms: tuple[VM, ...]
    inventory: Path
    firewall: tuple[dict, ...] = ()  # compute#firewall resources, in force on every VM
    project: str = "hostnet-box"  # the project and zone the fake Compute Engine API serves
    zone: str = "us-central1-a"
    # A compact placement policy every VM is in: {name, collocation}, or None.
    placement_policy: dict | None = None
    # The zones the project has (the fake API serves them all; `zone` is the default one).
    zones: tuple[str, ...] = ()

    def vm(self, name: str) -> VM:
        """The VM of that name (KeyError when there is none)."""
        for vm in self.vms:
            if vm.name == name:
                return vm
        raise KeyError(name)

    def free_index(self, taken: set[int] | frozenset[int] = frozenset()) -> int:
        """The lowest VM index no VM of the definition holds and not in `taken` (a VM's index
        gives its addresses: .(10 + index) on every network); ClusterError when the smallest
        subnet is full."""
        used = {vm.index for vm in self.vms} | set(taken)
        index = next(i for i in range(len(used) + 1) if i not in used)
        if index >= self.capacity():
            raise ClusterError(
                f"cluster {self.name}: no free address left for another VM "
                f"(at most {self.capacity()} VMs fit the smallest subnet)"
            )
        return index

    def capacity(self) -> int:
        """How many VMs the smallest subnet holds (indexes 0..capacity-1)."""
        return min(n.subnet.num_addresses for n in self.networks.values()) - HOST_OFFSET - 2

    def prefix(self) -> str:
        return f"hlf-{self.name}"

    def container(self, vm: VM) -> str:
        return f"{self.prefix()}-{vm.name}"

    def network_name(self, role: str) -> str:
        return f"{self.prefix()}-{role}"

    def gce_network(self, role: str) -> str:
        """The GCE network a NIC on this network role is in, as metadata and the API name it:
        nic0's "default"; the GPU types' VPCs named after the cluster, as a blueprint names them
        after its deployment (the gib types' RDMA NICs share one VPC, a subnet each)."""
        if role == "vpc":
            return "default"
        if role.startswith("control"):
            return f"{self.name}-net-{role[len('control') :]}"
        if role.startswith("rdma"):
            return f"{self.name}-rdma-net"
        return role if role == "secondary" else f"{self.name}-{role}"

    def gce_subnetwork(self, role: str) -> str:
        if role.startswith("rdma"):
            return f"{self.name}-rdma-sub-{role[len('rdma') :]}"
        return self.gce_network(role)

    def volume(self, vm: VM) -> str:
        return f"{self.prefix()}-{vm.name}-docker"

    @property
    def gcp_inventory(self) -> Path:
        """The inventory of the GCP path: a folder beside `inventory` holding the shipped
        inventories/gcp_compute.yml pointed at the box, and the box's SSH login."""
        return self.inventory.with_name(f"{self.inventory.stem}.gcp")


@dataclass(frozen=True)
class MachineNic:
    """One NIC of a GPU machine type: its network role, name in the VM, kind (control or gpu)
    and PCI address as GCP gives it (None where none is published)."""

    role: str
    name: str
    kind: str
    pci_slot: str | None


def pci_slot_of_name(name: str) -> str | None:
    """A predictable PCI name's address: enp0s12 -> 0000:00:0c.0, enp192s20 -> 0000:c0:14.0."""
    found = _PCI_NAME_RE.match(name)
    if not found:
        return None
    bus, slot, function = (int(found[i] or 0) for i in (1, 2, 3))
    return f"0000:{bus:02x}:{slot:02x}.{function}"


def machine_nics(vm: VM) -> list[MachineNic]:
    """The NICs of the VM's machine type in GCP's order (nic0 = the first control NIC, on the
    "vpc" network; the other control NICs; the GPU NICs); [] for a type without GPU NICs."""
    layout = vm.layout
    if not layout:
        return []
    nics = [
        MachineNic("vpc" if i == 0 else f"control{i}", name, "control", pci_slot_of_name(name))
        for i, name in enumerate(layout["control_nics"])
    ]
    prefix = "gpu" if layout["profile"] == "tcpxo" else "rdma"
    slots = layout["gpu_nic_slots"]
    for i, names in enumerate(layout["gpu_nic_names"]):
        slot = slots[i] if i < len(slots) else None  # gib: none published, none invented
        nics.append(MachineNic(f"{prefix}{i}", names[0], "gpu", slot))
    return nics


def gpu_network_mtu(layout: dict, role: str) -> int:
    if role.startswith("control"):
        return CONTROL_MTU[layout["profile"]]
    return layout["gpu_nic_mtu"] or TCPXO_GPU_MTU


def derived_subnet(role: str, shift: int) -> ipaddress.IPv4Network:
    """The subnet of a GPU machine type's network the definition does not name."""
    kind, number = re.match(r"^([a-z]+)(\d+)$", role).groups()
    slot = {"control": 16 - int(number), "gpu": 16 + int(number), "rdma": 24 + int(number)}[kind]
    return ipaddress.ip_network(
        (int(DERIVED_BASE.network_address) + slot * 256 + shift * SHIFT_BLOCK, 24)
    )


def _fail(message: str) -> None:
    raise ClusterError(f"cluster definition: {message}")


def _network(role: str, raw: dict, default_mtu: int = 1500) -> Network:
    try:
        subnet = ipaddress.ip_network(raw["subnet"])
    except (KeyError, ValueError) as exc:
        _fail(f"networks.{role}.subnet: {exc}; give an IPv4 subnet such as 198.18.0.0/24")
    if not (subnet.version == 4 and subnet.subnet_of(ALLOWED_RANGE)):
        _fail(
            f"networks.{role}.subnet {subnet} is outside {ALLOWED_RANGE}: simulated networks "
            "must stay in the range reserved for network tests"
        )
    if subnet.num_addresses < 64:
        _fail(f"networks.{role}.subnet {subnet} is too small: use a /26 or larger")
    mtu = int(raw.get("mtu", default_mtu))
    if not 1280 <= mtu <= 9000:
        _fail(f"networks.{role}.mtu {mtu} must be within 1280..9000")
    return Network(role, subnet, mtu)


def _vm(
    index: int, raw: dict | str, networks: dict[str, Network], zones: tuple[str, ...] = ()
) -> VM:
    raw = {"name": raw} if isinstance(raw, str) else dict(raw)
    machine_type = str(raw.pop("machine_type", "n2-standard-4"))
    layout = MACHINE_TYPES.get(machine_type)
    nic = raw.pop("nic", None)
    position = index
    index = raw.pop("index", index)
    zone = str(raw.pop("zone", None) or (zones[0] if zones else "us-central1-a"))
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        _fail(f"vms[{position}].index {index!r} must be a whole number, 0 or more")
    vm = VM(
        name=str(raw.pop("name", f"vm{position}")),
        index=index,
        zone=zone,
        nic=nic or (layout["control_nics"][0] if layout else "ens4"),
        platform=raw.pop("platform", "debian12"),
        second_nic=raw.pop("second_nic", None),
        decoy=raw.pop("decoy", None),
        machine_type=machine_type,
        labels=_labels(position, raw.pop("labels", None)),
    )
    where = f"vms[{position}] ({vm.name})"
    tags = raw.pop("tags", None) or []
    if raw:
        _fail(
            f"{where}: unknown keys {sorted(raw)}; known: name, nic, platform, second_nic, "
            "decoy, tags, machine_type, labels, zone, index"
        )
    if zones and zone not in zones:
        _fail(f"{where}: zone {zone!r} is not one of the definition's zones {list(zones)}")
    if not isinstance(tags, list) or not all(
        isinstance(t, str) and gce_firewall.NAME_RE.match(t) for t in tags
    ):
        _fail(
            f"{where}: tags must be a list of network tags matching {gce_firewall.NAME_RE.pattern}"
        )
    vm = replace(vm, tags=tuple(tags))
    if not MACHINE_TYPE_RE.match(vm.machine_type):
        _fail(
            f"{where}: machine_type {vm.machine_type!r} is not a GCE machine type name "
            "(such as n2-standard-4 or a2-highgpu-1g)"
        )
    if not NAME_RE.match(vm.name):
        _fail(f"{where}: name must match {NAME_RE.pattern}")
    if vm.platform not in PLATFORMS:
        _fail(f"{where}: platform {vm.platform!r} is not one of {sorted(PLATFORMS)}")
    if layout and nic and nic != layout["control_nics"][0]:
        _fail(
            f"{where}: nic {nic!r} is not {machine_type}'s primary NIC "
            f"{layout['control_nics'][0]!r} (its control NIC, as GCP names it): leave nic out "
            f"or set it to {layout['control_nics'][0]}"
        )
    nics = [n for n in (vm.nic, vm.second_nic, vm.decoy) if n]
    nics += [n.name for n in machine_nics(vm) if n.role != "vpc"]
    for nic in nics:
        if not NIC_RE.match(nic) or nic.startswith("hlftmp"):
            _fail(f"{where}: NIC name {nic!r} must match {NIC_RE.pattern} (and not start hlftmp)")
    if len(set(nics)) != len(nics):
        _fail(f"{where}: NIC names must differ, got {nics}")
    for key, role in (("second_nic", "secondary"), ("decoy", "decoy")):
        if getattr(vm, key) and role not in networks:
            _fail(f"{where}: {key} needs networks.{role} to be defined")
    for machine_nic in machine_nics(vm):
        if machine_nic.role not in networks:  # parse() derives them: never met from a file
            _fail(f"{where}: {machine_type}'s {machine_nic.name} needs networks.{machine_nic.role}")
    return vm


def _labels(index: int, raw) -> dict[str, str] | None:
    """A VM's labels as Compute Engine accepts them (None: the default ones)."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or len(raw) > 64:
        _fail(f"vms[{index}].labels must be a mapping of at most 64 labels")
    labels = {str(k): str(v) for k, v in raw.items()}
    for key, value in labels.items():
        if not LABEL_KEY_RE.match(key) or not LABEL_VALUE_RE.match(value):
            _fail(
                f"vms[{index}].labels: {key}={value!r}: keys must match {LABEL_KEY_RE.pattern}, "
                f"values {LABEL_VALUE_RE.pattern}"
            )
    return labels


def _shifted(raw: dict, shift: int) -> dict:
    """Move a network by `shift` x 32 /24s, so that clusters of one definition can coexist."""
    if not shift or "subnet" not in raw:
        return raw
    subnet = ipaddress.ip_network(raw["subnet"])
    moved = ipaddress.ip_network(
        (int(subnet.network_address) + shift * SHIFT_BLOCK, subnet.prefixlen)
    )
    return dict(raw, subnet=str(moved))


def _shifted_range(cidr: str, shift: int) -> str:
    """A firewall range within the simulated networks (a /19 or smaller) moves with them."""
    network = ipaddress.ip_network(cidr, strict=False)
    if not shift or network.prefixlen < 19 or not network.subnet_of(ALLOWED_RANGE):
        return cidr
    moved = ipaddress.ip_network(
        (int(network.network_address) + shift * SHIFT_BLOCK, network.prefixlen)
    )
    if not moved.subnet_of(ALLOWED_RANGE):
        _fail(f"firewall range {cidr} moved by shift {shift} leaves {ALLOWED_RANGE}")
    return str(moved)


def _firewall(raw, shift: int) -> tuple[dict, ...]:
    """The definition's firewall rules, checked as GCE checks them, ranges moved by `shift`."""
    if raw is None:  # a fresh project's rules, as the default definition lists them
        raw = yaml.safe_load(DEFAULT_DEFINITION.read_text())["firewall"]
    if not isinstance(raw, (list, tuple)):
        _fail("firewall must be a list of compute#firewall rules (or left out for the defaults)")
    rules = []
    for index, rule in enumerate(raw):
        try:
            gce_firewall.check(rule)
        except gce_firewall.FirewallError as exc:
            _fail(f"firewall[{index}]: {exc}")
        rule = copy.deepcopy(rule)
        for field in ("sourceRanges", "destinationRanges"):
            if rule.get(field):
                rule[field] = [_shifted_range(cidr, shift) for cidr in rule[field]]
        rules.append(rule)
    names = [rule["name"] for rule in rules]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        _fail(f"firewall: rule names must be unique, {duplicates} repeat")
    return tuple(rules)


def load(path: Path | None = None, **overrides) -> ClusterSpec:
    """Read a definition; `overrides` replace top-level keys (name, nodes, vms, inventory,
    firewall, shift: move every subnet and the firewall's ranges by shift x 32 /24s)."""
    path = path or DEFAULT_DEFINITION
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ClusterError(f"cannot read the cluster definition {path}: {exc}") from exc
    raw.update({k: v for k, v in overrides.items() if v is not None})
    return parse(raw)


def parse(raw: dict) -> ClusterSpec:
    name = str(raw.get("name", "demo"))
    if not NAME_RE.match(name):
        _fail(f"name {name!r} must match {NAME_RE.pattern}")
    vms_raw = raw.get("vms")
    nodes = raw.get("nodes")
    if nodes is not None:
        template = dict((vms_raw or [{}])[0]) if vms_raw else {}
        template.pop("name", None)
        vms_raw = [dict(template, name=f"vm{i}") for i in range(int(nodes))]
    vms_raw = list(vms_raw or [])  # none: an empty project (VMs come through the API)
    shift = int(raw.get("shift") or 0)
    gpu_mtus = _gpu_network_mtus(vms_raw)
    networks = {
        role: _network(role, _shifted(value, shift), gpu_mtus.get(role, 1500))
        for role, value in (raw.get("networks") or {}).items()
    }
    for role in ("vpc", "external"):
        if role not in networks:
            _fail(f"networks.{role} is required")
    unknown = {
        r
        for r in set(networks) - {"vpc", "external", "secondary", "decoy"}
        if not GPU_ROLE_RE.match(r)
    }
    if unknown:
        _fail(
            f"unknown networks {sorted(unknown)}; known: vpc, external, secondary, decoy, and "
            "a GPU machine type's control1, gpu0..gpu9, rdma0..rdma9"
        )
    derived = set()
    for role, mtu in gpu_mtus.items():
        if role not in networks:  # the definition does not name it: derived (see DERIVED_BASE)
            subnet = derived_subnet(role, shift)
            if not subnet.subnet_of(ALLOWED_RANGE):
                _fail(f"networks.{role}: its derived subnet {subnet} leaves {ALLOWED_RANGE}")
            networks[role] = Network(role, subnet, mtu)
            derived.add(role)
    roles = list(networks)
    for i, a in enumerate(roles):
        for b in roles[i + 1 :]:
            if networks[a].subnet.overlaps(networks[b].subnet):
                hint = "".join(
                    f"; networks.{r}'s subnet is derived (198.18.0.0/24 + its slot, moved by "
                    f"shift): name it under networks: to move it"
                    for r in (a, b)
                    if r in derived
                )
                _fail(f"subnets {networks[a].subnet} and {networks[b].subnet} overlap{hint}")
    zone = str(raw.get("zone", "us-central1-a"))
    if not ZONE_RE.match(zone):
        _fail(f"zone {zone!r} is not a GCE zone name such as us-central1-a")
    zones = _zones(raw.get("zones"), zone)
    vms = tuple(_vm(i, item, networks, zones) for i, item in enumerate(vms_raw))
    if len({vm.name for vm in vms}) != len(vms):
        _fail("vms: names must be unique")
    vms = _indexed(vms, [isinstance(item, dict) and "index" in item for item in vms_raw])
    capacity = min(n.subnet.num_addresses for n in networks.values()) - HOST_OFFSET - 2
    if len(vms) > capacity or any(vm.index >= capacity for vm in vms):
        _fail(
            f"{len(vms)} VMs (indexes up to {max(vm.index for vm in vms)}) do not fit the "
            f"smallest subnet (at most {capacity}, indexes 0..{capacity - 1})"
        )
    user = str(raw.get("user", "gce"))
    if not re.match(r"^[a-z_][a-z0-9_-]{0,31}$", user) or user == "root":
        _fail(f"user {user!r} must be a plain non-root login name")
    project = str(raw.get("project", "hostnet-box"))
    if not PROJECT_RE.match(project):
        _fail(
            f"project {project!r} is not a GCP project id: 6-30 lowercase letters, digits "
            "and hyphens, starting with a letter"
        )
    inventory = Path(raw.get("inventory") or f"inventories/local/{name}.yml")
    if not inventory.is_absolute():
        inventory = repo_root() / inventory
    firewall = _firewall(raw.get("firewall"), int(raw.get("shift") or 0))
    placement = _placement_policy(raw.get("placement_policy"))
    return ClusterSpec(
        name=name,
        user=user,
        networks=networks,
        vms=vms,
        inventory=inventory,
        firewall=firewall,
        project=project,
        zone=zone,
        placement_policy=placement,
        zones=zones,
    )


def _zones(raw, zone: str) -> tuple[str, ...]:
    """The project's zones (`zones:`, default [zone]); the default zone first among them."""
    if raw is None:
        return (zone,)
    if not isinstance(raw, (list, tuple)) or not raw:
        _fail("zones must be a non-empty list of zone names such as us-central1-a")
    zones = [str(z) for z in raw]
    for name in zones:
        if not ZONE_RE.match(name):
            _fail(f"zones: {name!r} is not a GCE zone name such as us-central1-b")
    if len(set(zones)) != len(zones):
        _fail(f"zones: names must be unique, got {zones}")
    if zone not in zones:
        _fail(f"zone {zone!r} is not one of zones {zones}: list it there")
    return (zone, *[z for z in zones if z != zone])


def _indexed(vms: tuple[VM, ...], explicit: list[bool]) -> tuple[VM, ...]:
    """The VMs with their indexes: a VM's own `index` where it gives one (as state.json keeps
    the VMs the API created, whose indexes are never another running VM's), else the lowest
    index no other VM holds, in order (a definition without indexes: 0, 1, 2, ...)."""
    given = [vm.index for vm, own in zip(vms, explicit, strict=True) if own]
    repeated = sorted({i for i in given if given.count(i) > 1})
    if repeated:
        _fail(f"vms: indexes must be unique, {repeated} repeat")
    taken, placed = set(given), []
    for vm, own in zip(vms, explicit, strict=True):
        if not own:
            index = next(i for i in range(len(vms) + len(taken) + 1) if i not in taken)
            taken.add(index)
            vm = replace(vm, index=index)
        placed.append(vm)
    return tuple(placed)


def _gpu_network_mtus(vms_raw) -> dict[str, int]:
    """The networks the definition's GPU machine types need beyond vpc, with their MTUs."""
    mtus = {}
    for item in vms_raw:
        machine_type = item.get("machine_type") if isinstance(item, dict) else None
        layout = MACHINE_TYPES.get(str(machine_type))
        if not layout:
            continue
        probe = VM(name="probe", index=0, machine_type=str(machine_type))
        for nic in machine_nics(probe):
            if nic.role != "vpc":
                mtus[nic.role] = gpu_network_mtu(layout, nic.role)
    return mtus


COLLOCATIONS = ("COLLOCATED", "UNSPECIFIED_COLLOCATION")


def _placement_policy(raw) -> dict | None:
    """A group placement policy (compute#resourcePolicy) the VMs are in, as GPU clusters use:
    {name, collocation: COLLOCATED (the default) or UNSPECIFIED_COLLOCATION}."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - {"name", "collocation"}:
        _fail("placement_policy must be {name: NAME, collocation: COLLOCATED}")
    name = str(raw.get("name", ""))
    if not gce_firewall.NAME_RE.match(name):
        _fail(f"placement_policy.name {name!r} must match {gce_firewall.NAME_RE.pattern}")
    collocation = str(raw.get("collocation", "COLLOCATED"))
    if collocation not in COLLOCATIONS:
        _fail(f"placement_policy.collocation {collocation!r}: use one of {COLLOCATIONS}")
    return {"name": name, "collocation": collocation}


def to_raw(definition: ClusterSpec) -> dict:
    """The definition as parse() takes it back (subnets already shifted): for state.json."""
    return {
        "name": definition.name,
        "user": definition.user,
        "project": definition.project,
        "zone": definition.zone,
        "zones": list(definition.zones or (definition.zone,)),
        "inventory": str(definition.inventory),
        "networks": {
            role: {"subnet": str(n.subnet), "mtu": n.mtu} for role, n in definition.networks.items()
        },
        "vms": [
            {
                "name": vm.name,
                "nic": vm.nic,
                "platform": vm.platform,
                "second_nic": vm.second_nic,
                "decoy": vm.decoy,
                "machine_type": vm.machine_type,
                "labels": vm.labels,
                "tags": list(vm.tags),
                "zone": vm.zone,
                "index": vm.index,
            }
            for vm in definition.vms
        ],
        "firewall": [dict(rule) for rule in definition.firewall],
        "placement_policy": definition.placement_policy,
    }


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]
