# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Choose the NIC that NCCL and Gloo must use, from a host's network layout.

Pure functions: the layout (raw `ip -j` output, sysfs facts, GCE metadata answers) is gathered by
the primary_nic module; everything here is testable with captured output.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fnmatch
import ipaddress
import json

from ansible_collections.hostnet.llamafactory.plugins.module_utils import (
    _network_profile as network_profile,
)

DEFAULT_EXCLUDE = [
    "lo",
    "docker*",
    "br-*",
    "veth*",
    "virbr*",
    "cni*",
    "flannel*",
    "cali*",
    "vxlan*",
    "cilium*",
    "kube-*",
    "weave*",
    "tun*",
    "tap*",
    "wg*",
]
TUNNEL_PATTERNS = ["tun*", "tap*", "wg*"]
BRIDGE_PATTERNS = ["docker*", "br-*", "virbr*", "cni*", "veth*"]
PRIVATE_NETWORKS = [
    ipaddress.ip_network(n)
    for n in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",  # RFC 1918
        "100.64.0.0/10",  # shared address space (carrier-grade NAT)
        "198.18.0.0/15",  # network tests, used by the local cluster
    )
]


class NicError(Exception):
    """A choice that cannot be made; the message names the fix."""


def _matches(name, patterns):
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def parse_links(ip_addr_json):
    """`ip -j -d addr show` -> list of dicts: name, up, operstate, mtu, mac, kind, ipv4, ipv6."""
    links = []
    for raw in json.loads(ip_addr_json or "[]"):
        flags = raw.get("flags", [])
        info = raw.get("linkinfo") or {}
        addrs = raw.get("addr_info", [])
        links.append(
            {
                "name": raw["ifname"],
                "up": "UP" in flags and raw.get("operstate") != "DOWN",
                "operstate": raw.get("operstate", "UNKNOWN"),
                "mtu": raw.get("mtu"),
                "mac": (raw.get("address") or "").lower(),
                "kind": info.get("info_kind"),
                "ipv4": [(a["local"], a["prefixlen"]) for a in addrs if a.get("family") == "inet"],
                "ipv6": [
                    (a["local"], a["prefixlen"])
                    for a in addrs
                    if a.get("family") == "inet6" and a.get("scope") == "global"
                ],
            }
        )
    return links


def parse_route(route_json):
    """The first route of `ip -j route get|show ...`, or None."""
    routes = json.loads(route_json or "[]")
    return routes[0] if routes else None


def is_private(address):
    ip = ipaddress.ip_address("%s" % address)
    return any(ip in network for network in PRIVATE_NETWORKS)


def _describe(link):
    addresses = ["%s/%s" % a for a in link["ipv4"]] or ["no IPv4"]
    state = "" if link["up"] else ", down"
    return "%s (%s%s)" % (link["name"], ", ".join(addresses), state)


def _nic_list(links):
    return ", ".join(_describe(link) for link in links if link["name"] != "lo") or "none"


def _usable(link, exclude):
    """Why `link` cannot carry training traffic, or None when it can."""
    if link["name"] == "lo":
        return "loopback"
    if _matches(link["name"], exclude):
        return "excluded by name (virtual, bridge or tunnel interface)"
    if not link["up"]:
        return "down (operstate %s)" % link["operstate"]
    if not link["ipv4"]:
        return "no IPv4 address"
    return None


def choose(
    layout, interface=None, peer=None, exclude=None, include_tunnels=False, use_metadata="auto"
):
    """Pick the training NIC.

    layout: dict with ip_addr (raw `ip -j -d addr show`), route_default (raw
    `ip -j -4 route show default`), route_peer (raw `ip -j route get PEER`, or None),
    route_peer_error (stderr when that failed), sysfs ({name: {driver, speed}}),
    infiniband (list of RDMA device names), gce (bool), metadata (None when not asked, else
    {ip, mac} or {error}).
    Returns the module's result; raises NicError naming the fix.
    """
    exclude = list(DEFAULT_EXCLUDE if exclude is None else exclude)
    if include_tunnels:
        exclude = [p for p in exclude if p not in TUNNEL_PATTERNS]
    links = parse_links(layout["ip_addr"])
    by_name = dict((link["name"], link) for link in links)
    warnings = []
    metadata = layout.get("metadata")
    default_route = parse_route(layout.get("route_default"))
    default_dev = default_route.get("dev") if default_route else None

    if interface:
        method = "override"
        if interface not in by_name:
            raise NicError(
                "interface %r does not exist on this host. Its NICs: %s. Set the "
                "interface to one of them, or leave it unset so that the route to "
                "the peer decides." % (interface, _nic_list(links))
            )
        chosen = by_name[interface]
        if not chosen["up"]:
            raise NicError(
                "interface %r is down (operstate %s): bring it up (ip link set %s "
                "up) or set the interface to one that is up: %s"
                % (interface, chosen["operstate"], interface, _nic_list(links))
            )
    elif peer:
        method = "peer route"
        chosen = _by_peer_route(layout, peer, links, by_name, exclude)
    else:
        chosen, method = _without_peer(
            layout, links, by_name, exclude, metadata, default_dev, warnings, use_metadata
        )

    if not chosen["ipv4"]:
        v6 = ", ".join("%s/%s" % a for a in chosen["ipv6"]) or "none"
        raise NicError(
            "interface %r has no IPv4 address (global IPv6: %s); NCCL and Gloo "
            "bootstrap over IPv4 here. Choose a NIC with IPv4: %s"
            % (chosen["name"], v6, _nic_list(links))
        )
    address, prefix = chosen["ipv4"][0]
    if method == "peer route":
        src = (parse_route(layout.get("route_peer")) or {}).get("prefsrc")
        if src and any(src == a for a, _p in chosen["ipv4"]):
            address, prefix = src, dict(chosen["ipv4"])[src]

    if metadata and metadata.get("mac") and method != "metadata":
        nic0 = next((lk for lk in links if lk["mac"] == metadata["mac"].lower()), None)
        if nic0 is not None and nic0["name"] != chosen["name"]:
            warnings.append(
                "GCE metadata names %s (nic0, %s) but %s chose %s"
                % (nic0["name"], metadata.get("ip"), method, chosen["name"])
            )

    candidates = []
    for link in links:
        reason = _usable(link, exclude)
        if link["name"] == chosen["name"]:
            reason = None
        elif reason is None:
            reason = "not chosen: %s" % _not_chosen_reason(method)
        candidates.append(
            {"name": link["name"], "ipv4": ["%s/%s" % a for a in link["ipv4"]], "rejected": reason}
        )

    sysfs = (layout.get("sysfs") or {}).get(chosen["name"], {})
    infiniband = sorted(layout.get("infiniband") or [])
    nccl_env = network_profile.socket_env(chosen["name"])
    if not infiniband:
        nccl_env["NCCL_IB_DISABLE"] = "1"
    network = ipaddress.ip_interface("%s/%s" % (address, prefix)).network
    return {
        "interface": chosen["name"],
        "address": address,
        "prefix": prefix,
        "network": str(network),
        "mtu": chosen["mtu"],
        "mac": chosen["mac"],
        "driver": sysfs.get("driver"),
        "speed_mbps": sysfs.get("speed"),
        "method": method,
        "private": is_private(address),
        "default_route_interface": default_dev,
        "gce": bool(layout.get("gce")),
        "metadata": metadata,
        "peer": peer,
        "candidates": candidates,
        "infiniband": infiniband,
        "nccl_env": nccl_env,
        "warnings": warnings,
    }


def _not_chosen_reason(method):
    return {
        "override": "another interface was set",
        "peer route": "the peer is not routed through it",
        "metadata": "GCE metadata names another NIC as nic0",
        "default route": "the default route uses another NIC",
        "sole candidate": "another NIC was the only usable one",
    }[method]


def _by_peer_route(layout, peer, links, by_name, exclude):
    route = parse_route(layout.get("route_peer"))
    if route is None:
        error = (layout.get("route_peer_error") or "no route").strip()
        raise NicError(
            "peer %s is unreachable from this host (ip route get: %s). Check that it "
            "is the master node's internal address and that the nodes share a "
            "network (VPC)." % (peer, error)
        )
    if route.get("type") == "unreachable" or route.get("type") == "prohibit":
        raise NicError(
            "peer %s is unreachable from this host (route type %s). Check that it is "
            "the master node's internal address." % (peer, route.get("type"))
        )
    dev = route.get("dev")
    if dev == "lo":
        # The peer is one of this host's own addresses: the NIC that holds it.
        owner = next((lk for lk in links if any(a == peer for a, _p in lk["ipv4"])), None)
        if owner is None:
            raise NicError(
                "peer %s is a local address of this host but no NIC holds it; set "
                "the interface explicitly" % peer
            )
        return owner
    if _matches(dev, BRIDGE_PATTERNS):
        raise NicError(
            "peer %s routes through %s, a Docker/virtual bridge: it is a container "
            "address that only this host can reach. Use the master VM's internal IP "
            "as MASTER_ADDR (not a container's 172.17.x address) and run the training "
            "containers with host networking." % (peer, dev)
        )
    if dev not in by_name:
        raise NicError("peer %s routes through %s, which `ip addr` does not list" % (peer, dev))
    if _matches(dev, exclude):
        raise NicError(
            "peer %s routes through %s, which is excluded (tunnel/VPN or virtual). "
            "If the nodes really talk over it, set include_tunnels: true or "
            "interface: %s; otherwise fix the route to the peer." % (peer, dev, dev)
        )
    return by_name[dev]


def _without_peer(layout, links, by_name, exclude, metadata, default_dev, warnings, use_metadata):
    if metadata and metadata.get("mac"):
        nic0 = next((lk for lk in links if lk["mac"] == metadata["mac"].lower()), None)
        if nic0 is not None:
            if default_dev and default_dev != nic0["name"]:
                warnings.append(
                    "the default route uses %s, GCE metadata names %s as nic0; "
                    "using %s" % (default_dev, nic0["name"], nic0["name"])
                )
            return nic0, "metadata"
        message = "GCE metadata names MAC %s (nic0, %s) but no NIC here has it" % (
            metadata["mac"],
            metadata.get("ip"),
        )
        if use_metadata == "always":
            raise NicError(message + ": set the interface explicitly")
        warnings.append(message + "; using the default route")
    elif metadata and metadata.get("error"):
        if use_metadata == "always":
            raise NicError(
                "the GCE metadata server did not answer (%s): check metadata_url, or "
                "set gcp_metadata: auto or never" % metadata["error"]
            )
        warnings.append(
            "the GCE metadata server did not answer (%s); using the default route"
            % metadata["error"]
        )

    if default_dev is None:
        raise NicError(
            "this host has no IPv4 default route and no peer was given: set peer "
            "(the master node's internal address) or the interface. NICs: %s" % _nic_list(links)
        )
    if default_dev in by_name and _usable(by_name[default_dev], exclude) is None:
        return by_name[default_dev], "default route"
    usable = [lk for lk in links if _usable(lk, exclude) is None]
    if len(usable) == 1:
        warnings.append(
            "the default route uses %s (excluded or unusable); %s is the only "
            "usable NIC" % (default_dev, usable[0]["name"])
        )
        return usable[0], "sole candidate"
    raise NicError(
        "the default route uses %s, which is excluded or unusable, and %s usable "
        "NICs remain (%s): set peer (the master node's internal address) or the "
        "interface"
        % (default_dev, len(usable) or "no", ", ".join(_describe(lk) for lk in usable) or "none")
    )
