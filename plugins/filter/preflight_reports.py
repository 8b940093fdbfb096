# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: preflight_reports
short_description: Every node's preflight report and discovery facts, read once on the controller
version_added: 0.1.0
description:
  - Reads, for every node, what the preflight registered there - the probe's report (read from the
    node itself, or gathered by rank 0's probe), the probe's start (its error when it did not
    start), the GPUs' health, TCPXO's receive-datapath-manager, the shared mounts and the network
    plugin's paths found missing - and the node's discovery facts (rank, NIC, network profile,
    placement policies), as the input and the C(nodes) option of
    P(hostnet.llamafactory.preflight_findings#filter).
  - One task on the controller (run_once) reads every node this way, where a task on every node
    would cost a forked worker per node.
  - Every option but the input is given by name.
options:
  _input:
    description: The nodes (ansible_play_hosts).
    type: list
    elements: str
    required: true
  hostvars:
    description: Ansible's hostvars.
    type: raw
    required: true
  master:
    description: Rank 0's inventory name (its registered preflight_gathered holds the reports
      its probe gathered).
    type: str
    required: true
  host_network:
    description: Whether the ranks use the host's network (otherwise every node's profile is
      C(socket)).
    type: bool
    required: true
"""

EXAMPLES = r"""
- name: Weigh the reports
  ansible.builtin.set_fact:
    preflight_verdict: >-
      {{ read.reports | hostnet.llamafactory.preflight_findings(nodes=read.nodes,
         master_addr=discover_network_master_addr, master_port=29500, probe_port=49500) }}
  vars:
    read: >-
      {{ ansible_play_hosts | hostnet.llamafactory.preflight_reports(hostvars=hostvars,
         master=discover_network_master, host_network=true) }}
  run_once: true
"""

RETURN = r"""
_value:
  description: C(reports) (host to its probe's report, with C(error), C(listener.error),
    C(gpu_health), C(rxdm), C(missing_mounts) and C(missing_network)) and C(nodes) (host to
    C(rank), C(address), C(interface), C(mtu), C(method), C(profile), C(machine_type),
    C(profile_problems) and C(placement)).
  type: dict
"""

from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _preflight as preflight


def preflight_reports(hosts, *, hostvars, master, host_network):
    return preflight.node_reports(list(hosts), hostvars, master, bool(host_network))


class FilterModule(object):
    def filters(self):
        return {"preflight_reports": preflight_reports}
