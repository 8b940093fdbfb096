#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: job_wait
short_description: Wait for a multi-node LLaMA-Factory job, stopping every rank when one fails
version_added: 0.1.0
description:
  - Runs on the controller (an action plugin) for every node of a job at once; it needs
    C(forks) at least the number of nodes. Every O(interval) seconds each node's rank is queried
    with M(hostnet.llamafactory.job_status) and the reports are shared between the nodes'
    instances on the controller.
  - The lowest rank prints progress (step/total, loss, each rank's state) whenever it changes
    and at least every O(progress_every) seconds.
  - When a rank exits non-zero, loses its container or stops answering, every other rank is
    stopped at once (a surviving rank otherwise hangs until the collective timeout) and the task
    fails naming the first failing rank, its last log lines and the causes the collection's
    diagnosis table finds in the logs.
  - When no rank writes a log line for O(stall_timeout) seconds (a rendezvous that never
    completes), every rank is stopped as well.
  - At O(timeout) the task fails and leaves the job running.
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
  description: V(finished), V(failed), V(stalled) or V(running) (at the timeout).
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
  returned: success
  type: float
  sample: 1520.4
line:
  description: The last progress line (step, loss, each rank's state).
  returned: success
  type: str
  sample: "step 4000/4000 loss 1.2873 | rank 0 exited with code 0, rank 1 exited with code 0"
checkpoints:
  description: Steps of the complete checkpoints on this node when the job finished.
  returned: success
  type: list
  elements: int
  sample: [2000, 4000]
failed_ranks:
  description: The ranks that failed, the first failing one first.
  returned: failure
  type: list
  elements: int
  sample: [1, 0]
restarts:
  description: The restarts the agents made on the nodes during this wait or before it (this
    rank's agent's, since its container started) - attempt, cause, step, resume (the checkpoint),
    lost (steps) and message.
  returned: always
  type: list
  elements: dict
  sample: [{attempt: 1, cause: "rank 1 killed (SIGKILL, exit 137)", step: 23, resume: 20, lost: 3}]
restart:
  description:
    - Whether relaunching from the newest checkpoint every rank holds can cure the failure (the
      launch role's C(launch_max_restarts) acts on rank 0's) - V(restartable), V(kind) (lost,
      killed, peer-lost, network; or why not), V(cause) (the first failing rank), V(step) (the
      newest step logged) and V(why).
    - A rank killed, a node lost, a rank stopped by its agent because another was lost, or a
      log that names only a lost peer are restartable; a rank that failed on its own, ran out
      of memory or was stopped with SIGTERM, and a stalled job are not.
  returned: failure
  type: dict
  sample:
    restartable: true
    kind: killed
    cause: rank 1 (vm1) killed (SIGKILL, exit 137)
    step: 23
    why: a killed rank can be started again
"""
