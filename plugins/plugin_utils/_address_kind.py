# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What kind of address a MASTER_ADDR is (controller only, private).

V(bridge) for Docker's default bridge pools (172.17.0.0/16 to 172.31.0.0/16, the C(172.17.0.2)
of the classic failure), V(loopback), V(private) (RFC 1918, CGNAT, RFC 2544 test networks, ULA),
V(public) for addresses routed on the internet, V(other) for the rest, V(invalid) for anything
that is not an address.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ipaddress

BRIDGE = ipaddress.ip_network("172.16.0.0/12")
DOCKER_FIRST_POOL = ipaddress.ip_network("172.17.0.0/16")
PRIVATE = [
    ipaddress.ip_network(n)
    for n in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "198.18.0.0/15",
        "fc00::/7",
    )
]


def address_kind(value):
    try:
        address = ipaddress.ip_address(str(value).strip())
    except ValueError:
        return "invalid"
    if address.is_loopback:
        return "loopback"
    if address.version == 4 and address in BRIDGE and address >= DOCKER_FIRST_POOL[0]:
        return "bridge"
    if any(address in network for network in PRIVATE if network.version == address.version):
        return "private"
    if address.is_global:
        return "public"
    return "other"
