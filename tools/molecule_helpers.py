"""Helpers for the molecule scenarios' testinfra tests: run a playbook on one test host through
ansible-runner (assertions then look at its events), and load a local image into its dockerd."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import ansible_runner

ROOT = Path(__file__).resolve().parents[1]


def run_playbook(host, playbook: Path, tmp_path: Path, **extravars) -> tuple[int, int, str]:
    """(return code, number of changed tasks, the msg of every failed or debug task)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    env = {
        "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".cache" / "collections"),
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
    }
    runner = ansible_runner.run(
        private_data_dir=str(tmp_path),
        playbook=str(playbook),
        inventory=os.environ["MOLECULE_INVENTORY_FILE"],
        limit=host.backend.get_hostname(),
        extravars=extravars,
        envvars=env,
        quiet=True,
        timeout=900,
    )
    messages = []
    for event in runner.events:
        res = event.get("event_data", {}).get("res") or {}
        if event.get("event") in ("runner_on_failed", "runner_on_ok") and "msg" in res:
            messages.append(str(res["msg"]))
    changed = sum(runner.stats.get("changed", {}).values()) if runner.stats else -1
    return runner.rc, changed, "\n".join(messages)


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
