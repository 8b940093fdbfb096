# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for hostnet.llamafactory.hub_cache (see plugins/modules/hub_cache.py).

look and stop: one module call. download and pull: started in the background on the node,
polled every `interval` seconds, a progress line every `progress_every` seconds, stopped at
`timeout` with how far they got, a failure named with its fix (_hub_report). serve: started,
then waited for until it listens (bounded).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _hub_report as report

display = Display()

MODULE = "hostnet.llamafactory.hub_cache"
SERVE_START_S = 30


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        self._task_vars = task_vars
        args = dict(self._task.args)
        action = args.get("step")
        phase = args.get("phase", "start")
        if action == "look" or phase != "start":
            return self._finish(result, self._call(args))
        started = self._call(args)
        if started.get("failed") or started.get("unreachable") or started.get("state") == "check":
            return self._finish(result, started)
        host = task_vars["inventory_hostname"]
        first = args["repos"][0]
        repo = ("dataset " if first.get("repo_type") == "dataset" else "") + first["repo_id"]
        timeout = float(args.get("timeout", 3600))
        interval = float(args.get("interval", 1))
        every = float(args.get("progress_every", 30))
        begun = time.time()
        if action == "serve":
            return self._serving(result, args, host, repo, begun)
        verb = {
            "download": "downloading %s from the Hub" % repo,
            "pull": "copying %s from %s" % (repo, args.get("source")),
        }[action]
        display.display("[%s] %s (timeout %d s)" % (host, verb, timeout))
        shown = begun
        while True:
            time.sleep(interval)
            state = self._call(dict(args, phase="poll"))
            now = time.time()
            if state.get("failed") or state.get("unreachable"):
                return self._finish(result, state)
            elapsed = now - begun
            if state.get("state") == "done":
                display.display("[%s] %s: done, %s" % (host, verb, report.describe(state, elapsed)))
                state.update(elapsed=round(elapsed, 1))
                return self._finish(result, state)
            if state.get("state") == "failed":
                state.pop("invocation", None)
                result.update(state)
                result.update(
                    failed=True,
                    msg=report.failure(action, args["repos"][0], args.get("endpoint"), state, host),
                )
                return result
            if elapsed > timeout:
                self._call(dict(args, phase="stop"))
                result.update(
                    failed=True,
                    state="timed_out",
                    msg="%s did not finish within %d s (llamafactory_hub_timeout): %s; it was "
                    "stopped - a run again resumes it. Raise llamafactory_hub_timeout for a large "
                    "model on a slow link." % (verb, timeout, report.describe(state, elapsed)),
                )
                return result
            if now - shown >= every:
                display.display("[%s] %s: %s" % (host, verb, report.describe(state, elapsed)))
                shown = now

    def _serving(self, result, args, host, repo, begun):
        while time.time() - begun < SERVE_START_S:
            state = self._call(dict(args, phase="poll"))
            if state.get("failed") or state.get("state") == "failed":
                state.pop("invocation", None)
                result.update(state)
                result.update(
                    failed=True, msg=report.failure("serve", args["repos"][0], None, state, host)
                )
                return result
            if state.get("state") == "serving":
                names = ", ".join(r["repo_id"] for r in args["repos"])
                display.display(
                    "[%s] serving %s to the other nodes on %s:%s"
                    % (host, names, args["address"], args["port"])
                )
                return self._finish(result, dict(state, changed=False))
            time.sleep(0.3)
        result.update(
            failed=True,
            msg="the copy's server on %s did not start within %d s" % (host, SERVE_START_S),
        )
        return result

    def _call(self, args):
        return self._execute_module(module_name=MODULE, module_args=args, task_vars=self._task_vars)

    @staticmethod
    def _finish(result, report_):
        report_.pop("invocation", None)
        result.update(report_)
        return result
