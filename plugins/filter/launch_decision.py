# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: launch_decision
short_description: Whether a job must be launched, kept as it is, or refused
version_added: 0.1.0
description:
  - From every rank's M(hostnet.llamafactory.job_status) report - V(keep) when the same job
    (same digest) runs or finished successfully on every rank, V(refuse) when another version of
    the job runs or finished and O(restart_allowed) is false, else V(launch), stopping the ranks
    that still run, resuming from the newest checkpoint that every rank holds.
  - Every option but the input is given by name.
options:
  _input:
    description:
      - Host name to its M(hostnet.llamafactory.job_status) report. Whether the container is
        this run's is the report's C(labels_match) (job_status given the digest label), else
        its digest label compared with the report's C(wanted), else with O(digest).
    type: dict
    required: true
  ranks:
    description: Host name to its rank (the order of the hosts in messages), for reports
      without C(rank).
    type: dict
  digest:
    description: The wanted digest (container label C(hostnet.llamafactory.digest)) for the
      reports without C(labels_match) or C(wanted).
    type: str
  restart_allowed:
    description: Whether a changed job may replace a running or finished one.
    type: bool
    default: false
  job:
    description: The job's name, for messages.
    type: str
  durable:
    description: The checkpoint steps complete in the bucket of C(llamafactory_output_uri)
      (M(hostnet.llamafactory.gcs_outputs)'s RV(complete)); null without an output URI. The job
      resumes from the newest of them when no newer checkpoint is on every node, and a node
      that holds no checkpoint while another does is refused without them.
    type: list
    elements: int
"""

EXAMPLES = r"""
- name: Decide
  ansible.builtin.set_fact:
    decision: "{{ reports | hostnet.llamafactory.launch_decision(job='demo') }}"
"""

RETURN = r"""
_value:
  description: action (keep, launch, refuse), why, stop_first (hosts), resume (a checkpoint
    step or null), fresh (start over although some ranks hold checkpoints), restore (the hosts
    that download their part of the resume checkpoint from the bucket), state (for keep).
  type: dict
"""

from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._job_state import decide_launch


def launch_decision(
    reports, *, digest=None, restart_allowed=False, job="", ranks=None, durable=None
):
    return decide_launch(
        reports,
        digest,
        restart_allowed=restart_allowed,
        job=job,
        restart_var="launch_restart_on_change",
        ranks=ranks,
        durable=durable,
    )


class FilterModule(object):
    def filters(self):
        return {"launch_decision": launch_decision}
