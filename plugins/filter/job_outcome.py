# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: job_outcome
short_description: How a multi-node job ended, from the wait and every node's report after it
version_added: 0.1.0
description:
  - The verdict after M(hostnet.llamafactory.job_wait) - finished, failed or stalled, or left
    running at the wait's timeout - from its result on the lowest rank's node and every node's
    M(hostnet.llamafactory.job_status) report taken after it (a long log tail for the
    diagnosis; the ranks still running after a failure stopped).
  - Why a filter over reports taken by an ordinary task - the wait runs in one controller fork
    (it learns the other ranks' state from the agent of its own), so every node's report comes
    from a task that Ansible runs in batches of C(forks), whatever the number of nodes.
  - The first failing rank is the one whose container ended first; ranks the wait stopped
    because of it are not causes. The message gives its last log lines, the other ranks' ends
    and the known causes the collection's diagnosis finds in every rank's log; C(restart) says
    whether a relaunch from the newest checkpoint every rank holds can cure it.
options:
  _input:
    description: Every node's job_status result after the wait, by inventory host name (an
      unreachable node's result counts as a rank that could not be queried).
    type: dict
    required: true
  watch:
    description: job_wait's result on the lowest rank's node.
    type: dict
    required: true
  ranks:
    description: Every node of the job with its node rank.
    type: dict
    required: true
  job:
    description: The job's name, for messages.
    type: str
    required: true
  stopped:
    description: The hosts whose rank the wait (or the reports after it) stopped after the
      failure.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Judge the job
  ansible.builtin.set_fact:
    outcome: >-
      {{ {'vm0': final0, 'vm1': final1}
         | hostnet.llamafactory.job_outcome(watch=wait0, ranks={'vm0': 0, 'vm1': 1}, job='demo') }}
"""

RETURN = r"""
_value:
  description:
    - C(failed), C(state), C(msg) (on failure), C(progress), C(line), C(elapsed), C(checkpoints)
      (rank 0's), C(restarts) (the agents' restarts on the nodes, rank 0's view) and, on
      failure, C(failed_ranks) (the first failing one first) and C(restart).
    - C(restart) says whether relaunching from the newest checkpoint every rank holds can cure
      the failure (the launch role's C(launch_max_restarts) acts on it) - C(restartable),
      C(kind) (lost, killed, peer-lost, network; or why not), C(cause) (the first failing rank),
      C(step) (the newest step logged) and C(why). A rank killed, a node lost, a rank stopped by
      its agent because another was lost, or a log that names only a lost peer are restartable;
      a rank that failed on its own, ran out of memory or was stopped with SIGTERM, and a
      stalled job are not.
  type: dict
"""

import time

from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._diagnosis import diagnose
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._job_state import judge_wait


def job_outcome(finals, *, watch, ranks, job, stopped=()):
    ranks = dict((host, int(rank)) for host, rank in ranks.items())
    return judge_wait(watch, finals, ranks, job, time.time(), diagnose, set(stopped))


class FilterModule(object):
    def filters(self):
        return {"job_outcome": job_outcome}
