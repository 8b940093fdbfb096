# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What one node reports about a training job's rank: parsers over the Engine API's container
inspect, the container's timestamped log lines, trainer_log.jsonl and the checkpoint folders.

Pure functions, run on the managed node by the module job_status (which fetches the raw data
through _docker_api). What the controller concludes from every node's report (launch or keep,
running, finished, failed, stalled) is in plugins/plugin_utils/_job_state.py.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import calendar
import json
import os
import re
import time

LABEL_JOB = "hostnet.llamafactory.job"
LABEL_RANK = "hostnet.llamafactory.rank"
LABEL_DIGEST = "hostnet.llamafactory.digest"
CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z ?(.*)$")


def parse_time(text):
    """Epoch seconds of a Docker RFC 3339 UTC time (nanoseconds allowed); None for zero/empty."""
    match = TIMESTAMP.match((text or "") + " ")
    if not match or match.group(1).startswith("0001-"):
        return None
    seconds = calendar.timegm(time.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S"))
    return seconds + float("0" + (match.group(2) or ".0")[:10])


def container_state(inspect):
    """The part of a container inspect (GET /containers/NAME/json; None when there is no such
    container) the job logic needs."""
    if not inspect:
        return {"state": "missing"}
    state = inspect.get("State") or {}
    config = inspect.get("Config") or {}
    return {
        "state": state.get("Status", "unknown"),
        "exit_code": state.get("ExitCode"),
        "oom_killed": bool(state.get("OOMKilled")),
        "error": state.get("Error") or "",
        "started_at": parse_time(state.get("StartedAt")),
        "finished_at": parse_time(state.get("FinishedAt")),
        "id": (inspect.get("Id") or "")[:12],
        "image": config.get("Image", ""),
        "labels": config.get("Labels") or {},
    }


def labels_match(container, wanted):
    """Whether the container (container_state's) carries every label of `wanted` with its
    value; None without `wanted` or without a container."""
    if not wanted or container.get("state") == "missing":
        return None
    labels = container.get("labels") or {}
    return all(labels.get(key) == "%s" % value for key, value in wanted.items())


def parse_logs(*streams):
    """Timestamped log text (`docker logs --timestamps`, or the decoded Engine API log stream;
    stdout and stderr given apart) as one time-ordered list of lines without timestamps, and the
    time of the newest line (None when empty)."""
    stamped = []
    for text in streams:
        # Split on newlines only: a progress bar redraws with carriage returns inside a line.
        for line in (text or "").split("\n"):
            match = TIMESTAMP.match(line)
            if match:
                stamped.append((parse_time(line), match.group(3)))
            elif line.strip():
                stamped.append((None, line))
    ordered = sorted(
        (pair for pair in stamped if pair[0] is not None), key=lambda pair: pair[0]
    ) + [pair for pair in stamped if pair[0] is None]
    last = max(
        [when for when, _line in stamped if when is not None] or [None], key=lambda t: t or 0
    )
    # Progress bars redraw with carriage returns: keep the last frame of each line.
    lines = [text.rstrip().split("\r")[-1] for _when, text in ordered]
    return lines, last


def last_progress(trainer_log_tail):
    """The newest training progress in trainer_log.jsonl text: step, total, loss, percentage."""
    progress = None
    for line in (trainer_log_tail or "").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or "current_steps" not in record:
            continue
        loss = record.get("loss", progress.get("loss") if progress else None)
        progress = {
            "step": record.get("current_steps"),
            "total": record.get("total_steps"),
            "loss": loss,
            "percentage": record.get("percentage"),
        }
    return progress


def complete_checkpoints(listing):
    """Steps of the checkpoints a node can resume from: checkpoint-N folders holding the
    trainer state and, when the run used DeepSpeed, their global_stepN shard folder.
    `listing` maps each checkpoint folder name to the names inside it."""
    steps = []
    for name, children in (listing or {}).items():
        match = CHECKPOINT.match(name)
        if not match:
            continue
        step = int(match.group(1))
        children = set(children)
        if "trainer_state.json" not in children:
            continue
        deepspeed = [c for c in children if c.startswith(("global_step", "zero_")) or c == "latest"]
        if deepspeed and "global_step%d" % step not in children:
            continue
        steps.append(step)
    return sorted(steps)


def checkpoint_listing(output_dir):
    """Checkpoint folder name -> the names inside it, for complete_checkpoints ({} without the
    folder)."""
    listing = {}
    try:
        names = os.listdir(output_dir)
    except OSError:
        return listing
    for name in names:
        path = os.path.join(output_dir, name)
        if CHECKPOINT.match(name) and os.path.isdir(path):
            try:
                listing[name] = os.listdir(path)
            except OSError:
                continue
    return listing
