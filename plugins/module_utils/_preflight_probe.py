# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The preflight's probe container on a node (the module preflight_probe): started with the
job's network mode, image, volumes and GPUs, then signalled, its report read and the container
removed. roles/preflight/files/preflight_probe.py (mode probe) runs inside. Rank 0's probe may
hold the others' reports (its "gathered"): each is returned shaped as a node's own read. The
start also looks on the host for what the container does not show (host_checks)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import time

from ansible_collections.hostnet.llamafactory.plugins.module_utils import _container as container
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _job as job
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _job_files as files

# SIGUSR1 tells the probe that every node's probe runs: a refusal from then on is final.
GO = "SIGUSR1"
POLL_S = 0.2
# A probe whose every target answered ends as soon as its peers reached it (they connect the
# moment they start, and every probe ran before any was read): awaited this long, then removed
# whatever its state. One with a failure of its own is removed at once - the preflight stops.
END_GRACE_S = 2.0


# How many of the receive-datapath-manager's last log lines the host checks return.
RXDM_TAIL = 5


def host_checks(docker, params):
    """What the probe's container cannot see, looked at on the host in the start's call: the
    entries of O(host_paths) that are not there (as lstat finds them: a dangling link is there),
    and the container O(rxdm) (TCPXO's receive-datapath-manager; None when not asked) with its
    last log lines. Raises DockerError."""
    missing = [
        dict((key, value) for key, value in entry.items() if value is not None)
        for entry in params["host_paths"]
        if not os.path.lexists(entry["path"])
    ]
    rxdm = None
    if params["rxdm"]:
        raw = docker.inspect_container(params["rxdm"])
        rxdm = {
            "container": job.container_state(raw),
            "log_lines": _lines(docker, params["rxdm"], RXDM_TAIL) if raw else [],
        }
    return {"missing_paths": missing, "rxdm": rxdm}


def start(docker, params, check_mode):
    """Make O(files), then replace any container of the name by a new probe, started ->
    {path: changes} of the files. Raises EntryError (nothing started) or DockerError."""
    changes = files.write(params["files"], "root", "root", check_mode)
    if not check_mode:
        container.replace(docker, params["name"], container.create_body(params))
    return changes


def _running(raw):
    return bool(((raw or {}).get("State") or {}).get("Running"))


def _lines(docker, name, tail):
    out, err = docker.container_logs(name, tail=tail, timestamps=False)
    return [line for line in (out + err).splitlines() if line.strip()]


def _report(lines):
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("{"):
            try:
                found = json.loads(line)
            except ValueError:
                continue
            if isinstance(found, dict) and "results" in found:
                return found
    return None


def listener_state(container, lines, report):
    """What the preflight's findings read of the listener: it could not listen (the probe's
    listen_error), or its container ended before any report (the exit code and last lines)."""
    if report is not None:
        error = report.get("listen_error") or ""
        if error:
            return {"state": "exited", "exit_code": 3, "log_lines": [error], "error": ""}
        return {"state": "running", "exit_code": None, "log_lines": [], "error": ""}
    return {
        "state": container.get("state"),
        "exit_code": container.get("exit_code"),
        "log_lines": lines[-5:],
        "error": "",
    }


def gathered_reads(report):
    """The reports rank 0's probe gathered (popped from its `report`) -> {node: a read as
    collect returns it}; their probes end on their own nodes once their peers reached them."""
    found = report.pop("gathered", None) if report is not None else None
    if not isinstance(found, dict):
        return {}
    return dict(
        (
            node,
            dict(
                changed=False,
                container={"state": "gathered"},
                log_lines=[],
                report=theirs,
                error="",
                listener=listener_state({}, [], theirs),
            ),
        )
        for node, theirs in found.items()
        if isinstance(theirs, dict) and "results" in theirs
    )


def collect(docker, params, check_mode, clock=time.time, sleep=time.sleep):
    """Signal the probe, wait (at most O(wait) s) for its report, then remove its container
    (see END_GRACE_S). Raises DockerError."""
    name, tail = params["name"], params["tail"]
    raw = docker.inspect_container(name)
    if raw is None:
        container = job.container_state(raw)
        return dict(
            changed=False,
            container=container,
            log_lines=[],
            report=None,
            error="no probe container %s on this node: its start failed" % name,
            listener=listener_state(container, [], None),
            gathered={},
        )
    if _running(raw) and not check_mode:
        docker.kill_container(name, GO)
    deadline = clock() + params["wait"]
    while True:
        lines = _lines(docker, name, tail)
        report = _report(lines)
        if report is not None or not _running(raw) or clock() >= deadline:
            gathered = gathered_reads(report)
            break
        sleep(POLL_S)
        raw = docker.inspect_container(name) or {}
    healthy = report is not None and not report.get("listen_error")
    if healthy and all(r.get("ok") for r in report.get("results", [])):
        end = clock() + END_GRACE_S
        while _running(raw) and clock() < end:
            sleep(POLL_S / 2)
            raw = docker.inspect_container(name) or {}
    container = job.container_state(raw)
    removed = bool(raw) and not check_mode and docker.remove_container(name)
    if report is not None:
        error = ""
    elif container.get("state") == "running":
        error = "the probe printed no report within %s s" % params["wait"]
    else:
        error = " ".join(" ".join(lines[-5:]).split())[:500] or "the probe ended with no output"
    return dict(
        changed=removed,
        container=container,
        log_lines=lines[-tail:],
        report=report,
        error=error,
        listener=listener_state(container, lines, report),
        gathered=gathered,
    )


def run(docker, params, check_mode):
    """The module's result. Raises DockerError."""
    if params["state"] == "started":
        return dict(changed=True, changes=start(docker, params, check_mode))
    return collect(docker, params, check_mode)
