# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: gcp_firewall_drift
short_description: How the GCE firewall rules differ from a gcp_firewall_plan
version_added: 0.1.0
description:
  - Compares each planned rule with the rule of that name that GCE holds (from
    C(google.cloud.gcp_compute_firewall_info)) and says what the role does to it.
  - "Actions: V(none); V(create); V(delete); V(update), which the module's PATCH fixes; V(narrow),
    entries added to a list (a source range, a protocol), which C(gcp_compute_firewall) does not
    notice because it only checks that the wanted entries are present, so the role makes it
    rewrite the rule; V(replace), a changed network or direction or a scope the role does not set
    (source tags on a ranges rule, service accounts, denied), fixed by deleting and creating;
    V(foreign), a rule of that name whose description lacks this cluster's mark, which the role
    never changes."
options:
  _input:
    description: The plan (from P(hostnet.llamafactory.gcp_firewall_plan#filter)).
    type: dict
    required: true
  resources:
    description: The firewall resources that GCE returned for the plan's rule names.
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
- name: Compare
  ansible.builtin.set_fact:
    drift: "{{ plan | hostnet.llamafactory.gcp_firewall_drift(read.resources) }}"
"""

RETURN = r"""
_value:
  description: The comparison.
  type: dict
  contains:
    rules:
      description: The plan's rules, each with C(action) and C(changes) (readable lines).
      type: list
      elements: dict
    changed:
      description: Whether any rule would be created, changed or deleted.
      type: bool
    foreign:
      description: Names held by rules that the role did not make.
      type: list
      elements: str
    summary:
      description:
        - "One readable line per rule, for example
          C(llamafactory-nodes: update (priority: 900, wanted 1000))."
      type: list
      elements: str
"""

from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._gcp_firewall import drift


def gcp_firewall_drift(planned, resources):
    return drift(planned, list(resources or []))


class FilterModule(object):
    def filters(self):
        return {"gcp_firewall_drift": gcp_firewall_drift}
