# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's side of node_survey: the playbook run's mark on a survey, and whether a survey
answers a later read (docker_host_facts, job_status), with the answer narrowed to that read's
question. The action plugins of those modules use it to skip the round trip."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ansible.plugins.action import ActionBase
from ansible_collections.hostnet.llamafactory.plugins.module_utils import (
    _docker_host as docker_host,
)
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _job_status as job_status
from ansible_collections.hostnet.llamafactory.plugins.module_utils._job import labels_match


def _defaults(options):
    """What a module takes for each option that is not given (its argument spec)."""
    return dict((name, spec.get("default")) for name, spec in options.items())


DOCKER_HOST_DEFAULTS = _defaults(docker_host.OPTIONS)
JOB_DEFAULTS = _defaults(job_status.OPTIONS)


def run_identity(pid=None, proc="/proc"):
    """This playbook run: the ansible-playbook process that forked the worker (its PID and, where
    /proc has it, its start time, so that a reused PID is another run)."""
    pid = os.getppid() if pid is None else pid
    started = ""
    try:
        with open(os.path.join(proc, str(pid), "stat")) as handle:
            # Field 22 (starttime) counts from the one after the command's closing parenthesis.
            started = handle.read().rsplit(")", 1)[1].split()[19]
    except (IOError, OSError, IndexError):
        pass
    return "%d:%s" % (pid, started)


def _same(one, other):
    """Equal as Ansible's argument spec would make them (5 and '5', True and 'True')."""
    if isinstance(one, dict) and isinstance(other, dict):
        return sorted(one) == sorted(other) and all(_same(one[k], other[k]) for k in one)
    if isinstance(one, (list, tuple)) and isinstance(other, (list, tuple)):
        return len(one) == len(other) and all(_same(a, b) for a, b in zip(one, other, strict=True))
    if one is None or other is None:
        return one is other
    return str(one) == str(other)


def _true(value):
    return str(value).lower() in ("true", "yes", "on", "1")


def _part(survey, name, run):
    """The survey's part `name` ({question, answer}) when this run made it, else None."""
    if not isinstance(survey, dict) or survey.get("run") != run:
        return None
    part = survey.get(name)
    return part if isinstance(part, dict) and "question" in part and "answer" in part else None


def docker_host_answer(survey, args, run):
    """docker_host_facts' result for `args` from the survey, or None when the survey did not
    ask it: the same unit, files and dockerd read, and every package of `args` among its own."""
    part = _part(survey, "docker_host", run)
    if part is None:
        return None
    asked, wanted = part["question"], dict(DOCKER_HOST_DEFAULTS, **args)
    same_reads = ("service", "daemon_json", "pending_marker")
    if not all(_same(wanted[k], asked.get(k)) for k in same_reads):
        return None
    if _true(wanted["dockerd"]) and not _true(asked.get("dockerd")):
        return None
    packages = list(wanted["packages"] or [])
    if not set(packages) <= set(asked.get("packages") or []):
        return None
    answer = dict(part["answer"])
    found = answer.get("packages") or {}
    answer["packages"] = dict((n, found[n]) for n in packages if n in found)
    if not packages:
        answer["missing"] = []
    elif answer.get("missing") is not None:
        answer["missing"] = [n for n in packages if n not in found]
    if not _true(wanted["dockerd"]):
        answer["dockerd_version"] = None
    answer["changed"] = False
    return answer


def job_answer(survey, args, run):
    """job_status' result for `args` from the survey, or None when the survey did not ask it:
    no stop, the same container, folders and socket, and at most the survey's log lines.
    labels_match is worked out here, from the container's labels."""
    if _true(args.get("stop")):
        return None
    part = _part(survey, "job", run)
    if part is None:
        return None
    asked, wanted = part["question"], dict(JOB_DEFAULTS, **args)
    keys = ("name", "output_dir", "agent_state", "docker_socket")
    if not all(_same(wanted.get(k), asked.get(k)) for k in keys):
        return None
    tail = int(wanted["tail"])
    if tail > int(asked.get("tail") or 0):
        return None
    answer = dict(part["answer"])
    answer["log_lines"] = list(answer.get("log_lines") or [])[-tail:] if tail > 0 else []
    answer["labels_match"] = labels_match(answer.get("container") or {}, wanted.get("labels"))
    answer["changed"] = False
    return answer


class SurveyedRead(ActionBase):
    """The action of a read module that a survey can answer: MODULE is the module, ANSWER the
    function above that takes the survey, the task's arguments and this run."""

    TRANSFERS_FILES = False
    _requires_connection = True
    MODULE = None
    ANSWER = None

    def run(self, tmp=None, task_vars=None):
        result = super(SurveyedRead, self).run(tmp, task_vars)
        args = dict(self._task.args)
        answer = type(self).ANSWER(args.pop("survey", None), args, run_identity())
        if answer is not None:
            result.update(answer, surveyed=True)
            return result
        node = self._execute_module(module_name=self.MODULE, module_args=args, task_vars=task_vars)
        result.update(node, surveyed=False)
        return result
