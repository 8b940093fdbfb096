"""Helpers for the molecule scenarios' testinfra tests: run a playbook on one test host through
ansible-runner (assertions then look at its events), and load a local image into its dockerd."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import ansible_run


def run_playbook(host, playbook: Path, tmp_path: Path, **extravars) -> tuple[int, int, str]:
    """(return code, number of changed tasks, the msg of every failed or debug task)."""
    return run_playbook_tasks(host, playbook, tmp_path, **extravars)[:3]


def run_playbook_tasks(
    host, playbook: Path, tmp_path: Path, **extravars
) -> tuple[int, int, str, list[str]]:
    """run_playbook's, and the names of the tasks that ran, were skipped or failed, in order."""
    result = ansible_run.run(
        tmp_path,
        os.environ["MOLECULE_INVENTORY_FILE"],
        playbook=playbook,
        limit=host.backend.get_hostname(),
        extravars=extravars,
        timeout=900,
    )
    changed = sum(result.stats.get("changed", {}).values()) if result.stats else -1
    tasks = [
        event["event_data"].get("task")
        for event in result.events
        if event.get("event") in ("runner_on_ok", "runner_on_skipped", "runner_on_failed")
    ]
    return result.rc, changed, "\n".join(result.messages()), tasks


def load_image(host, image: str) -> None:
    """docker save IMAGE on this machine | docker load in the test host's own dockerd."""
    name = host.backend.get_hostname()
    with subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE) as save:
        subprocess.run(
            ["docker", "exec", "-i", name, "docker", "load", "-q"],
            stdin=save.stdout,
            check=True,
            capture_output=True,
            timeout=120,
        )
        save.stdout.close()
