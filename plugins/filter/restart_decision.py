# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: restart_decision
short_description: Whether the controller relaunches a failed job (launch_max_restarts)
version_added: 0.1.0
description:
  - From the restart advice of M(hostnet.llamafactory.job_wait) (or of the VMs' status) and the
    restarts made so far - by the controller and by the ranks' agents on the nodes - whether the
    launch role relaunches the job.
  - No, when the failure is not one a restart can cure, when no restart is left, or when it is
    the same failure at the same step as the restart before it.
options:
  _input:
    description: The advice - C(restartable), C(kind), C(step), C(why).
    type: dict
    required: true
  restarts:
    description: The restarts so far, oldest first, each with its C(kind) and C(step).
    type: list
    elements: dict
    required: true
  max_restarts:
    description: C(launch_max_restarts).
    type: int
    required: true
"""

EXAMPLES = r"""
- name: Decide
  ansible.builtin.set_fact:
    decision: "{{ advice | hostnet.llamafactory.restart_decision(restarts=[], max_restarts=2) }}"
"""

RETURN = r"""
_value:
  description: C(restart) (bool) and C(why) (empty when it restarts).
  type: dict
"""

from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._job_state import (
    decide_restart,
)


def restart_decision(advice, *, restarts, max_restarts):
    return decide_restart(advice, restarts, int(max_restarts))


class FilterModule(object):
    def filters(self):
        return {"restart_decision": restart_decision}
