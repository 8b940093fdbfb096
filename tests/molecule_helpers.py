"""Helpers for the molecule scenarios' testinfra tests: run a playbook on one test host through
ansible-runner (assertions then look at its events), and load a local image into its dockerd."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import ansible_run


def run_playbook(host, playbook: Path, tmp_path: Path, **extravars) -> tuple[int, int, str]:
    """(return code, number of changed tasks, the msg of every failed or debug task)."""
    result = ansible_run.run(
        tmp_path,
        os.environ["MOLECULE_INVENTORY_FILE"],
        playbook=playbook,
        limit=host.backend.get_hostname(),
        extravars=extravars,
        timeout=900,
    )
    changed = sum(result.stats.get("changed", {}).values()) if result.stats else -1
    return result.rc, changed, "\n".join(result.messages())


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
