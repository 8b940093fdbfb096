# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: smoke_verdict
short_description: The preflight smoke test's verdict on rank 0's output
version_added: 0.1.0
description:
  - Findings that stop the launch - rank 0 printed no result (the smoke test failed - the rank
    that failed first is named from O(statuses), with its errors and the known causes found in
    them); NCCL's INFO log names another network than the node profile's (C(Socket) where
    C(FasTrak) or C(gIB) was due - the right environment on plain sockets), or none; warnings -
    bus bandwidth under the machine type's pass mark, compared only when the collective, size
    and GPUs per node are those the pass mark was measured with; and the report's line (the
    fraction of the pass mark and of the published figure).
options:
  _input:
    description: The smoke test's JSON result (its C(smoke) object), or null.
    type: dict
    required: true
  log_lines:
    description: Rank 0's output lines (NCCL INFO lines included).
    type: list
    elements: str
    required: true
  network:
    description: The NCCL network the profile needs (primary_nic's C(network_profile.nccl_network)).
    type: str
  expected:
    description: The machine type's expected bandwidth (primary_nic's C(network_profile.expected)).
    type: dict
  gpus_per_node:
    description: GPUs per node.
    type: int
    default: 0
  ranks:
    description: Every node (inventory host name) with its node rank, to name a failed rank.
    type: dict
  statuses:
    description:
      - Every node's M(hostnet.llamafactory.job_status) report of its smoke container, read
        after a failure (null otherwise).
    type: dict
"""

EXAMPLES = r"""
- name: Judge the smoke test
  ansible.builtin.set_fact:
    verdict: >-
      {{ result | hostnet.llamafactory.smoke_verdict(log_lines=logs.stdout_lines,
         network='FasTrak', expected=primary_nic.network_profile.expected, gpus_per_node=8) }}
"""

RETURN = r"""
_value:
  description: C(findings) (a list of C(id), C(cause), C(fix)), C(warnings) (a list of str),
    C(line) (the report) and C(passed) (a result and no finding).
  type: dict
"""

from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _preflight as preflight


def smoke_verdict(
    result, *, log_lines, network=None, expected=None, gpus_per_node=0, ranks=None, statuses=None
):
    return preflight.smoke_verdict(
        result, log_lines, network, expected, gpus_per_node, ranks=ranks, statuses=statuses
    )


class FilterModule(object):
    def filters(self):
        return {"smoke_verdict": smoke_verdict}
