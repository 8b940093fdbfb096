# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: preflight_targets
short_description: What one node's preflight probe must reach
version_added: 0.1.0
description:
  - Every other node's training address (its discovered primary NIC) on the probe's high port,
    and MASTER_ADDR:MASTER_PORT unless the node is the master.
  - Every option but the input is given by name.
options:
  _input:
    description: This node's inventory name.
    type: str
    required: true
  hosts:
    description: Every node of the job.
    type: list
    elements: str
    required: true
  addresses:
    description: Host name to its training address (the fact C(discover_network_addresses)).
    type: dict
    required: true
  master:
    description: Rank 0's inventory name.
    type: str
    required: true
  master_addr:
    description: MASTER_ADDR.
    type: str
    required: true
  master_port:
    description: MASTER_PORT.
    type: int
    required: true
  probe_port:
    description: The high port every node listens on.
    type: int
    required: true
"""

EXAMPLES = r"""
- name: Targets
  ansible.builtin.set_fact:
    targets: >-
      {{ inventory_hostname | hostnet.llamafactory.preflight_targets(hosts=ansible_play_hosts,
         addresses=discover_network_addresses, master='vm0', master_addr='10.0.0.2',
         master_port=29500, probe_port=49500) }}
"""

RETURN = r"""
_value:
  description: A list of C(node), C(address), C(port).
  type: list
  elements: dict
"""

from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _preflight as preflight


def preflight_targets(me, *, hosts, addresses, master, master_addr, master_port, probe_port):
    return preflight.targets(
        me,
        hosts=hosts,
        addresses=addresses,
        master=master,
        master_addr=master_addr,
        master_port=master_port,
        probe_port=probe_port,
    )


class FilterModule(object):
    def filters(self):
        return {"preflight_targets": preflight_targets}
