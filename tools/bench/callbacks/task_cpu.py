"""Controller CPU per task, for ./dev bench's task profile (not part of the collection).

From one task's start to the next one's (as ansible.posix.profile_tasks times them), the CPU
seconds (user + system) of ansible-playbook and of every process it has reaped: the workers it
forks for each host and task, and the ssh clients they ran (a task's workers are reaped when
the next task starts, which waits at most 0.2 s for them to exit). A task run more than once (an
included file's) is summed. Written as JSON {task name: seconds} to $TASK_CPU_OUT at the end.
ssh's ControlMaster processes detach, so their handshakes are not counted.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: task_cpu
type: aggregate
short_description: controller CPU seconds per task, as JSON to $TASK_CPU_OUT
description: See the module docstring (tools/bench/callbacks/task_cpu.py).
"""


def cpu_now(grace_s: float = 0.2) -> float:
    # A task starts once every result of the one before is in; its workers are exiting. Reap
    # them (multiprocessing's own join), waiting at most grace_s, so that their CPU counts for
    # their task and not when Ansible next starts a worker.
    deadline = time.monotonic() + grace_s
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.005)
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def attribute(marks: list[tuple[str | None, float]]) -> dict[str, float]:
    """(task or None, CPU reading at its start) in order, the last one the end -> task -> CPU
    seconds from its start to the next mark's (summed over repeats; None is not a task)."""
    spent: dict[str, float] = {}
    for (task, start), (_next, end) in itertools.pairwise(marks):
        if task is not None:
            spent[task] = round(spent.get(task, 0.0) + end - start, 3)
    return spent


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_cpu"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._marks: list[tuple[str | None, float]] = [(None, cpu_now())]

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._marks.append((task.get_name(), cpu_now()))

    def v2_playbook_on_handler_task_start(self, task):
        self._marks.append((task.get_name(), cpu_now()))

    def v2_playbook_on_play_start(self, play):
        self._marks.append((None, cpu_now()))

    def v2_playbook_on_stats(self, stats):
        self._marks.append((None, cpu_now()))
        out = os.environ.get("TASK_CPU_OUT")
        if out:
            with open(out, "w") as handle:
                json.dump(attribute(self._marks), handle, indent=1)
