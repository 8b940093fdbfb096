#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: job_wait
short_description: Wait for a multi-node LLaMA-Factory job, stopping its ranks when one fails
version_added: 0.1.0
description:
  - Runs on the controller (an action plugin). With O(agents) (the launch role's host-networked
    ranks, each under its agent) it runs on the lowest rank's node only, in one controller fork
    whatever the number of nodes - every O(interval) seconds it queries that rank with
    M(hostnet.llamafactory.job_status) and learns every other rank's state from that rank's
    agent, which asks every peer's agent every few seconds (its view is in the agent's state
    file). Without agents it runs for every node at once (it needs C(forks) at least the number
    of nodes) - each node's instance queries its own rank and the reports are shared between the
    instances on the controller.
  - The lowest rank prints progress (step/total, loss, each rank's state) whenever it changes
    and at least every O(progress_every) seconds, and each restart the agents made on the nodes.
  - When a rank exits non-zero, loses its container or stops answering, or when no rank writes a
    log line for O(stall_timeout) seconds (a rendezvous that never completes), the instance
    stops its own rank at once (with agents, the others' agents stop theirs on seeing it) and
    returns RV(state) V(failed) or V(stalled). The task does not fail - the verdict, with the
    first failing rank, its last log lines and the causes the collection's diagnosis finds, is
    the filter P(hostnet.llamafactory.job_outcome#filter)'s, over every node's
    M(hostnet.llamafactory.job_status) report taken after the wait (which stops what still runs) -
    those reports come from an ordinary task, so C(forks) bounds nothing.
  - At O(timeout) it returns RV(state) V(running) with RV(msg) and leaves the job running.
  - When the controller's ansible-playbook is killed, its forks would go on waiting with no one to
    report to; each instance notices that its parent process went away, and ends without touching
    the job (the ranks' agents, see the launch role, watch each other).
  - Why not C(until)/C(retries) - retries run per host and cannot stop one host's container
    because another host's rank died.
author:
  - hostnet.llamafactory contributors (@hostnet)
options:
  name:
    description: The job's container name (the same on every node).
    type: str
    required: true
  job:
    description: The job's name, for messages.
    type: str
    required: true
  output_dir:
    description: The job's output folder on the nodes.
    type: str
    required: true
  agent_state:
    description:
      - The state file of each rank's agent on its node. The restarts the agents made on the
        nodes are then shown as they happen (rank 0's), and returned in RV(restarts).
    type: str
  agents:
    description:
      - Every rank runs under its agent (O(agent_state) names its state file) - run the task on
        the lowest rank's node only; it learns the other ranks' state from that rank's agent.
    type: bool
    default: false
  ranks:
    description: Every node of the job (inventory host name) with its node rank.
    type: dict
    required: true
  timeout:
    description: Seconds to wait before failing (the job keeps running).
    type: int
    default: 86400
  stall_timeout:
    description: Seconds without a new log line on any rank before the job counts as stalled
      and is stopped; 0 disables.
    type: int
    default: 1800
  interval:
    description: Seconds between polls.
    type: float
    default: 10.0
  tail:
    description: Log lines kept per rank for the failure message.
    type: int
    default: 40
extends_documentation_fragment:
  - hostnet.llamafactory.docker
  - hostnet.llamafactory.docker.progress
  - hostnet.llamafactory.docker.stop
attributes:
  check_mode:
    support: none
    description: Skipped in check mode (there is no job to wait for).
  diff_mode:
    support: none
    description: Reports no diff.
  action:
    support: full
    description: Runs on the controller as an action plugin, querying each node through its
      own connection.
  idempotent:
    support: partial
    description: Waiting changes nothing while the job runs or when it finished; when a rank
      fails every other rank is stopped (reported as changed), so a second run finds them
      stopped and fails again without changing anything.
"""

EXAMPLES = r"""
- name: Wait for the job
  hostnet.llamafactory.job_wait:
    name: llamafactory-demo
    job: demo
    output_dir: /var/lib/llamafactory/jobs/demo/output
    ranks: {vm0: 0, vm1: 1}
    timeout: 3600
"""

RETURN = r"""
state:
  description: V(finished), V(failed), V(stalled), V(ended) (with O(agents) - rank 0 ended while
    its agent's last view still showed a rank running; the reports after the wait tell the rest)
    or V(running) (at the timeout).
  returned: always
  type: str
  sample: finished
progress:
  description: The newest training progress (step, total, loss, percentage).
  returned: always
  type: dict
  sample: {step: 4000, total: 4000, loss: 1.2873, percentage: 100.0}
elapsed:
  description: Seconds waited.
  returned: always
  type: float
  sample: 1520.4
line:
  description: The last progress line (step, loss, each rank's state).
  returned: always
  type: str
  sample: "step 4000/4000 loss 1.2873 | rank 0 exited with code 0, rank 1 exited with code 0"
checkpoints:
  description: Steps of the complete checkpoints on this node when the job ended.
  returned: when RV(state) is V(finished) or V(ended)
  type: list
  elements: int
  sample: [2000, 4000]
stopped:
  description: Whether this instance stopped its own rank after the failure.
  returned: when RV(state) is V(failed) or V(stalled)
  type: bool
failed_hosts:
  description: The nodes seen failing, the first one first.
  returned: when RV(state) is V(failed)
  type: list
  elements: str
  sample: [vm1]
reasons:
  description: Why each of RV(failed_hosts) counts as failed.
  returned: when RV(state) is V(failed)
  type: dict
  sample: {vm1: "killed (SIGKILL, exit 137)"}
quiet:
  description: Seconds without a log line on any rank.
  returned: when RV(state) is V(stalled)
  type: float
msg:
  description: Why the wait ended without a verdict (the timeout; the controller went away).
  returned: when RV(state) is V(running) or V(unknown)
  type: str
restarts:
  description: The restarts the agents made on the nodes during this wait or before it (this
    rank's agent's, since its container started) - attempt, cause, step, resume (the checkpoint),
    lost (steps) and message.
  returned: always
  type: list
  elements: dict
  sample: [{attempt: 1, cause: "rank 1 killed (SIGKILL, exit 137)", step: 23, resume: 20, lost: 3}]
"""
