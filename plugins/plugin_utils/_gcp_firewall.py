# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gcp_firewall role's logic: which rules a cluster needs, how GCE's rules differ, and what a
failure of google.cloud's modules means.

Pure functions over plain data (the role's settings, the API's firewall resources, the modules'
failed results); the filters gcp_firewall_plan, gcp_firewall_drift and gcp_firewall_error call
them.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ast
import hashlib
import ipaddress
import re

MARKER = "hostnet.llamafactory"
API_LINK = "https://www.googleapis.com/compute/v1/"
ALL_PORTS = "0-65535"
SSH_PORT = 22
NAME_RE = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
PROJECT_RE = re.compile(r"^(?:[a-z][-a-z0-9.]*[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]$")
SUFFIXES = (("nodes", "-nodes"), ("ssh", "-ssh"))
CLUSTER_MAX = 63 - len("-nodes")
# The ranges a VPC subnet may use other than privately used public ones (Google, "Subnets",
# https://cloud.google.com/vpc/docs/subnets#valid-ranges): RFC 1918, shared address space (RFC
# 6598), IETF protocol assignments and documentation (RFC 6890, RFC 5737), 6to4 relay (RFC 7526),
# benchmarking (RFC 2544) and class E (RFC 5735). None is routed on the internet.
PRIVATE_NETWORKS = [
    ipaddress.ip_network(n)
    for n in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "192.88.99.0/24",
        "198.18.0.0/15",
        "240.0.0.0/4",
    )
]
VALID_RANGES_DOC = "https://cloud.google.com/vpc/docs/subnets#valid-ranges"
# Fields that widen or retarget a rule; the role sets some, the others must stay empty.
SCOPE_FIELDS = (
    "sourceRanges",
    "sourceTags",
    "targetTags",
    "sourceServiceAccounts",
    "targetServiceAccounts",
    "destinationRanges",
    "denied",
)
IMMUTABLE_FIELDS = ("network", "direction")
# NIC types of RDMA NICs (RoCE VPCs take MRDMA, Falcon VPCs IRDMA) and the name Google's
# blueprints give a RoCE VPC (DEPLOYMENT-rdma-net, network profile ZONE-vpc-roce): for a NIC
# without nicType (the local cluster's API omits it) the name is what marks the network.
RDMA_NIC_TYPES = ("MRDMA", "IRDMA")
RDMA_NETWORK_RE = re.compile(r"(?:^|-)(?:rdma|roce)(?:-|$)")
ROCE_DOC = "https://cloud.google.com/firewall/docs/firewall-for-roce"
NETWORK_RULE_MAX = 63
HASH_LENGTH = 8
IAM_HINT = (
    "Grant the identity roles/compute.securityAdmin on the project (or a role with "
    "compute.firewalls.create, get, list, update, delete, compute.networks.updatePolicy and "
    "compute.globalOperations.get), or use other credentials (llamafactory_gcp_auth_kind)."
)


class FirewallError(Exception):
    """Settings that cannot give a safe rule; the message names the variable and the fix."""


# -- the plan ---------------------------------------------------------------------------------


def _name(value, variable, limit=63):
    text = str(value or "").strip()
    if len(text) > limit or not NAME_RE.match(text):
        raise FirewallError(
            "%s is %r: use lowercase letters, digits and hyphens, starting with a letter, "
            "at most %d characters (GCE's naming rule)" % (variable, value, limit)
        )
    return text


def _int(value, variable, low, high):
    try:
        number = int(value)
        if str(number) != str(value).strip():
            raise ValueError(value)
    except (TypeError, ValueError):
        number = None
    if number is None or not low <= number <= high:
        raise FirewallError(
            "%s is %r: it must be an integer from %d to %d" % (variable, value, low, high)
        )
    return number


def _cidr(value, variable, what):
    """A source range, normalized; 0.0.0.0/0 and ::/0 (in any spelling) are refused."""
    try:
        network = ipaddress.ip_network(str(value).strip(), strict=False)
    except ValueError:
        raise FirewallError(
            "%s contains %r, which is not an address range (CIDR such as 10.128.0.0/20)"
            % (variable, value)
        ) from None
    if network.prefixlen == 0:
        raise FirewallError(
            "%s contains %s: refused. That source is the whole internet, and the rule would "
            "publish %s to it. Give the exact ranges that need it." % (variable, value, what)
        )
    return network


def _private(network):
    return network.version == 4 and any(network.subnet_of(p) for p in PRIVATE_NETWORKS)


def _network_of(interface):
    """An interface's network name: from the API's link, or from the {name, region, selfLink}
    the gcp_compute inventory makes of it."""
    link = interface.get("network")
    if isinstance(link, dict):
        return str(link.get("name") or str(link.get("selfLink") or "").rsplit("/", 1)[-1])
    return str(link or "").rsplit("/", 1)[-1]


def _addresses_on(interfaces, network):
    """The networkIP of each of a VM's interfaces on `network` (its name), or None when the
    interfaces are not known (an inventory without the API's data)."""
    if not isinstance(interfaces, (list, tuple)):
        return None
    found = []
    for interface in interfaces:
        if isinstance(interface, dict) and _network_of(interface) == network:
            found.append(str(interface.get("networkIP")))
    return found


# -- the rules for the nodes' other networks (a GPU machine type's VPCs) -----------------------


def _rule_prefix(cluster):
    """How every name of the cluster's per-network rules starts (CLUSTER-nodes, cut to leave
    room for a hash)."""
    return (cluster + "-nodes")[: NETWORK_RULE_MAX - 1 - HASH_LENGTH].rstrip("-")


def _hashed_name(cluster, network):
    digest = hashlib.sha256(network.encode("utf-8")).hexdigest()[:HASH_LENGTH]
    return "%s-%s" % (_rule_prefix(cluster), digest)


def network_rule_name(cluster, network):
    """The name of the rule for the nodes' NICs on `network`: CLUSTER-nodes-TAIL, TAIL the
    network's name less a leading CLUSTER- (a blueprint names its VPCs after its deployment:
    cluster gpufw, network gpufw-gpu0 -> gpufw-nodes-gpu0; network net-1 -> gpufw-nodes-net-1).
    When that is longer than GCE's 63 characters: CLUSTER-nodes cut to 54, a hyphen and the
    first 8 hex digits of the network name's SHA-256. Both depend on the two names only."""
    tail = network
    if network.startswith(cluster + "-") and len(network) > len(cluster) + 1:
        tail = network[len(cluster) + 1 :]
    name = "%s-nodes-%s" % (cluster, tail)
    if len(name) > NETWORK_RULE_MAX or not NAME_RE.match(name):
        return _hashed_name(cluster, network)
    return name


def list_regex(cluster):
    """An RE2 pattern that every rule name of the cluster matches (others may match too: the
    description's mark tells which are the cluster's)."""
    return "(?:%s-ssh|%s[-a-z0-9]*)" % (cluster, _rule_prefix(cluster))


def _rdma(network, nics):
    """Why `network` takes no VPC firewall rule (a RoCE or Falcon VPC), or None."""
    types = sorted(set(str(n.get("nicType") or "").upper() for n in nics) - set([""]))
    rdma = [t for t in types if t in RDMA_NIC_TYPES]
    if rdma:
        how = "its NICs are RDMA NICs (nicType %s)" % ", ".join(rdma)
    elif not types and RDMA_NETWORK_RE.search(network):
        how = "its name marks the RoCE VPC (DEPLOYMENT-rdma-net; the API gave no nicType)"
    else:
        return None
    return (
        "an RDMA VPC: %s. GCP takes no VPC firewall rules on a RoCE VPC; its ingress is allowed "
        "implicitly, and only a regional network firewall policy of type RDMA_ROCE_POLICY, which "
        "this role does not manage, filters it (%s)" % (how, ROCE_DOC)
    )


def _more_networks(primary, hosts, interfaces):
    """The networks other than `primary` on which the hosts have NICs, by the Compute Engine
    API: ({network: sorted /32 sources}, [{network, reason} skipped], notes, complete). complete:
    every host's NICs are known, so a rule for a network none of them uses is stale."""
    found, unknown = {}, []
    for host in hosts:
        nics = interfaces.get(host)
        if not isinstance(nics, (list, tuple)):
            unknown.append(host)
            continue
        for nic in nics:
            if not isinstance(nic, dict):
                continue
            network = _network_of(nic)
            if not network or network == primary:
                continue
            address = str(nic.get("networkIP") or "").strip()
            try:
                source = ipaddress.IPv4Network("%s/32" % address)
            except ValueError:
                raise FirewallError(
                    "the Compute Engine API gives %s the address %r on network %s, not an IPv4 "
                    "address (gcp_networkInterfaces): the rule for that network cannot name it"
                    % (host, nic.get("networkIP"), network)
                ) from None
            found.setdefault(network, {"sources": set(), "nics": []})
            found[network]["sources"].add(source)
            found[network]["nics"].append(nic)
    rules, skipped, notes = {}, [], []
    for network in sorted(found):
        reason = _rdma(network, found[network]["nics"])
        if reason:
            skipped.append({"network": network, "reason": reason})
            notes.append("network %s: no rule, %s" % (network, reason))
        else:
            rules[network] = [str(n) for n in sorted(found[network]["sources"])]
    if unknown and len(unknown) < len(hosts):
        notes.append(
            "the Compute Engine API's view of the NICs of %s is not known (host variable "
            "gcp_networkInterfaces, from the gcp_compute inventory): the rules for the nodes' "
            "other networks leave them out" % ", ".join(unknown)
        )
    return rules, skipped, notes, bool(hosts) and not unknown


def _list(value, variable):
    if value is None or value == "":
        return []
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise FirewallError("%s must be a list, not %r" % (variable, value))
    return list(value)


def description(cluster, role, network=None):
    what = {
        "nodes": "all TCP/UDP and ICMP between its training nodes",
        "ssh": "SSH to its training nodes from the admin ranges",
        "network": "all TCP/UDP and ICMP between its training nodes on network %s" % network,
    }[role]
    return "%s cluster %s: %s (role gcp_firewall)" % (MARKER, cluster, what)


def owned(resource, cluster):
    """Whether a rule carries this cluster's mark, i.e. the role made it."""
    return str(resource.get("description") or "").startswith("%s cluster %s:" % (MARKER, cluster))


def network_link(project, network):
    return "%sprojects/%s/global/networks/%s" % (API_LINK, project, network)


def _rule(plan, role, allowed, sources, target_tags, network=None):
    """A present rule: the module's options and the API resource they make. `network`: a rule
    of role "network", for the nodes' NICs on that network (named in plan["networks"])."""
    if network is None:
        name, text, network = plan["names"][role], description(plan["cluster"], role), None
    else:
        name, text = plan["networks"][network], description(plan["cluster"], role, network)
    params = {
        "name": name,
        "description": text,
        "direction": "INGRESS",
        "priority": plan["priority"],
        "network": {"selfLink": "global/networks/%s" % (network or plan["network"])},
        "allowed": [
            dict(ip_protocol=p, **({"ports": ports} if ports else {})) for p, ports in allowed
        ],
        "disabled": False,
    }
    want = {
        "name": name,
        "description": text,
        "direction": "INGRESS",
        "priority": plan["priority"],
        "network": network_link(plan["project"], network or plan["network"]),
        "allowed": [
            dict(IPProtocol=p, **({"ports": ports} if ports else {})) for p, ports in allowed
        ],
        "disabled": False,
    }
    for option, field, values in (
        ("source_ranges", "sourceRanges", sources.get("ranges")),
        ("source_tags", "sourceTags", sources.get("tags")),
        ("target_tags", "targetTags", target_tags),
    ):
        if values:
            params[option] = list(values)
            want[field] = list(values)
    rule = {"name": name, "role": role, "state": "present", "params": params, "want": want}
    if network:
        rule["network"] = network
    return rule


def plan(settings):
    """The rules one cluster needs, from the role's settings; FirewallError when unsafe or wrong.

    settings: state, cluster, project, network, priority, source (addresses | tag | ranges), tag,
    ranges, target_tags, ssh_source_ranges, master_port, nodes (host -> internal address or
    None) and interfaces (host -> the VM's networkInterfaces as the Compute Engine API lists them,
    from the gcp_compute inventory; None where unknown). Everything is checked here, before any
    API call.
    """
    state = settings.get("state") or "present"
    if state not in ("present", "absent"):
        raise FirewallError("gcp_firewall_state is %r: use present or absent" % state)
    cluster = _name(settings.get("cluster"), "gcp_firewall_cluster_name", CLUSTER_MAX)
    project = str(settings.get("project") or "").strip()
    if not project:
        raise FirewallError(
            "llamafactory_gcp_project is not set: set it to the ID of the GCP project that holds "
            "the "
            "VMs' VPC network (the host project for a shared VPC), or export GCP_PROJECT"
        )
    if not PROJECT_RE.match(project):
        raise FirewallError(
            "llamafactory_gcp_project is %r, which is not a GCP project ID (6 to 30 lowercase "
            "letters, "
            "digits and hyphens; the ID, not the project's name or number)" % project
        )
    result = {
        "state": state,
        "cluster": cluster,
        "project": project,
        "network": _name(settings.get("network"), "gcp_firewall_network"),
        "priority": _int(settings.get("priority", 1000), "gcp_firewall_priority", 0, 65535),
        "names": dict((role, cluster + suffix) for role, suffix in SUFFIXES),
        # The rules for the nodes' other networks (network -> rule name), the networks that get
        # none and why, and lines for the report.
        "networks": {},
        "skipped_networks": [],
        "notes": [],
        # gcp_compute_firewall_info's filter: every rule of the cluster (and maybe others)
        "list_filter": 'name eq "%s"' % list_regex(cluster),
        # whether rules of the cluster that the plan does not name are to be deleted
        "prune": state == "absent",
    }
    master_port = _int(settings.get("master_port", 29500), "llamafactory_master_port", 1, 65535)
    if state == "absent":
        result["rules"] = [
            {"name": result["names"][r], "role": r, "state": "absent"} for r, _suffix in SUFFIXES
        ]
        return result

    publish = "every port of the nodes, MASTER_PORT %d included" % master_port
    source = settings.get("source") or "addresses"
    target_tags = [
        _name(t, "gcp_firewall_target_tags")
        for t in _list(settings.get("target_tags"), "gcp_firewall_target_tags")
    ]
    if source == "addresses":
        nodes = settings.get("nodes") or {}
        if not nodes:
            raise FirewallError(
                "no training nodes: put the VMs in the inventory group llamafactory"
            )
        ranges = []
        for host in sorted(nodes):
            address = nodes[host]
            if not address:
                raise FirewallError(
                    "the internal address of %s is not known (discover_network_addresses): run "
                    "the role discover_network on the nodes first (train.yml does), or set "
                    "gcp_firewall_source to tag or ranges" % host
                )
            try:
                network = ipaddress.ip_network("%s/32" % str(address).strip())
            except ValueError:
                raise FirewallError(
                    "the internal address of %s is %r, not an IPv4 address (primary_nic.address)"
                    % (host, address)
                ) from None
            on_network = _addresses_on(
                (settings.get("interfaces") or {}).get(host), result["network"]
            )
            if on_network is not None and str(network.network_address) not in on_network:
                raise FirewallError(
                    "the training address of %s is %s (primary_nic), but its address on network "
                    "%s, which the rule is for, is %s (Compute Engine API): the nodes would train "
                    "over another network, which this rule does not open. Set "
                    "llamafactory_interface to the NIC on %s, or gcp_firewall_network to the "
                    "network of the NIC you chose"
                    % (
                        host,
                        address,
                        result["network"],
                        ", ".join(on_network) or "none",
                        result["network"],
                    )
                )
            if not _private(network):
                raise FirewallError(
                    "the internal address of %s is %s, not a private address (one of the ranges a "
                    "VPC subnet may use, %s): a rule from it would publish %s beyond the VPC. "
                    "Check primary_nic on %s (it must be the VPC NIC, not an external address)"
                    % (host, address, VALID_RANGES_DOC, publish, host)
                )
            ranges.append(network)
        sources = {"ranges": [str(n) for n in sorted(set(ranges))]}
    elif source == "ranges":
        ranges = []
        for value in _list(settings.get("ranges"), "gcp_firewall_ranges"):
            network = _cidr(value, "gcp_firewall_ranges", publish)
            if not _private(network):
                raise FirewallError(
                    "gcp_firewall_ranges contains %s, which is not a private IPv4 range: the "
                    "rule would publish %s beyond the cluster. Give the cluster's internal subnet "
                    "ranges (within 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10 or "
                    "the other ranges of %s)" % (value, publish, VALID_RANGES_DOC)
                )
            ranges.append(network)
        if not ranges:
            raise FirewallError(
                "gcp_firewall_source is ranges but gcp_firewall_ranges is empty: give the "
                "cluster's internal subnet ranges (for example the A3 GPU NICs' subnets)"
            )
        sources = {"ranges": [str(n) for n in sorted(set(ranges))]}
    elif source == "tag":
        if target_tags:
            raise FirewallError(
                "gcp_firewall_target_tags is for the addresses and ranges sources; with "
                "gcp_firewall_source tag the rule targets gcp_firewall_tag itself: unset it"
            )
        tag = _name(settings.get("tag") or cluster, "gcp_firewall_tag")
        sources = {"tags": [tag]}
        target_tags = [tag]
    else:
        raise FirewallError("gcp_firewall_source is %r: use addresses, tag or ranges" % source)

    protocols = [("tcp", [ALL_PORTS]), ("udp", [ALL_PORTS]), ("icmp", None)]
    rules = [_rule(result, "nodes", protocols, sources, target_tags)]

    ssh = []
    for value in _list(settings.get("ssh_source_ranges"), "gcp_firewall_ssh_source_ranges"):
        ssh.append(_cidr(value, "gcp_firewall_ssh_source_ranges", "SSH (port %d)" % SSH_PORT))
    if ssh:
        if master_port == SSH_PORT:
            raise FirewallError(
                "llamafactory_master_port is %d, the SSH port: the SSH rule would publish the "
                "rendezvous to gcp_firewall_ssh_source_ranges. Use another MASTER_PORT" % SSH_PORT
            )
        if len(set(n.version for n in ssh)) > 1:
            raise FirewallError(
                "gcp_firewall_ssh_source_ranges mixes IPv4 and IPv6 ranges; a GCE rule takes one "
                "family: keep one"
            )
        ssh_sources = {"ranges": [str(n) for n in sorted(set(ssh))]}
        rules.append(_rule(result, "ssh", [("tcp", [str(SSH_PORT)])], ssh_sources, target_tags))
    else:
        rules.append({"name": result["names"]["ssh"], "role": "ssh", "state": "absent"})

    # The nodes' other networks (a GPU machine type's VPCs): one rule each, from the nodes'
    # addresses there (network tags and gcp_firewall_ranges describe the primary network), to
    # the same targets; an RDMA VPC gets none.
    interfaces = settings.get("interfaces") or {}
    hosts = sorted(set(settings.get("nodes") or {}) | set(interfaces))
    more, skipped, notes, complete = _more_networks(result["network"], hosts, interfaces)
    names = dict((n, network_rule_name(cluster, n)) for n in more)
    alike = [n for n in names if list(names.values()).count(names[n]) > 1]
    for network in alike:  # two networks with one tail (x-gpu0 and gpu0 in cluster x): hashed
        names[network] = _hashed_name(cluster, network)
    result.update(networks=names, skipped_networks=skipped, notes=notes, prune=complete)
    for network in sorted(more):
        sources = {"ranges": more[network]}
        rules.append(_rule(result, "network", protocols, sources, target_tags, network))
    result["rules"] = rules
    return result


# -- drift ------------------------------------------------------------------------------------


def _network_path(value):
    text = str(value or "")
    for prefix in (API_LINK, "https://compute.googleapis.com/compute/v1/"):
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text


def _allowed_set(entries):
    return set(
        (str(e.get("IPProtocol", "")).lower(), tuple(sorted(str(p) for p in e.get("ports") or [])))
        for e in entries or []
    )


def _show(values):
    return ", ".join(sorted(values)) or "nothing"


def _show_allowed(items):
    return _show("%s:%s" % (protocol, ",".join(ports) or "all") for protocol, ports in items)


def _what_it_allows(want):
    """A rule in one line: 'allow tcp:all, udp:all from 10.0.0.2/32 on network default'."""
    sources = list(want.get("sourceRanges") or []) + [
        "tag %s" % t for t in want.get("sourceTags") or []
    ]
    text = "allow %s from %s on network %s" % (
        _show_allowed(_allowed_set(want.get("allowed"))),
        ", ".join(sources) or "nowhere",
        str(want.get("network", "")).rsplit("/", 1)[-1],
    )
    if want.get("targetTags"):
        text += " to tags %s" % ", ".join(want["targetTags"])
    return text


def _ranges_set(values):
    result = set()
    for value in values or []:
        try:
            result.add(str(ipaddress.ip_network(str(value), strict=False)))
        except ValueError:
            result.add(str(value))
    return result


def _module_differs(request, response):
    """gcp_compute_firewall's is_different (google.cloud's GcpRequest): whether it would PATCH.

    It compares only fields that both sides hold; a list matches when every requested item has
    an equal item in the response, so entries that were added to a rule go unnoticed.
    """
    keys = [k for k in request if k in response and k != "name"]
    return any(_value_differs(request[k], response[k]) for k in keys)


def _value_differs(req, resp):
    if resp is None:
        return False
    if isinstance(req, list):
        resp = resp if isinstance(resp, list) else [resp]
        return any(all(_value_differs(item, r) for r in resp) for item in req)
    if isinstance(req, dict):
        resp = resp if isinstance(resp, dict) else {}
        return any(_value_differs(v, resp.get(k)) for k, v in req.items())
    if isinstance(req, bool):
        return str(req).lower() != str(resp).lower()
    return str(req) != str(resp)


def compare(want, current):
    """(action, changes): how a rule the role made differs from the wanted one.

    action: none; update (the module's PATCH fixes it); narrow (entries were added, which the
    module does not see: the role makes it rewrite the rule); replace (a field that cannot change
    in place, or a scope the role does not set: delete and create).
    """
    changes, replace = [], False
    for field in IMMUTABLE_FIELDS:
        have = current.get(field, "INGRESS" if field == "direction" else None)
        if field == "network":
            same = _network_path(have) == _network_path(want[field])
        else:
            same = str(have) == str(want[field])
        if not same:
            replace = True
            changes.append(
                "%s: %s, wanted %s (fixed at creation: the rule is replaced)"
                % (field, have, want[field])
            )
    for field in SCOPE_FIELDS:
        have = current.get(field) or []
        if field in ("sourceRanges", "destinationRanges"):
            have_set, want_set = _ranges_set(have), _ranges_set(want.get(field))
        elif field == "denied":
            have_set, want_set = set(str(e) for e in have), set()
        else:
            have_set, want_set = (
                set(str(v) for v in have),
                set(str(v) for v in want.get(field) or []),
            )
        if have_set == want_set:
            continue
        if field not in want:
            replace = True
            changes.append(
                "%s: %s, wanted none (a scope the role does not set: the rule is replaced)"
                % (field, _show(have_set))
            )
            continue
        parts = []
        if want_set - have_set:
            parts.append("add %s" % _show(want_set - have_set))
        if have_set - want_set:
            parts.append("remove %s" % _show(have_set - want_set))
        changes.append("%s: %s" % (field, "; ".join(parts)))
    have_allowed, want_allowed = _allowed_set(current.get("allowed")), _allowed_set(want["allowed"])
    if have_allowed != want_allowed:
        parts = []
        if want_allowed - have_allowed:
            parts.append("add %s" % _show_allowed(want_allowed - have_allowed))
        if have_allowed - want_allowed:
            parts.append("remove %s" % _show_allowed(have_allowed - want_allowed))
        changes.append("allowed: %s" % "; ".join(parts))
    for field, default in (("priority", 1000), ("description", ""), ("disabled", False)):
        have = current.get(field, default)
        if str(have) != str(want[field]):
            changes.append("%s: %s, wanted %s" % (field, have, want[field]))
    if not changes:
        return "none", []
    if replace:
        return "replace", changes
    return ("update" if _module_differs(want, current) else "narrow"), changes


LABELS = {
    "none": "no change",
    "create": "create",
    "update": "update",
    "narrow": "update, in two writes",
    "replace": "replace (delete, then create)",
    "delete": "delete",
    "foreign": "left alone",
}


def drift(planned, resources):
    """What the role would do to each planned rule, given the rules GCE holds (the list call's)."""
    existing = dict((r.get("name"), r) for r in resources or [])
    rules, foreign = [], []
    for rule in planned["rules"]:
        current = existing.get(rule["name"])
        entry = dict(rule, action="none", changes=[])
        if current is not None and not owned(current, planned["cluster"]):
            mark = "not made by this role (no mark of cluster %s): left alone" % planned["cluster"]
            entry.update(action="foreign", changes=[mark])
            foreign.append(rule["name"])
        elif rule["state"] == "absent":
            if current is not None:
                entry.update(action="delete", changes=["delete the rule"])
        elif current is None:
            entry.update(action="create", changes=[_what_it_allows(rule["want"])])
        else:
            entry["action"], entry["changes"] = compare(rule["want"], current)
        rules.append(entry)
    if planned.get("prune"):
        # The cluster's other rules (its mark, a name of its pattern): rules for networks that
        # its nodes no longer use, or every rule of the cluster when the state is absent.
        pattern = re.compile(list_regex(planned["cluster"]))
        named = set(r["name"] for r in planned["rules"])
        for name in sorted(existing):
            current = existing[name]
            if name in named or not pattern.fullmatch(str(name)):
                continue
            if not owned(current, planned["cluster"]):
                continue
            why = "delete the rule"
            if planned["state"] == "present":
                why = (
                    "delete the rule: no node has a NIC on its network %s now"
                    % str(current.get("network", "")).rsplit("/", 1)[-1]
                )
            rules.append(
                {
                    "name": name,
                    "role": "network",
                    "state": "absent",
                    "action": "delete",
                    "changes": [why],
                    "stale": planned["state"] == "present",
                }
            )
    changed = any(r["action"] not in ("none", "foreign") for r in rules)
    summary = []
    for entry in rules:
        line = "%s: %s" % (entry["name"], LABELS[entry["action"]])
        if entry["changes"] and (entry["action"] != "delete" or entry.get("stale")):
            line += " (%s)" % "; ".join(entry["changes"])
        summary.append(line)
    summary.extend(planned.get("notes") or [])
    return {"rules": rules, "changed": changed, "foreign": foreign, "summary": summary}


# -- errors -----------------------------------------------------------------------------------


def _google_error(msg):
    """(code, message, reason) from the module's "GCP returned error: {...}" message, or None."""
    text = msg if isinstance(msg, str) else repr(msg)
    start = text.find("{")
    if "GCP returned error" not in text or start < 0:
        return None
    try:
        body = ast.literal_eval(text[start:])
    except (ValueError, SyntaxError):
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None
    reasons = [e.get("reason") for e in error.get("errors") or [] if isinstance(e, dict)]
    for detail in error.get("details") or []:
        if isinstance(detail, dict) and detail.get("reason"):
            reasons.append(detail["reason"])
    return error.get("code"), str(error.get("message", "")), [r for r in reasons if r]


def permission_for(method, url):
    """The IAM permission that a Compute Engine firewall call needs."""
    path = str(url or "").split("?", 1)[0]
    if "/global/operations/" in path:
        return "compute.globalOperations.get"
    if path.rstrip("/").endswith("/global/firewalls"):
        return "compute.firewalls.create" if method == "POST" else "compute.firewalls.list"
    return {
        "GET": "compute.firewalls.get",
        "PATCH": "compute.firewalls.update",
        "DELETE": "compute.firewalls.delete",
    }.get(str(method).upper(), "compute.firewalls.*")


def explain(result, context):
    """A clear message for a failed google.cloud module result.

    context: project, network, rule (its name), call (list | present | absent), auth_kind,
    deadline (seconds), python (the controller's Python).
    """
    result = result or {}
    failed = [r for r in result.get("results") or [] if isinstance(r, dict) and r.get("failed")]
    if failed:  # a loop: the first item that failed
        result, item = failed[0], failed[0].get("item")
        if isinstance(item, dict) and item.get("name") and not context.get("rule"):
            context = dict(context, rule="the firewall rule %s" % item["name"])
        if isinstance(item, dict) and item.get("network"):  # a rule for another network
            context = dict(context, network=item["network"])
    msg = result.get("msg", "")
    text = msg if isinstance(msg, str) else repr(msg)
    stderr = str(result.get("module_stderr") or "")
    project, network = context.get("project"), context.get("network")
    rule = context.get("rule") or "the firewall rules"
    doing = {"list": "reading", "present": "writing", "absent": "deleting"}.get(
        context.get("call"), "changing"
    )
    if result.get("deadline_exceeded"):
        return (
            "Compute Engine did not finish %s %s within gcp_firewall_operation_timeout (%s s), and "
            "the module was stopped. GCP may still complete the operation: run the role again to "
            "converge, or raise gcp_firewall_operation_timeout."
            % (doing, rule, context.get("deadline"))
        )
    error = _google_error(msg)
    if error:
        code, message, reasons = error
        if code == 403 and (
            set(reasons) & set(["accessNotConfigured", "SERVICE_DISABLED"])
            or "has not been used" in message
        ):
            return (
                "The Compute Engine API is not enabled in project %s (Google: %s). Enable "
                "compute.googleapis.com there, or check llamafactory_gcp_project."
                % (project, message)
            )
        if code == 403:
            found = re.search(r"Required '([\w.]+)' permission", message)
            request = result.get("request") or {}
            permission = (
                found.group(1)
                if found
                else permission_for(request.get("method"), request.get("url"))
            )
            return (
                "Permission denied: the credentials (llamafactory_gcp_auth_kind=%s) lack %s in "
                "project "
                "%s, needed for %s %s (Google: %s). %s"
                % (context.get("auth_kind"), permission, project, doing, rule, message, IAM_HINT)
            )
        if code == 404:
            found = re.search(r"The resource '([^']+)' was not found", message)
            resource = found.group(1) if found else ""
            if re.match(r"^projects/[^/]+$", resource):
                return (
                    "Project %s was not found (Google: %s). Set llamafactory_gcp_project to the "
                    "ID of "
                    "an existing project that the credentials can see."
                    % (resource.split("/")[1], message)
                )
            if "/global/networks/" in resource:
                return (
                    "The VPC network %s (gcp_firewall_network=%s) was not found in project %s "
                    "(Google: %s). Set gcp_firewall_network to the network of the VMs' training "
                    "NICs (gcloud compute networks list shows the project's networks)."
                    % (resource.rsplit("/", 1)[-1], network, project, message)
                )
            return "Compute Engine answered 404 while %s %s: %s" % (doing, rule, message)
        if code == 409:
            return (
                "The firewall rule %s already exists: something created it between the role's read "
                "and its write (Google: %s). Run the role again." % (rule, message)
            )
        if code == 401:
            return (
                "Compute Engine rejected the credentials (llamafactory_gcp_auth_kind=%s): %s. "
                "Renew "
                "the access token or check the credentials." % (context.get("auth_kind"), message)
            )
        if code == 400:
            return "Compute Engine refused %s as invalid: %s" % (rule, message)
        return "Compute Engine answered HTTP %s while %s %s: %s" % (code, doing, rule, message)
    both = text + "\n" + stderr
    if context.get("call") == "list" and "'NoneType' object has no attribute 'get'" in both:
        # gcp_compute_firewall_info crashes when its list call answers 404: no such project.
        return (
            "Project %s was not found: listing its firewall rules answered 404. Set "
            "llamafactory_gcp_project to the ID of an existing project that the credentials can "
            "see." % project
        )
    if "install the google-auth library" in both or "install the requests library" in both:
        return (
            "The google.cloud modules need the Python packages google-auth and requests in the "
            "controller's Python (%s): pip install google-auth requests, or set "
            "gcp_firewall_python to a Python that has them." % context.get("python")
        )
    if "DefaultCredentialsError" in both or "default credentials were not found" in both:
        return (
            "No application default credentials on the controller: run gcloud auth "
            "application-default login, or set llamafactory_gcp_auth_kind to serviceaccount (with "
            "llamafactory_gcp_service_account_file) or accesstoken (with "
            "llamafactory_gcp_access_token)."
        )
    if "necessary fields need to refresh the access token" in both or "RefreshError" in both:
        # google-auth got 401 and cannot refresh: an expired or wrong token, revoked credentials
        return (
            "Compute Engine rejected the credentials (llamafactory_gcp_auth_kind=%s) and they "
            "cannot "
            "be refreshed: renew llamafactory_gcp_access_token (gcloud auth print-access-token) or "
            "check the credentials. %s" % (context.get("auth_kind"), text)
        )
    if "Unable to read service_account_file" in both:
        return "%s: check llamafactory_gcp_service_account_file." % text
    if re.search(
        r"ConnectionError|ProxyError|SSLError|Max retries exceeded|NewConnectionError", both
    ):
        return (
            "The controller could not reach the Compute Engine API (compute.googleapis.com) while "
            "%s %s: check its network, proxy (HTTPS_PROXY) and CA settings. %s"
            % (doing, rule, (stderr.strip().splitlines() or [text])[-1])
        )
    return "google.cloud's module failed while %s %s: %s" % (doing, rule, text)
