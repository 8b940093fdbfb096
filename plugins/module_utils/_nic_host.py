# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Gather a host's network layout for nic.choose(): `ip -j`, sysfs, GCE metadata."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import socket

from ansible.module_utils.common.text.converters import to_text
from ansible_collections.hostnet.llamafactory.plugins.module_utils._nic import (
    DEFAULT_EXCLUDE,
    NicError,
    choose,
    parse_links,
)

DMI_PRODUCT_NAME = "/sys/class/dmi/id/product_name"
# The read's options (primary_nic's, and node_survey's `nic`).
OPTIONS = dict(
    peer=dict(type="str"),
    interface=dict(type="str"),
    exclude=dict(type="list", elements="str", default=list(DEFAULT_EXCLUDE)),
    include_tunnels=dict(type="bool", default=False),
    gcp_metadata=dict(type="str", choices=["auto", "always", "never"], default="auto"),
    metadata_url=dict(type="str", default="http://metadata.google.internal/computeMetadata/v1"),
    metadata_timeout=dict(type="float", default=2.0),
)
SYS_NET = "/sys/class/net"
SYS_INFINIBAND = "/sys/class/infiniband"


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
        driver_link = os.path.join(root, name, "device", "driver")
        driver = os.path.basename(os.readlink(driver_link)) if os.path.islink(driver_link) else None
        speed = _read(os.path.join(root, name, "speed"))
        try:
            speed = int(speed) if speed is not None and int(speed) > 0 else None
        except ValueError:
            speed = None
        facts[name] = {"driver": driver, "speed": speed}
    return facts


def _open_url(*args, **kwargs):
    # Imported only where the metadata server is asked: ansible's urls (http, ssl, email)
    # cost every other call of primary_nic about 0.05 s of CPU on the node.
    from ansible.module_utils.urls import open_url

    return open_url(*args, **kwargs)


def ask_metadata(url, timeout, opener=_open_url):
    """nic0's ip and mac from the GCE metadata server, or {'error': ...}."""
    answer = {}
    for key in ("ip", "mac"):
        target = "%s/instance/network-interfaces/0/%s" % (url.rstrip("/"), key)
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
            answer[key] = to_text(response.read()).strip()
        # Any failure of the request is the answer: a timeout, a refusal, a bad status.
        except Exception as exc:  # noqa: BLE001  # pylint: disable=broad-except
            return {"error": "%s: %s" % (target, to_text(exc))}
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
    layout["sysfs"] = sysfs_facts([link["name"] for link in parse_links(layout["ip_addr"])])
    return layout, peer


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
    result["warnings_found"] = result.pop("warnings")
    return result
