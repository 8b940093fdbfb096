# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: gcp_firewall_error
short_description: A clear message for a failed google.cloud firewall task
version_added: 0.1.0
description:
  - Reads a failed result of C(google.cloud.gcp_compute_firewall) or
    C(google.cloud.gcp_compute_firewall_info) (a loop's too) and says what went wrong and what to
    set.
  - "Permission denied names the IAM permission (from Google's message, else from the call, for
    example C(compute.firewalls.create)); a 404 tells a missing project from a missing network;
    also the deadline of the role's runner, a disabled Compute Engine API, missing credentials or
    Python packages, and an unreachable API."
options:
  _input:
    description: The failed result (C(ansible_failed_result)).
    type: dict
    required: true
  context:
    description:
      - C(project), C(network), C(rule) (what was being changed), C(call) (V(list), V(present) or
        V(absent)), C(auth_kind), C(deadline) (seconds), C(python).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Explain the failure
  ansible.builtin.fail:
    msg: "{{ ansible_failed_result | hostnet.llamafactory.gcp_firewall_error(context) }}"
"""

RETURN = r"""
_value:
  description: The message.
  type: str
"""

from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._gcp_firewall import explain


def gcp_firewall_error(result, context):
    return explain(dict(result or {}), dict(context or {}))


class FilterModule(object):
    def filters(self):
        return {"gcp_firewall_error": gcp_firewall_error}
