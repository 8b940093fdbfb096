"""playbooks/train.yml reads as the plan: its header names the steps, one play per step, in
order, each play named after its step and tagged with the step's tag."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "playbooks" / "train.yml"
# "#   4 host setup Docker, ...   host_setup": number, step, what it does, tag.
STEP = re.compile(r"^#\s+(\d+) (\w+(?: setup)?)\s+.*?\s{2,}\(?(\w+)\)?$")


def header_steps(text: str) -> list[tuple[str, str]]:
    steps = []
    for line in text.splitlines():
        found = STEP.match(line)
        if found:
            assert int(found[1]) == len(steps) + 1, line
            steps.append((found[2], found[3]))
    return steps


def test_every_step_of_the_header_is_one_play_in_order():
    steps = header_steps(TRAIN.read_text())
    assert [step[0] for step in steps] == [
        "validate",
        "discover",
        "firewall",
        "host setup",
        "preflight",
        "launch",
        "collect",
        "VMs",
    ]
    plays = [
        p for p in yaml.safe_load(TRAIN.read_text()) if "ansible.builtin.import_playbook" not in p
    ]
    assert len(plays) == len(steps)
    for (name, tag), play in zip(steps, plays, strict=True):
        assert play["name"].lower().startswith(name.lower() + " - "), (name, play["name"])
        assert play.get("hosts") == "llamafactory", play["name"]
        assert tag in play.get("tags", []), (name, tag, play.get("tags"))


def test_the_imports_are_the_vms_then_the_inventory_guard_first():
    entries = yaml.safe_load(TRAIN.read_text())
    imports = [i for i, p in enumerate(entries) if "ansible.builtin.import_playbook" in p]
    assert imports == [0, 1]
    assert [entries[i]["ansible.builtin.import_playbook"] for i in imports] == [
        "up.yml",
        "require_nodes.yml",
    ]


def test_no_task_file_includes_itself():
    for path in sorted((ROOT / "roles").glob("*/tasks/*.yml")):

        def includes(node):
            if isinstance(node, list):
                for item in node:
                    yield from includes(item)
            elif isinstance(node, dict):
                for key in ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks"):
                    if key in node:
                        value = node[key]
                        yield value["file"] if isinstance(value, dict) else value
                for key in ("block", "rescue", "always"):
                    yield from includes(node.get(key))

        assert path.name not in set(includes(yaml.safe_load(path.read_text()))), path


def test_the_header_parser_reads_each_kind_of_line():
    assert header_steps("#   1 host setup Docker, the runtime   host_setup\n#   x\n") == [
        ("host setup", "host_setup")
    ]
    assert header_steps("#   1 validate   on the controller   (always)\n") == [
        ("validate", "always")
    ]
