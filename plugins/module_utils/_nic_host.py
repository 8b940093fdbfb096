# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Gather a host's network layout for nic.choose(): `ip -j`, sysfs, GCE metadata.

Standard library only (tools/gpu_check.py runs it where ansible-core is not installed); the
module given needs get_bin_path and run_command, as AnsibleModule has them."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import socket

from ansible_collections.hostnet.llamafactory.plugins.module_utils import (
    _network_profile as network_profile,
)
from ansible_collections.hostnet.llamafactory.plugins.module_utils._nic import (
    DEFAULT_EXCLUDE,
    NicError,
    choose,
    parse_links,
)

DMI_PRODUCT_NAME = "/sys/class/dmi/id/product_name"
# The read's options (primary_nic's, and node_facts' `nic`).
OPTIONS = dict(
    peer=dict(type="str"),
    interface=dict(type="str"),
    exclude=dict(type="list", elements="str", default=list(DEFAULT_EXCLUDE)),
    include_tunnels=dict(type="bool", default=False),
    gcp_metadata=dict(type="str", choices=["auto", "always", "never"], default="auto"),
    metadata_url=dict(type="str", default="http://metadata.google.internal/computeMetadata/v1"),
    metadata_timeout=dict(type="float", default=2.0),
    network_profile=dict(type="str", choices=list(network_profile.CHOICES), default="auto"),
    pci_slots_from_names=dict(type="bool", default=False),
)
SYS_NET = "/sys/class/net"
SYS_INFINIBAND = "/sys/class/infiniband"
# systemd's predictable name of a PCI NIC: enp<bus>s<slot>, f<function> when not 0 (decimal).
PCI_NAME_RE = re.compile(r"^enp([0-9]+)s([0-9]+)(?:f([0-9]+))?$")


def _read(path):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except (IOError, OSError):
        return None


def is_gce(dmi_path=DMI_PRODUCT_NAME):
    return _read(dmi_path) == "Google Compute Engine"


def sysfs_facts(names, root=SYS_NET):
    facts = {}
    for name in names:
        device = os.path.join(root, name, "device")
        driver_link = os.path.join(device, "driver")
        driver = os.path.basename(os.readlink(driver_link)) if os.path.islink(driver_link) else None
        speed = _read(os.path.join(root, name, "speed"))
        try:
            speed = int(speed) if speed is not None and int(speed) > 0 else None
        except ValueError:
            speed = None
        # The PCI address (0000:06:00.0) the device link ends in; none for virtual NICs.
        slot = os.path.basename(os.path.realpath(device)) if os.path.islink(device) else None
        facts[name] = {
            "driver": driver,
            "speed": speed,
            "pci_slot": slot,
            "rdma": os.path.isdir(os.path.join(device, "infiniband")),
        }
    return facts


def pci_slot_of_name(name):
    """The PCI address a systemd predictable name encodes (enp6s0 -> 0000:06:00.0, enp0s12 ->
    0000:00:0c.0, enp192s20 -> 0000:c0:14.0, enp6s0f1 -> 0000:06:00.1), or None for names of
    other shapes (gpu0rdma0, eth0, ens4) and numbers no PCI address holds."""
    found = PCI_NAME_RE.match(name or "")
    if not found:
        return None
    bus, slot, function = (int(found.group(i) or 0) for i in (1, 2, 3))
    if bus > 0xFF or slot > 0x1F or function > 7:
        return None
    return "0000:%02x:%02x.%d" % (bus, slot, function)


def with_pci_slots_from_names(sysfs, enabled):
    """sysfs facts where each NIC without a PCI device takes the PCI address its name encodes
    (when enabled: the local cluster's veth NICs, named as the GPU VM's NICs they stand in for).
    A real device's own address always wins; other names get none."""
    if not enabled:
        return sysfs
    for name, facts in sysfs.items():
        slot = pci_slot_of_name(name)
        if slot and not facts.get("pci_slot"):
            facts["pci_slot"] = slot
            facts["pci_slot_from_name"] = True
    return sysfs


def _open_url(url, headers, timeout, follow_redirects="none", use_proxy=False):
    """GET `url` with http.client: the metadata server is a link-local plain-HTTP server that
    answers directly (no proxy, no redirect, no TLS). ansible's urls would cost every node about
    0.1 s of CPU per call (its import and an SSL context per request) for three small answers.
    Anything but 200 raises, as open_url does with follow_redirects none."""
    del follow_redirects, use_proxy  # never followed, never proxied
    import http.client  # pylint: disable=import-outside-toplevel
    from urllib.parse import urlsplit  # pylint: disable=import-outside-toplevel

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError("not an http(s) URL: %s" % url)
    connection_class = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    connection = connection_class(parts.hostname, parts.port, timeout=timeout)
    path = parts.path + ("?" + parts.query if parts.query else "")
    connection.request("GET", path or "/", headers=headers)
    response = connection.getresponse()
    if response.status != 200:
        connection.close()
        raise IOError("HTTP Error %s: %s" % (response.status, response.reason))
    return response


def ask_metadata(url, timeout, opener=_open_url, keys=("ip", "mac")):
    """nic0's ip and mac (or the instance's keys given, e.g. machine-type) from the GCE metadata
    server, or {'error': ...}."""
    answer = {}
    for key in keys:
        path = key if key == "machine-type" else "network-interfaces/0/%s" % key
        target = "%s/instance/%s" % (url.rstrip("/"), path)
        try:
            response = opener(
                target,
                headers={"Metadata-Flavor": "Google"},
                timeout=timeout,
                follow_redirects="none",
                use_proxy=False,
            )
            flavor = response.headers.get("Metadata-Flavor")
            if flavor != "Google":
                return {
                    "error": "%s answered without the header Metadata-Flavor: Google "
                    "(got %r): not a GCE metadata server" % (target, flavor)
                }
            answer[key] = response.read().decode("utf-8", "replace").strip()
        # Any failure of the request is the answer: a timeout, a refusal, a bad status.
        except Exception as exc:  # noqa: BLE001  # pylint: disable=broad-except
            return {"error": "%s: %s" % (target, exc)}
    return answer


def resolve(peer):
    """An IPv4 address for `peer` (an address or a name)."""
    try:
        return socket.getaddrinfo(peer, None, socket.AF_INET)[0][4][0]
    except (socket.gaierror, IndexError) as exc:
        raise NicError(
            "peer %r does not resolve to an IPv4 address (%s): give the master's "
            "internal IP" % (peer, exc)
        ) from exc


def gather(module, params, opener=_open_url, dmi_path=DMI_PRODUCT_NAME):
    """(layout for nic.choose, resolved peer or None)."""
    ip = module.get_bin_path("ip", required=True)

    def run(args):
        rc, out, err = module.run_command([ip, *args])
        if rc != 0:
            raise NicError(
                "`ip %s` failed (%s): %s; this module needs iproute2 with JSON output "
                "(-j)" % (" ".join(args), rc, err.strip())
            )
        return out

    layout = {
        "ip_addr": run(["-j", "-d", "addr", "show"]),
        "route_default": run(["-j", "-4", "route", "show", "default"]),
        "route_peer": None,
        "route_peer_error": None,
        "infiniband": sorted(os.listdir(SYS_INFINIBAND)) if os.path.isdir(SYS_INFINIBAND) else [],
        "gce": is_gce(dmi_path),
        "metadata": None,
    }
    peer = resolve(params["peer"]) if params.get("peer") else None
    if peer:
        rc, out, err = module.run_command([ip, "-j", "route", "get", peer])
        if rc == 0:
            layout["route_peer"] = out
        else:
            layout["route_peer_error"] = err or out
    mode = params.get("gcp_metadata", "auto")
    wanted = mode == "always" or (
        mode == "auto" and layout["gce"] and not peer and not params.get("interface")
    )
    if wanted:
        layout["metadata"] = ask_metadata(
            params["metadata_url"], params["metadata_timeout"], opener
        )
    layout["sysfs"] = with_pci_slots_from_names(
        sysfs_facts([link["name"] for link in parse_links(layout["ip_addr"])]),
        params.get("pci_slots_from_names", False),
    )
    layout["machine_type"] = None
    # Not asked again of a server that just failed nic0's question: choose() reports that one.
    failed = "error" in (layout["metadata"] or {})
    # Asked for tcpxo and gib when set too (one that contradicts the machine type is refused);
    # not for socket, which any machine type can use.
    if (
        params.get("network_profile", "auto") != "socket"
        and not failed
        and (mode == "always" or (mode == "auto" and layout["gce"]))
    ):
        answer = ask_metadata(
            params["metadata_url"], params["metadata_timeout"], opener, keys=("machine-type",)
        )
        if "error" in answer and mode == "always" and params.get("network_profile") == "auto":
            raise NicError(
                "the GCE metadata server did not answer the machine type (%s): check "
                "metadata_url, or give network_profile (socket, tcpxo or gib) instead of auto"
                % answer["error"]
            )
        layout["machine_type"] = network_profile.machine_type_name(answer.get("machine-type"))
    return layout, peer


def profile_of(layout, chosen, requested):
    """The node's network profile: its name and why, its control and GPU NICs (every candidate
    with its reason), the problems found and what a rank needs (setup)."""
    profile, why = network_profile.choose_profile(requested, layout.get("machine_type"))
    sysfs = layout.get("sysfs") or {}
    nics = [
        dict(link, pci_slot=(sysfs.get(link["name"]) or {}).get("pci_slot"))
        for link in parse_links(layout["ip_addr"])
        if link["name"] != "lo"
    ]
    rdma = [name for name, facts in sorted(sysfs.items()) if facts.get("rdma")]
    try:
        found = network_profile.find_nics(
            profile, layout.get("machine_type"), nics, rdma, primary=chosen
        )
    except network_profile.ProfileError as exc:
        if requested != "auto":
            raise
        # Chosen from the machine type, not asked for: the VM lacks its GPU networks (it was
        # created without them). It still trains, over sockets; the finding says what is lost.
        found = network_profile.find_nics("socket", None, nics, primary=chosen)
        found["problems"] = [{"id": "gpu-nics-missing", "detail": str(exc)}]
        why = "%s calls for %s, but %s" % (why, profile, exc)
        profile = "socket"
    setup = network_profile.rank_setup(
        profile, chosen, found["control"], found["gpu"], machine_type=layout.get("machine_type")
    )
    return dict(
        found,
        profile=profile,
        why=why,
        machine_type=layout.get("machine_type"),
        setup=setup,
        nccl_network=network_profile.NCCL_NETWORKS[profile],
        expected=network_profile.expected_bandwidth(layout.get("machine_type"), profile),
    )


def discover(module, params, opener=_open_url):
    """primary_nic's result for `params` (its options): the NIC chosen, with its address, and the
    warnings found (`warnings_found`) for the module to give. Raises NicError."""
    layout, peer = gather(module, params, opener)
    result = choose(
        layout,
        interface=params.get("interface"),
        peer=peer,
        exclude=params.get("exclude"),
        include_tunnels=params.get("include_tunnels", False),
        use_metadata=params.get("gcp_metadata", "auto"),
    )
    try:
        result["network_profile"] = profile_of(
            layout, result["interface"], params.get("network_profile", "auto")
        )
    except network_profile.ProfileError as exc:
        raise NicError(str(exc)) from exc
    result["warnings_found"] = result.pop("warnings")
    return result
