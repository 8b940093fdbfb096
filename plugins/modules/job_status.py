#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: job_status
short_description: One rank of a LLaMA-Factory job - container, log tail, progress, checkpoints
version_added: 0.1.0
description:
  - Reports, in one call, the state of a training container (running, exited and its code, OOM
    kill, missing), its newest log lines with the time of the last one, the newest training
    progress from C(trainer_log.jsonl), and the checkpoints in the output folder that this node
    can resume from.
  - Optionally stops the container first (O(stop)), which is how a job's other ranks are stopped
    when one rank fails.
  - Why not C(community.docker.docker_container_info) - it returns neither the logs nor the
    training progress and checkpoints; the wait step polls every rank every few seconds and needs
    all of it in one round trip.
  - Why not community.docker's API client - its module_utils (C(plugins/module_utils/_api)) are
    private to that collection in its current releases and need the Python package C(requests)
    on the node. This module needs a container's inspect, its newest log lines with their
    timestamps (the Engine API's multiplexed log stream, decoded here), and a stop with a grace
    period, all with the standard library; the collection's own client
    (C(plugins/module_utils/_docker_api.py), shared with M(hostnet.llamafactory.image_pull)) talks
    to the daemon's socket directly. No C(docker) command is run.
author:
  - hostnet.llamafactory contributors (@hostnet)
options:
  name:
    description: The container's name.
    type: str
    required: true
  output_dir:
    description: The job's output folder on the node (for progress and checkpoints).
    type: path
  tail:
    description: How many of the newest log lines to return.
    type: int
    default: 40
  agent_state:
    description:
      - The state file of the rank's agent (C(roles/launch/files/rank_agent.py)), which names the
        restarts it made on the nodes. Unset, or absent on the node - RV(agent) is null.
    type: path
  record:
    description:
      - The record of a finished job that M(hostnet.llamafactory.job_results) wrote on rank 0's
        node (its O(hostnet.llamafactory.job_results#module:record)). Unset, or absent on the
        node - RV(record) is null.
    type: path
  stop:
    description: Stop the container (if it runs) before reporting.
    type: bool
    default: false
  labels:
    description:
      - Labels that make the container this run's (the launch role's digest of the rank's
        settings). RV(labels_match) says whether the container carries every one of them with
        that value.
    type: dict
extends_documentation_fragment:
  - hostnet.llamafactory.docker
  - hostnet.llamafactory.docker.stop
attributes:
  check_mode:
    support: full
    description: Runs in check mode; a running container is then reported as it would be
      stopped, not stopped.
  diff_mode:
    support: none
    description: Reports no diff.
  idempotent:
    support: full
    description: Only reports, unless O(stop=true); a second stop finds the container stopped
      and changes nothing.
"""

EXAMPLES = r"""
- name: Look at rank 1
  hostnet.llamafactory.job_status:
    name: llamafactory-demo
    output_dir: /var/lib/llamafactory/jobs/demo/output
  register: rank

- name: Look at a rank and whether its container is the one this run wants
  hostnet.llamafactory.job_status:
    name: llamafactory-demo
    labels:
      hostnet.llamafactory.digest: 6b1f0c2d9e8a7f31
  register: rank

- name: Stop a job's container on every node
  hostnet.llamafactory.job_status:
    name: llamafactory-demo
    stop: true
"""

RETURN = r"""
container:
  description: The container's state (V(missing) when there is none), exit code, OOM kill,
    start/finish times (epoch seconds), short ID, image and labels.
  returned: always
  type: dict
  sample: {state: exited, exit_code: 137, oom_killed: false, id: 3f2a9c1d0e4b}
log_lines:
  description: The newest log lines, stdout and stderr merged in time order.
  returned: always
  type: list
  elements: str
  sample: ["[INFO|trainer.py:2519] Running training", "{'loss': 5.0409, 'epoch': 0.25}"]
last_output_at:
  description: Epoch seconds of the newest log line (null when none).
  returned: always
  type: float
  sample: 1796024735.168598
progress:
  description: The newest C(trainer_log.jsonl) record - step, total, loss, percentage (null
    before the first logged step).
  returned: always
  type: dict
  sample: {step: 400, total: 4000, loss: 5.04, percentage: 10.0}
labels_match:
  description: Whether the container carries every label of O(labels) with its value; null
    without O(labels) or without a container.
  returned: always
  type: bool
  sample: true
checkpoints:
  description: Steps of the complete checkpoints on this node (trainer state and, with
    DeepSpeed, the shard folder), ascending.
  returned: always
  type: list
  elements: int
  sample: [10, 20]
agent:
  description: The rank agent's state when O(agent_state) names a readable file - its attempt,
    the restarts it made on the nodes (cause, step, checkpoint resumed from, steps lost,
    message) and C(peers), what it last heard from every other rank's agent (by rank - C(seen_at)
    on the node's clock and C(answer), that agent's state, code and seconds without output),
    else null.
  returned: always
  type: dict
  sample: {state: running, attempt: 1, restarts: [{attempt: 1, step: 23, resume: 20, lost: 3}]}
record:
  description: The finished job's record when O(record) names a readable JSON file, else null.
  returned: always
  type: dict
  sample: {job: demo, container: 3f2a9c0d1e4b, ranks: {vm0: 0, vm1: 1}}
now:
  description: The node's clock, epoch seconds.
  returned: always
  type: float
  sample: 1796024741.52
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _job_status as job_status
from ansible_collections.hostnet.llamafactory.plugins.module_utils._docker_api import (
    DockerAPI,
    DockerError,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            job_status.OPTIONS,
            stop=dict(type="bool", default=False),
            labels=dict(type="dict"),
            stop_timeout=dict(type="int", default=10),
        ),
        supports_check_mode=True,
    )
    params = module.params
    docker = DockerAPI.from_params(params)
    try:
        result = job_status.read(docker, params, module.check_mode)
    except DockerError as exc:
        module.fail_json(msg="cannot query container %s: %s" % (params["name"], exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
