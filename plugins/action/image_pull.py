# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for hostnet.llamafactory.image_pull (see plugins/modules/image_pull.py).

Starts the pull in the background on the node, polls it every `interval` seconds, prints a
progress line when `progress_every` seconds have passed, and cancels it at `timeout`.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _pull_report as pull

display = Display()

MODULE = "hostnet.llamafactory.image_pull"
ARGUMENT_SPEC = dict(
    name=dict(type="str", required=True),
    pull=dict(type="str", choices=["always", "not_present", "never"], default="not_present"),
    username=dict(type="str"),
    password=dict(type="str", no_log=True),
    timeout=dict(type="int", default=3600),
    interval=dict(type="float", default=2.0),
    progress_every=dict(type="float", default=30.0),
    docker_socket=dict(type="path", default="/var/run/docker.sock"),
    docker_timeout=dict(type="int", default=60),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        _valid, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        self._task_vars = task_vars
        host = task_vars["inventory_hostname"]
        name = args["name"]
        started = self._call(args, "start")
        if started.get("failed") or started.get("unreachable"):
            return self._finish(result, started)
        if started["state"] in ("present", "absent"):  # nothing to pull, or check mode
            return self._finish(result, started)
        begun = time.time()
        display.display(
            "[%s] pulling %s (llamafactory_pull_timeout %d s, credentials: %s)"
            % (host, name, args["timeout"], started.get("credentials", "as before"))
        )
        shown_at, last = begun, (begun, 0)
        while True:
            time.sleep(args["interval"])
            report = self._call(args, "poll")
            now = time.time()
            if report.get("failed") or report.get("unreachable"):
                return self._finish(result, report)
            snapshot = report.get("progress") or {}
            elapsed = now - begun
            if report["state"] == "pulled":
                line = pull.describe(snapshot, elapsed=elapsed)
                display.display("[%s] pulled %s: %s" % (host, name, line))
                report.update(elapsed=round(elapsed, 1))
                return self._finish(result, report)
            if report["state"] == "failed":
                return self._failed(result, report, name, elapsed)
            if elapsed > args["timeout"]:
                self._call(args, "cancel")
                result.update(
                    failed=True,
                    state="timed_out",
                    progress=snapshot,
                    msg="the pull of %s did not finish within llamafactory_pull_timeout (%d s): "
                    "%s. "
                    "Raise llamafactory_pull_timeout for large images on slow links, or check the "
                    "node's path to the registry; the pull was cancelled."
                    % (name, args["timeout"], pull.describe(snapshot)),
                )
                return result
            if now - shown_at >= args["progress_every"]:
                got = snapshot.get("downloaded") or 0
                rate = (got - last[1]) / max(now - last[0], 0.001)
                display.display(
                    "[%s] pulling %s: %s"
                    % (host, name, pull.describe(snapshot, elapsed=elapsed, rate=rate))
                )
                shown_at, last = now, (now, got)

    def _call(self, args, phase):
        module_args = dict(
            (key, args[key])
            for key in (
                "name",
                "pull",
                "username",
                "password",
                "timeout",
                "docker_socket",
                "docker_timeout",
            )
            if args.get(key) is not None
        )
        module_args["phase"] = phase
        return self._execute_module(
            module_name=MODULE, module_args=module_args, task_vars=self._task_vars
        )

    @staticmethod
    def _finish(result, report):
        report.pop("invocation", None)
        result.update(report)
        return result

    @staticmethod
    def _failed(result, report, name, elapsed):
        error = report.get("error") or "unknown error"
        cause, fix = pull.explain(error, name)
        message = "pulling %s failed after %.0f s: %s" % (name, elapsed, error)
        if cause:
            message += "\nCause: %s\nFix: %s" % (cause, fix)
        report.pop("invocation", None)
        result.update(report)
        result.update(failed=True, msg=message)
        return result
