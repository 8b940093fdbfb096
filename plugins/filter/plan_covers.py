# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: plan_covers
short_description: Whether the job's plan made earlier in this run serves a purpose on these nodes
version_added: 0.1.0
description:
  - The role llamafactory plans the job once per run (M(hostnet.llamafactory.validate_job)); every
    role that depends on it enters it again in each play. A plan made for a broader purpose serves
    a narrower one - V(train) covers V(admin) and V(doctor), V(admin) covers V(doctor) - when it
    was made for the same nodes.
  - Every option but the input is given by name.
options:
  _input:
    description: The fact C(llamafactory_job_plan), or null before the first plan of the run.
    type: dict
    required: true
  purpose:
    description: The purpose asked for
      (O(hostnet.llamafactory.validate_job#module:purpose)).
    type: str
    required: true
  nodes:
    description: The play's hosts.
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: End here when the job's plan serves this purpose already
  ansible.builtin.meta: end_role
  when: >-
    llamafactory_job_plan | default(none)
    | hostnet.llamafactory.plan_covers(purpose='train', nodes=ansible_play_hosts_all)
"""

RETURN = r"""
_value:
  description: Whether the plan serves O(purpose) on O(nodes).
  type: bool
"""

# Which purposes a plan made for each purpose serves.
COVERS = {
    "train": ("train", "admin", "doctor"),
    "admin": ("admin", "doctor"),
    "doctor": ("doctor",),
}


def plan_covers(plan, *, purpose, nodes):
    if not plan:
        return False
    return purpose in COVERS.get(plan.get("purpose"), ()) and sorted(
        plan.get("nodes", [])
    ) == sorted(nodes)


class FilterModule(object):
    def filters(self):
        return {"plan_covers": plan_covers}
