"""The one way the tests run Ansible: a playbook or a module through ansible-runner, as a user runs
it (this checkout's ansible.cfg and collections, host keys checked), and what came of it.

ansible-runner sets ANSIBLE_HOST_KEY_CHECKING=False unless told otherwise, and ssh then takes
`-o StrictHostKeyChecking=no` before the inventory's own options: a VM whose key changed would
still be reached. Every run here sets it back to True.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import ansible_runner

ROOT = Path(__file__).resolve().parents[1]
# ansible-runner starts ansible/ansible-playbook from PATH: use this venv's.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
ENV = {
    "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
    "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".cache" / "collections"),
    "ANSIBLE_HOST_KEY_CHECKING": "True",
}


@dataclass
class Run:
    """What a run left: its return code, recap, events, and views of them."""

    rc: int
    stats: dict
    events: list = field(repr=False)
    # How the run was told to reach its hosts: for the hosts' addresses (facts()).
    inventory: object = field(default=None, repr=False)
    envvars: dict = field(default_factory=dict, repr=False)

    def addresses(self) -> dict[str, str]:
        """ansible_host (the name where unset) -> inventory host, from ansible-inventory."""
        listed = subprocess.run(
            ["ansible-inventory", "-i", str(self.inventory), "--list"],
            env={**os.environ, **ENV, **self.envvars},
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        hostvars = json.loads(listed.stdout).get("_meta", {}).get("hostvars", {})
        return {str(v.get("ansible_host", h)): h for h, v in hostvars.items()}

    def results(self) -> dict[str, list[dict]]:
        """host -> task results in order ({'task', 'ok', 'res'})."""
        results: dict[str, list[dict]] = {}
        for event in self.events:
            kind = event.get("event")
            if kind in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable"):
                data = event["event_data"]
                results.setdefault(data["host"], []).append(
                    {"task": data.get("task"), "ok": kind == "runner_on_ok", "res": data["res"]}
                )
        return results

    def facts(self) -> dict[str, dict]:
        """host -> the facts set along the way, merged in order (loop items included). The
        facts of a delegated task go to the delegated host, as delegate_facts does (the
        collection delegates no other task that returns facts)."""
        addresses = None
        facts: dict[str, dict] = {host: {} for host in self.results()}
        for event in self.events:
            data = event.get("event_data", {})
            if event.get("event") not in ("runner_on_ok", "runner_item_on_ok"):
                continue
            res = data["res"]
            host = data["host"]
            delegated = (res.get("_ansible_delegated_vars") or {}).get("ansible_host")
            if delegated and res.get("ansible_facts"):
                addresses = self.addresses() if addresses is None else addresses
                host = addresses.get(delegated, host)
            facts.setdefault(host, {}).update(res.get("ansible_facts") or {})
        return facts

    def failures(self) -> dict[str, dict]:
        """host -> {'task', 'msg'} of its last failure that was not ignored."""
        failures = {}
        for event in self.events:
            data = event.get("event_data", {})
            if event.get("event") == "runner_on_failed" and not data.get("ignore_errors"):
                failures[data["host"]] = {
                    "task": data.get("task"),
                    "msg": data["res"].get("msg", ""),
                }
        return failures

    def unreachable(self) -> list[str]:
        return [
            event["event_data"]["host"]
            for event in self.events
            if event.get("event") == "runner_on_unreachable"
        ]

    def messages(self) -> list[str]:
        """The msg of every task that printed or failed (loop items included), in order."""
        messages = []
        for event in self.events:
            res = event.get("event_data", {}).get("res") or {}
            if event.get("event") in ("runner_on_failed", "runner_on_ok"):
                if "msg" in res:
                    messages.append(str(res["msg"]))
                messages.extend(
                    str(item["msg"]) for item in res.get("results", []) if "msg" in item
                )
        return messages

    def changed(self) -> dict[str, int]:
        """host -> changed tasks, for the hosts with any."""
        return {host: n for host, n in (self.stats.get("changed") or {}).items() if n}


def run(
    private_data_dir: Path,
    inventory,
    *,
    playbook: str | Path | None = None,
    module: str | None = None,
    module_args: str | None = None,
    hosts: str = "llamafactory",
    extravars: dict | None = None,
    check: bool = False,
    forks: int | None = None,
    limit: str | None = None,
    envvars: dict | None = None,
    timeout: int = 600,
    skip_tags: str | None = None,
) -> Run:
    """Run `playbook` (a path, relative to the checkout or absolute) or `module` on `hosts`."""
    private_data_dir = Path(private_data_dir)
    private_data_dir.mkdir(parents=True, exist_ok=True)
    kwargs = {"playbook": str(ROOT / playbook)} if playbook else {}
    if module:
        kwargs.update(module=module, module_args=module_args, host_pattern=hosts)
    runner = ansible_runner.run(
        private_data_dir=str(private_data_dir),
        inventory=inventory,
        extravars=extravars or {},
        envvars={**ENV, **(envvars or {})},
        cmdline="--check" if check else None,
        forks=forks,
        limit=limit,
        skip_tags=skip_tags,
        quiet=True,
        timeout=timeout,
        **kwargs,
    )
    return Run(runner.rc, runner.stats or {}, list(runner.events), inventory, {**(envvars or {})})


def module(module_name: str, tmp_path: Path, path: str, /, **args) -> dict:
    """The collection's module `module_name` run as Ansible runs it on a node (its own process, the
    arguments as JSON), with PATH set to `path`; its result."""
    (tmp_path / "args.json").write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = {"PATH": path, "PYTHONPATH": ENV["ANSIBLE_COLLECTIONS_PATH"], "HOME": str(tmp_path)}
    source = ROOT / "plugins" / "modules" / f"{module_name}.py"
    done = subprocess.run(
        [sys.executable, str(source), str(tmp_path / "args.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    return json.loads(done.stdout)
