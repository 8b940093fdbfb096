# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: network_report
short_description: Every node's network as discover_network found it, a few lines per node
version_added: 0.1.0
description:
  - From each node's C(primary_nic) fact (M(hostnet.llamafactory.primary_nic)) and its rank -
    where the node is reached, the NIC and address it trains on and how that NIC was found,
    MASTER_ADDR and C(NCCL_SOCKET_IFNAME), the default route, and every NIC with its IPv4
    addresses (loopback, Docker's and veth interfaces left out).
  - One task for the whole report, on the controller (C(playbooks/discover.yml)), not one per
    node.
options:
  _input:
    description: Node name to its C(primary_nic) fact.
    type: dict
    required: true
  ranks:
    description: Node name to its rank.
    type: dict
    required: true
  reached_at:
    description: Node name to the address Ansible reaches it at (C(ansible_host)); the node's
      name where empty.
    type: dict
    required: true
  master_addrs:
    description: Node name to the MASTER_ADDR it uses.
    type: dict
    required: true
  platform:
    description: C(llamafactory_platform).
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Show every node
  ansible.builtin.debug:
    msg: >-
      {{ nics | hostnet.llamafactory.network_report(ranks=ranks, reached_at=addresses,
         master_addrs=master_addrs, platform='gcp') }}
"""

RETURN = r"""
_value:
  description: Node name to its lines, in the order of the input.
  type: dict
"""

import re

SKIPPED_NICS = re.compile(r"^(lo|docker|veth|br-)")


def node_lines(nic, rank, reached_at, master_addr, platform):
    candidates = nic.get("candidates") or []
    default_nic = nic.get("default_route_interface") or ""
    default_addresses = next(
        (c.get("ipv4") or [] for c in candidates if c.get("name") == default_nic), []
    )
    shown = sorted(
        (c for c in candidates if not SKIPPED_NICS.match(c.get("name", ""))),
        key=lambda c: c.get("name", ""),
    )
    profile = nic.get("network_profile") or {}
    env = (profile.get("setup") or {}).get("env") or nic.get("nccl_env") or {}
    nccl_ifname = env.get("NCCL_SOCKET_IFNAME", "")
    lines = [
        "reached at %s, platform %s" % (reached_at, platform),
        "rank %s: trains on %s %s/%s mtu %s (found by %s), MASTER_ADDR %s, NCCL_SOCKET_IFNAME=%s"
        % (
            rank,
            nic.get("interface"),
            nic.get("address"),
            nic.get("prefix"),
            nic.get("mtu"),
            nic.get("method"),
            master_addr,
            nccl_ifname,
        ),
        "default route via %s"
        % (" ".join([default_nic, *default_addresses]) if default_nic else "none"),
        "NICs: "
        + ", ".join(
            "%s %s" % (c.get("name"), " ".join(c.get("ipv4") or []) or "no IPv4") for c in shown
        ),
    ]
    if profile.get("profile") and profile["profile"] != "socket":
        lines.append(
            "network profile %s (%s): control %s, GPU NICs %s"
            % (
                profile["profile"],
                profile.get("why"),
                ",".join(profile.get("control") or []),
                ",".join(profile.get("gpu") or []) or "none",
            )
        )
    elif profile.get("profile"):
        lines.append("network profile socket (%s)" % profile.get("why"))
    return lines


def network_report(nics, *, ranks, reached_at, master_addrs, platform):
    return dict(
        (
            host,
            node_lines(
                nic, ranks[host], reached_at.get(host) or host, master_addrs[host], platform
            ),
        )
        for host, nic in nics.items()
    )


class FilterModule(object):
    def filters(self):
        return {"network_report": network_report}
