# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One rank's state on its node, read in one call: the container (inspect, newest log lines,
optionally stopped first), the training progress and checkpoints in the output folder, the
agent's state file, and the record a finished job's collect step left on rank 0's node. Shared
by the modules job_status and node_facts."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import time

from ansible_collections.hostnet.llamafactory.plugins.module_utils import _docker_api as docker_api
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _job as job
from ansible_collections.hostnet.llamafactory.plugins.module_utils._docker_api import DockerError

TRAINER_LOG_TAIL_BYTES = 16384
# The read's options (job_status's without `stop` and `labels`, and node_facts' `job`).
OPTIONS = dict(
    name=dict(type="str", required=True),
    output_dir=dict(type="path"),
    agent_state=dict(type="path"),
    record=dict(type="path"),
    tail=dict(type="int", default=40),
    **docker_api.OPTIONS,
)


def trainer_log_tail(output_dir, since=None):
    """The end of trainer_log.jsonl; empty when it was last written before `since` (a resumed
    run appends to the file of the run before it)."""
    path = os.path.join(output_dir, "trainer_log.jsonl")
    try:
        if since and os.path.getmtime(path) < since - 1:
            return ""
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - TRAINER_LOG_TAIL_BYTES))
            data = handle.read().decode("utf-8", "replace")
    except (IOError, OSError):
        return ""
    return data if size <= TRAINER_LOG_TAIL_BYTES else data.split("\n", 1)[-1]


def _json_object(path):
    """A JSON object file as a dict, or None (no path, not written yet, half written)."""
    if not path:
        return None
    try:
        with open(path) as handle:
            found = json.load(handle)
    except (IOError, OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def agent_state(path):
    """The agent's state file as a dict, or None (no agent, not written yet, half written)."""
    state = _json_object(path)
    if state is None:
        return None
    keep = ("state", "attempt", "code", "restarts", "peers", "addresses")
    return dict((key, state[key]) for key in keep if key in state)


def record(path):
    """The finished job's record (job_results wrote it on rank 0's node) as a dict, or None."""
    return _json_object(path)


def query(docker, params, check_mode):
    """The container's inspect (None when absent), its log text (stdout, stderr) and whether it
    was stopped. Raises DockerError."""
    name = params["name"]
    raw = docker.inspect_container(name)
    stopped = False
    if params.get("stop") and raw and (raw.get("State") or {}).get("Running"):
        stopped = True
        if not check_mode:
            docker.stop_container(name, params["stop_timeout"])
            raw = docker.inspect_container(name)
    logs = ("", "")
    if raw:
        tty = bool((raw.get("Config") or {}).get("Tty"))
        try:
            logs = docker.container_logs(name, tail=params["tail"], timestamps=True, tty=tty)
        except DockerError as exc:
            # A logging driver without read support (syslog, gelf...) or a container removed
            # between the calls: the state still counts.
            if exc.status is None:
                raise
    return raw, logs, stopped


def read(docker, params, check_mode):
    """job_status's result for `params` (its options). Raises DockerError."""
    raw, logs, changed = query(docker, params, check_mode)
    result = dict(changed=changed, container=job.container_state(raw), now=time.time())
    result["labels_match"] = job.labels_match(result["container"], params.get("labels"))
    lines, last = job.parse_logs(*logs)
    result.update(log_lines=lines[-params["tail"] :], last_output_at=last)
    output_dir = params.get("output_dir")
    started = result["container"].get("started_at")
    result["progress"] = (
        job.last_progress(trainer_log_tail(output_dir, started)) if output_dir else None
    )
    result["checkpoints"] = (
        job.complete_checkpoints(job.checkpoint_listing(output_dir)) if output_dir else []
    )
    result["agent"] = agent_state(params.get("agent_state"))
    result["record"] = record(params.get("record"))
    return result
