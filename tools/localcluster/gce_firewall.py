"""GCE VPC firewall semantics, enforced with iptables inside the local cluster's VMs.

The rules are Compute Engine v1 `compute#firewall` resources, as the API returns them. Each VM
filters the packets on its GCE NICs (its VPC NIC and ext0, its "external IP") in the `mangle`
table: PREROUTING for ingress, POSTROUTING for egress. mangle PREROUTING runs after conntrack and
before nat PREROUTING, so a port that the VM's dockerd publishes with DNAT is filtered too, on
the port the peer dialled.

Chains (all ours; nothing else uses them):
    mangle PREROUTING  -> HLF-GCE-PREROUTING  -i <each GCE NIC> -> HLF-GCE-INGRESS
    mangle POSTROUTING -> HLF-GCE-POSTROUTING -o <each GCE NIC> -> HLF-GCE-EGRESS
HLF-GCE-INGRESS/EGRESS let replies through (conntrack ESTABLISHED,RELATED: stateful, as GCE),
then hold the applicable rules in GCE's order of evaluation (priority ascending, a deny before an
allow of equal priority): the first match decides, an allow RETURNs (the packet goes on through
the VM's own iptables), a deny DROPs. Last come the implied rules of priority 65535: deny all
ingress, allow all egress (a rule of 65535 ties with them, and a deny wins a tie). render()
writes the four chains whole; iptables-restore --noflush flushes and refills them in one
transaction and touches no other chain. The two jumps from the built-in chains are added once,
after the restore (apply()).

`vm`, the VM as render() sees it:
    {"name": "vm0",
     "tags": ["trainer"],                         # network tags (targetTags, sourceTags)
     "network": "default",                        # rules of other networks are ignored
     "nics": {"ens4": "vpc", "ext0": "external"}, # the GCE NICs filtered, by name
     "peers": {"vm1": {"address": "198.18.0.11", "tags": ["worker"]}, ...}}
`peers` are the VMs of the network (this one may be among them): sourceTags match their VPC
addresses, as GCE matches the primary internal IP of instances carrying the tag.
A VM with NICs on further GCE networks (a GPU machine type's) has them under "more_networks":
    {"gpubox-gpu0": {"nics": ["enp6s0"], "peers": {"vm1": {"address": ..., "tags": [...]}}}}
each filtered by that network's rules in chains of its own (HLF-GCE-INGRESS-1/-EGRESS-1, ...),
with the same implied rules: a tcpxo type's GPU VPCs and a gib type's second control VPC are
regular VPCs, closed to ingress until a rule of theirs opens them. A gib type's RDMA NICs are
left unfiltered: RoCE VPCs take no VPC firewall rules on GCP.
Not modelled: service accounts, logging, IPv6 (the simulated VPC is IPv4 only).
"""

from __future__ import annotations

import ipaddress
import re
import time
from concurrent.futures import ThreadPoolExecutor

from .util import ClusterError, run

INGRESS_CHAIN = "HLF-GCE-INGRESS"
EGRESS_CHAIN = "HLF-GCE-EGRESS"
PREROUTING_CHAIN = "HLF-GCE-PREROUTING"
POSTROUTING_CHAIN = "HLF-GCE-POSTROUTING"
CHAINS = (PREROUTING_CHAIN, POSTROUTING_CHAIN, INGRESS_CHAIN, EGRESS_CHAIN)
HOOKS = (("PREROUTING", PREROUTING_CHAIN), ("POSTROUTING", POSTROUTING_CHAIN))
DEFAULT_PRIORITY = 1000
IMPLIED_PRIORITY = 65535
DEFAULT_NETWORK = "default"
UNFILTERED_ROLE = "rdma"  # the gib types' RDMA NICs' networks (rdma0..7): RoCE, no rules
APPLY_DEADLINE_S = 30

# GCE's protocol names -> what iptables matches (-p); "all" matches every protocol.
PROTOCOLS = {
    "tcp": "tcp",
    "udp": "udp",
    "icmp": "icmp",
    "esp": "esp",
    "ah": "ah",
    "sctp": "sctp",
    "ipip": "4",
    "all": None,
}
NAMED_NUMBERS = {"6": "tcp", "17": "udp", "1": "icmp", "50": "esp", "51": "ah", "132": "sctp"}
WITH_PORTS = {"tcp", "udp", "sctp"}
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")  # rule names and network tags
PORT_RE = re.compile(r"^(\d{1,5})(?:-(\d{1,5}))?$")
KNOWN_KEYS = {
    "kind",
    "id",
    "creationTimestamp",
    "selfLink",
    "name",
    "description",
    "network",
    "priority",
    "direction",
    "allowed",
    "denied",
    "sourceRanges",
    "sourceTags",
    "targetTags",
    "destinationRanges",
    "disabled",
    "logConfig",
}
UNMODELLED = ("sourceServiceAccounts", "targetServiceAccounts")


# Every VPC network's implied rules: at the lowest priority, so that a rule of 65535 ties with
# them (and at a tie a deny wins: an ingress allow of 65535 never gets anything in).
IMPLIED = [
    {
        "name": "implied-deny-ingress",
        "direction": "INGRESS",
        "priority": IMPLIED_PRIORITY,
        "denied": [{"IPProtocol": "all"}],
    },
    {
        "name": "implied-allow-egress",
        "direction": "EGRESS",
        "priority": IMPLIED_PRIORITY,
        "allowed": [{"IPProtocol": "all"}],
    },
]


class FirewallError(ClusterError):
    """A firewall rule GCE would refuse, or one this model cannot enforce."""


# ---------------------------------------------------------------- checking a rule


def check(rule: dict) -> None:
    """Raise FirewallError naming the rule, the field and the fix when GCE would refuse it."""
    if not isinstance(rule, dict):
        raise FirewallError(f"a firewall rule must be a mapping, got {rule!r}")
    name = rule.get("name")
    where = f"firewall rule {name!r}"
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise FirewallError(f"{where}: name must match {NAME_RE.pattern}")
    for key in UNMODELLED:
        if rule.get(key):
            raise FirewallError(f"{where}: {key} is not modelled here; use tags instead")
    unknown = set(rule) - KNOWN_KEYS - set(UNMODELLED)
    if unknown:
        raise FirewallError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(KNOWN_KEYS)}")
    direction = rule.get("direction", "INGRESS")
    if direction not in ("INGRESS", "EGRESS"):
        raise FirewallError(f"{where}: direction {direction!r} must be INGRESS or EGRESS")
    priority = rule.get("priority", DEFAULT_PRIORITY)
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 65535:
        raise FirewallError(f"{where}: priority {priority!r} must be an integer in 0..65535")
    if bool(rule.get("allowed")) == bool(rule.get("denied")):
        raise FirewallError(f"{where}: give exactly one of allowed or denied (a non-empty list)")
    for index, entry in enumerate(rule.get("allowed") or rule.get("denied")):
        _protocol(f"{where}: {'allowed' if rule.get('allowed') else 'denied'}[{index}]", entry)
    for field in ("sourceRanges", "destinationRanges"):
        for cidr in _list(where, rule, field):
            try:
                network = ipaddress.ip_network(cidr, strict=False)
            except (TypeError, ValueError):
                raise FirewallError(f"{where}: {field} {cidr!r} is not a CIDR range") from None
            if network.version != 4:
                raise FirewallError(f"{where}: {field} {cidr}: only IPv4 is modelled")
    for field in ("sourceTags", "targetTags"):
        for tag in _list(where, rule, field):
            if not isinstance(tag, str) or not NAME_RE.match(tag):
                raise FirewallError(f"{where}: {field} {tag!r} must match {NAME_RE.pattern}")
    if direction == "EGRESS" and rule.get("sourceTags"):
        raise FirewallError(f"{where}: sourceTags apply to INGRESS rules only")
    if not isinstance(rule.get("disabled", False), bool):
        raise FirewallError(f"{where}: disabled must be true or false")


def _list(where: str, rule: dict, field: str) -> list:
    value = rule.get(field) or []
    if not isinstance(value, list):
        raise FirewallError(f"{where}: {field} must be a list, got {value!r}")
    return value


def _protocol(where: str, entry) -> tuple[str | None, list[str]]:
    """(what iptables -p takes, or None for all protocols; port specs as iptables writes them)."""
    if not isinstance(entry, dict) or "IPProtocol" not in entry:
        raise FirewallError(f"{where}: give {{IPProtocol: tcp, ports: ['22']}}, got {entry!r}")
    raw = str(entry["IPProtocol"]).lower()
    if raw.isdigit():
        if int(raw) > 255:
            raise FirewallError(f"{where}: protocol number {raw} must be within 0..255")
        protocol = NAMED_NUMBERS.get(str(int(raw)), str(int(raw)))
    elif raw in PROTOCOLS:
        protocol = PROTOCOLS[raw]
    else:
        raise FirewallError(
            f"{where}: protocol {raw!r} is not one of {sorted(PROTOCOLS)} or a number 0..255"
        )
    ports = entry.get("ports") or []
    if ports and protocol not in WITH_PORTS:
        raise FirewallError(f"{where}: ports apply to tcp, udp and sctp only, not {raw!r}")
    specs = []
    for port in ports:
        found = PORT_RE.match(str(port))
        low, high = (int(found[1]), int(found[2] or found[1])) if found else (-1, -1)
        if not (found and 0 <= low <= high <= 65535):
            raise FirewallError(f"{where}: port {port!r} must be N or N-M within 0..65535")
        specs.append(str(low) if low == high else f"{low}:{high}")
    return protocol, specs


# ---------------------------------------------------------------- rendering


def network_name(rule: dict) -> str:
    """The network a rule belongs to: the last part of its link (the API's default: default)."""
    link = str(rule.get("network") or f"global/networks/{DEFAULT_NETWORK}")
    return link.rstrip("/").rsplit("/", 1)[-1]


def applies(rule: dict, vm: dict) -> bool:
    """Whether the rule is in force on this VM: enabled, of its network, targeting it."""
    if rule.get("disabled") or network_name(rule) != vm.get("network", DEFAULT_NETWORK):
        return False
    targets = set(rule.get("targetTags") or [])
    return not targets or bool(targets & set(vm.get("tags") or []))


def evaluation_order(rules: list[dict]) -> list[dict]:
    """GCE's order: lower priority first; at equal priority a deny before an allow."""
    return sorted(
        rules,
        key=lambda r: (r.get("priority", DEFAULT_PRIORITY), 0 if r.get("denied") else 1, r["name"]),
    )


def _network_views(vm: dict) -> list[tuple[dict, str, str]]:
    """(the VM as seen on one of its networks, its ingress chain, its egress chain): the
    VM's own network (nic0's and the external path's) first, then its more_networks."""
    views = [(vm, INGRESS_CHAIN, EGRESS_CHAIN)]
    for index, (network, more) in enumerate(sorted((vm.get("more_networks") or {}).items()), 1):
        view = {**vm, "network": network, "nics": more["nics"], "peers": more.get("peers") or {}}
        views.append((view, f"{INGRESS_CHAIN}-{index}", f"{EGRESS_CHAIN}-{index}"))
    return views


def render(rules: list[dict], vm: dict) -> str:
    """iptables-restore input (for --noflush) that gives `vm` GCE's filtering for `rules`."""
    for rule in rules:
        check(rule)
    views = _network_views(vm)
    chains = [PREROUTING_CHAIN, POSTROUTING_CHAIN]
    chains += [chain for _view, ingress, egress in views for chain in (ingress, egress)]
    lines = ["*mangle", *(f":{chain} - [0:0]" for chain in chains)]
    for view, ingress, egress in views:
        for nic in view["nics"]:
            lines.append(f"-A {PREROUTING_CHAIN} -i {nic} -j {ingress}")
            lines.append(f"-A {POSTROUTING_CHAIN} -o {nic} -j {egress}")
    for _view, ingress, egress in views:
        for chain in (ingress, egress):
            lines.append(
                f"-A {chain} -m conntrack --ctstate ESTABLISHED,RELATED "
                f'-m comment --comment "stateful: replies" -j RETURN'
            )
    for view, ingress, egress in views:
        for rule in evaluation_order([r for r in rules if applies(r, view)] + IMPLIED):
            lines += _rule_lines(rule, view, ingress, egress)
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


def _rule_lines(
    rule: dict, vm: dict, ingress_chain: str = INGRESS_CHAIN, egress_chain: str = EGRESS_CHAIN
) -> list[str]:
    ingress = rule.get("direction", "INGRESS") == "INGRESS"
    chain = ingress_chain if ingress else egress_chain
    target = "DROP" if rule.get("denied") else "RETURN"
    sources = list(rule.get("sourceRanges") or [])
    destinations = list(rule.get("destinationRanges") or [])
    if ingress:
        tags = set(rule.get("sourceTags") or [])
        sources += sorted(
            f"{peer['address']}/32"
            for peer in (vm.get("peers") or {}).values()
            if tags & set(peer.get("tags") or [])
        )
        if not sources:
            if rule.get("sourceTags"):
                return []  # no VM carries the source tags: the rule matches nothing
            sources = ["0.0.0.0/0"]  # the API's default for an INGRESS rule
    comment = f'-m comment --comment "{rule["name"]} {rule.get("priority", DEFAULT_PRIORITY)}"'
    lines = []
    for entry in rule.get("allowed") or rule.get("denied"):
        protocol, ports = _protocol(rule["name"], entry)
        proto = f" -p {protocol}" if protocol else ""
        for source in _ranges(sources):
            for destination in _ranges(destinations):
                for port in ports or [None]:
                    dport = f" --dport {port}" if port else ""
                    lines.append(
                        f"-A {chain}{source and ' -s ' + source}"
                        f"{destination and ' -d ' + destination}{proto}{dport} {comment} "
                        f"-j {target}"
                    )
    return lines


def _ranges(cidrs: list[str]) -> list[str]:
    """Normalized ranges; "" for every address (0.0.0.0/0 or none given)."""
    normal = [str(ipaddress.ip_network(c, strict=False)) for c in cidrs]
    if not normal or "0.0.0.0/0" in normal:
        return [""]
    return list(dict.fromkeys(normal))


# ---------------------------------------------------------------- applying


# Restore the chains (stdin), then hook them into the built-in chains once.
APPLY_SCRIPT = (
    "iptables-restore -w --noflush\n"
    + "\n".join(
        f"iptables -w -t mangle -C {builtin} -j {ours} 2>/dev/null || "
        f"iptables -w -t mangle -I {builtin} 1 -j {ours}"
        for builtin, ours in HOOKS
    )
    + "\n"
)


def apply(container_name: str, script: str, deadline_s: float = APPLY_DEADLINE_S) -> None:
    """Load render()'s output into a VM container's iptables (docker exec)."""
    run(
        ["docker", "exec", "-i", container_name, "sh", "-ec", APPLY_SCRIPT],
        input_text=script,
        timeout=deadline_s,
    )


def vm_views(state: dict) -> dict[str, dict]:
    """Each node of a cluster state (state.json) as render() takes it, by container name."""
    network = state.get("network", DEFAULT_NETWORK)
    peers = {
        node["name"]: {"address": node["vpc_address"], "tags": list(node.get("tags") or [])}
        for node in state["nodes"]
    }
    views = {
        node["container"]: {
            "name": node["name"],
            "tags": list(node.get("tags") or []),
            "network": network,
            "nics": {node["nic"]: "vpc", node.get("external_nic", "ext0"): "external"},
            "peers": peers,
        }
        for node in state["nodes"]
    }
    # A GPU machine type's NICs on networks of their own (cluster.py's control_nics[1:] and
    # gpu_nics), but for the gib types' RDMA NICs (role rdma<i>): no firewall on RoCE VPCs.
    more = {}  # GCE network -> VM name -> its NIC there
    for node in state["nodes"]:
        for nic in [*node.get("control_nics", [])[1:], *node.get("gpu_nics", [])]:
            if not nic["network"].startswith(UNFILTERED_ROLE):
                more.setdefault(nic["gce_network"], {})[node["name"]] = nic
    for node in state["nodes"]:
        view = views[node["container"]]
        for gce_network, nics in more.items():
            if node["name"] in nics:
                others = {
                    name: {"address": nic["address"], "tags": peers[name]["tags"]}
                    for name, nic in nics.items()
                }
                view.setdefault("more_networks", {})[gce_network] = {
                    "nics": [nics[node["name"]]["name"]],
                    "peers": others,
                }
    return views


def enforce(state: dict, rules: list[dict], deadline_s: float = APPLY_DEADLINE_S) -> None:
    """Apply `rules` to every running VM of a cluster state at once, each within `deadline_s`;
    ClusterError naming every VM that failed. A stopped VM gets them when it starts
    (gce_control: a started VM's filter is set again)."""
    views = {c: vm for c, vm in vm_views(state).items() if is_running(c)}
    scripts = {container: render(rules, vm) for container, vm in views.items()}
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=min(8, len(scripts)) or 1) as pool:
        futures = {
            container: pool.submit(apply, container, script, deadline_s)
            for container, script in scripts.items()
        }
    problems = [
        f"{views[container]['name']} ({container}): {future.exception()}"
        for container, future in futures.items()
        if future.exception()
    ]
    if problems:
        raise ClusterError(
            f"firewall rules not applied ({time.monotonic() - started:.1f} s) on "
            + "; ".join(problems)
        )


def is_running(container_name: str) -> bool:
    found = run(["docker", "inspect", "-f", "{{.State.Running}}", container_name], check=False)
    return found.stdout.strip() == "true"


def show(container_name: str) -> str:
    """The VM's firewall chains as iptables lists them (for humans and tests)."""
    listing = "; ".join(f"iptables -w -t mangle -S {chain}" for chain in CHAINS)
    return run(["docker", "exec", container_name, "sh", "-ec", listing]).stdout
