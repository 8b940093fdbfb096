# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: job_settled
short_description: A job every rank finished, read from rank 0's node alone
version_added: 0.1.0
description:
  - From rank 0's job read (M(hostnet.llamafactory.node_facts)' C(job_state), with the record
    that M(hostnet.llamafactory.job_results) wrote there once every rank had finished) - every
    rank's report and training address, when rank 0's container is the recorded one, exited 0
    and carries this run's digest, and the job's nodes and ranks are the recorded ones; else an
    empty dict, and every node is read.
  - The other nodes are not read - a node's own settings changed since, or its container removed,
    are not seen; the job's and rank 0's are.
options:
  _input:
    description: Rank 0's job read (C(job_state)), with C(record).
    type: dict
    required: true
  digest:
    description: The digest this run wants for rank 0's container (the launch role's).
    type: str
    required: true
  job:
    description: The job's name.
    type: str
    required: true
  ranks:
    description: Host name to rank, every node of the job.
    type: dict
    required: true
  host:
    description: Rank 0's host name.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Read a finished job from rank 0 alone
  ansible.builtin.set_fact:
    settled: >-
      {{ job_state | hostnet.llamafactory.job_settled(digest=launch_digest, job='demo',
           ranks={'vm0': 0, 'vm1': 1}, host=inventory_hostname) }}
"""

RETURN = r"""
_value:
  description: C(reports) (host name to a M(hostnet.llamafactory.job_status) report - rank 0's
    read, and each other rank's as the record gives it) and C(addresses) (host name to its
    training address), or an empty dict.
  type: dict
"""

from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._job_state import settled


def job_settled(report, *, digest, job, ranks, host):
    return settled(report, digest, job, ranks, host)


class FilterModule(object):
    def filters(self):
        return {"job_settled": job_settled}
