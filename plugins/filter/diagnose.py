# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: diagnose
short_description: Known multi-node failures found in NCCL, Gloo, torchrun and LLaMA-Factory logs
version_added: 0.1.0
description:
  - Applies the collection's table of error signatures (plugins/plugin_utils/_diagnosis.py) to
    logs and returns each failure found with its cause and fix - the Docker-bridge address of the
    motivating report, a missing or wrong interface, Gloo on loopback, an unreachable rendezvous,
    blocked ports, two nodes at one node rank.
options:
  _input:
    description: The log text, or a mapping of host name to log text (needed to see two hosts
      at one rank).
    type: raw
    required: true
"""

EXAMPLES = r"""
- name: Explain a failed run
  ansible.builtin.debug:
    msg: "{{ logs_by_host | hostnet.llamafactory.diagnose }}"
"""

RETURN = r"""
_value:
  description: Findings, each with id, host, line, cause and fix.
  type: list
  elements: dict
"""

from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._diagnosis import diagnose


class FilterModule(object):
    def filters(self):
        return {"diagnose": diagnose}
