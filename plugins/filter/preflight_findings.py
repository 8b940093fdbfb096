# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: preflight_findings
short_description: The preflight's verdict over every node's probe report
version_added: 0.1.0
description:
  - Turns the reports of the launch role's network probe (one container per node, in the
    launch's network mode) and the discovered NICs into findings, each a cause and its fix - a
    container that does not have its node's address (bridge networking), MASTER_ADDR:MASTER_PORT
    or a peer's high port unreachable (firewall, route, wrong NIC), a different node answering,
    MTUs that differ between the nodes, too little free disk, a GPU count other than
    llamafactory_gpus_per_node, a probe that could not run.
  - Every option but the input is given by name.
options:
  _input:
    description: Host name to C(report) (the probe's JSON) or C(error) (why there is none).
    type: dict
    required: true
  nodes:
    description: Host name to C(rank), C(address), C(interface), C(mtu) (from discovery).
    type: dict
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
    description: The high port every node listened on.
    type: int
    required: true
  network_mode:
    description: The launch's network mode, for messages.
    type: str
    default: host
  min_free_gb:
    description: Free disk the job folder needs, in GB (0 - no check).
    type: float
    default: 0
  gpus_per_node:
    description: GPUs each node must have (0 - no check).
    type: int
    default: 0
  job:
    description: The job's name, for the message.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Judge
  ansible.builtin.set_fact:
    verdict: >-
      {{ reports | hostnet.llamafactory.preflight_findings(nodes=nodes, master_addr='10.0.0.2',
         master_port=29500, probe_port=49500) }}
"""

RETURN = r"""
_value:
  description: C(findings) (a list of C(id), C(cause), C(fix)), C(msg) (all of them, for a
    failure message; empty when there are none), C(versions) (LLaMA-Factory's version in the
    image, the rank variable it reads, torch and DeepSpeed; null when unknown) and C(warnings)
    (what costs speed but does not stop the launch - GPU nodes outside one placement policy).
  type: dict
"""

from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _preflight as preflight


def preflight_findings(
    reports,
    *,
    nodes,
    master_addr,
    master_port,
    probe_port,
    network_mode="host",
    min_free_gb=0,
    gpus_per_node=0,
    job="",
):
    found = preflight.findings(
        reports,
        nodes,
        master_addr,
        master_port,
        probe_port,
        network_mode=network_mode,
        min_free_gb=min_free_gb,
        gpus_per_node=gpus_per_node,
    )
    return {
        "findings": found,
        "msg": preflight.message(job, found) if found else "",
        "versions": preflight.versions_line(reports),
        "warnings": preflight.warnings(nodes),
    }


class FilterModule(object):
    def filters(self):
        return {"preflight_findings": preflight_findings}
