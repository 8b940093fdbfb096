# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for hostnet.llamafactory.job_wait (see plugins/modules/job_wait.py).

Runs on the controller once per node, all nodes at once. Each round a node's instance queries
its own rank (the job_status module, over the node's own connection), publishes the report in a
folder that every instance of this task shares on the controller, reads the other ranks'
reports, and draws the same conclusion as the others: running, finished, failed or stalled. On
failure every instance stops its own rank at once, so no rank is left hanging.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import tempfile
import time

from ansible import constants as C
from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _diagnosis as diagnosis
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _job_state as job

display = Display()

# On failure: log lines each rank hands to the diagnosis, and how long rank 0 waits for them.
FINAL_TAIL = 2000
FINAL_WAIT_S = 20

ARGUMENT_SPEC = dict(
    name=dict(type="str", required=True),
    job=dict(type="str", required=True),
    output_dir=dict(type="str", required=True),
    agent_state=dict(type="str"),
    ranks=dict(type="dict", required=True),
    timeout=dict(type="int", default=86400),
    stall_timeout=dict(type="int", default=1800),
    interval=dict(type="float", default=10.0),
    progress_every=dict(type="float", default=30.0),
    stop_timeout=dict(type="int", default=10),
    tail=dict(type="int", default=40),
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
        if self._task.check_mode:
            result.update(skipped=True, msg="check mode: not waiting for the job")
            return result
        host = task_vars["inventory_hostname"]
        ranks = dict((h, int(r)) for h, r in args["ranks"].items())
        if host not in ranks:
            result.update(failed=True, msg="%s is not in ranks (%s)" % (host, sorted(ranks)))
            return result
        shared = os.path.join(C.DEFAULT_LOCAL_TMP, "job-wait-%s" % self._task._uuid)
        if not os.path.isdir(shared):
            os.makedirs(shared, exist_ok=True)
        leader = min(ranks, key=ranks.get) == host
        # A rank whose report is older than this stopped answering (SSH, node down).
        stale_after = max(120.0, 6 * args["interval"])
        started = time.time()
        shown, shown_at = None, 0.0
        restarts_shown = 0
        result["restarts"] = []
        controller = os.getppid()  # ansible-playbook's main process (this runs in its fork)
        while True:
            if os.getppid() != controller:
                # The controller was killed (not Ctrl-C, which ends its forks too): leave the
                # job alone; the ranks' agents watch each other (see roles/launch).
                result.update(failed=True, state="unknown", msg="the controller went away")
                return result
            report = self._query(args)
            now = time.time()
            report.update(rank=ranks[host], received=now)
            self._publish(shared, host, report)
            reports = self._collect(shared, ranks)
            missing = [h for h in ranks if h not in reports]
            if missing and now - started > stale_after:
                for h in missing:
                    reports[h] = {"rank": ranks[h], "received": started - stale_after - 1}
            if missing and now - started <= stale_after:
                outcome = {"state": "running", "line": "waiting for %s" % ", ".join(missing)}
            else:
                outcome = job.verdict(reports, now, args["stall_timeout"], stale_after)
            elapsed = now - started
            restarts = (report.get("agent") or {}).get("restarts") or []
            result["restarts"] = restarts
            if leader:
                for restart in restarts[restarts_shown:]:
                    display.display("[%s] %s" % (args["job"], restart.get("message", restart)))
                restarts_shown = len(restarts)
            if leader and (outcome["line"] != shown or now - shown_at >= args["progress_every"]):
                display.display(
                    "[%s] %s | %.0f s of %d s"
                    % (args["job"], outcome["line"], elapsed, args["timeout"])
                )
                shown, shown_at = outcome["line"], now
            if outcome["state"] in ("failed", "stalled"):
                return self._fail_all(result, args, host, leader, outcome, reports, shared)
            if outcome["state"] == "finished":
                result.update(
                    changed=False,
                    state="finished",
                    progress=outcome.get("progress"),
                    elapsed=round(elapsed, 1),
                    line=outcome["line"],
                    checkpoints=report.get("checkpoints", []),
                )
                return result
            if elapsed > args["timeout"]:
                result.update(
                    failed=True,
                    state="running",
                    msg="job %s is still running after %d s (launch_wait_timeout): %s. "
                    "It was left running: follow it with playbooks/status.yml, stop it with "
                    "playbooks/stop.yml." % (args["job"], args["timeout"], outcome["line"]),
                )
                return result
            time.sleep(args["interval"])

    def _query(self, args, stop=False, tail=None):
        try:
            return self._query_once(args, stop, tail)
        except AnsibleError as exc:  # the node is gone (its VM stopped, SSH cut): not fatal
            return {"container": {"state": "unknown"}, "error": str(exc)}

    def _query_once(self, args, stop=False, tail=None):
        report = self._execute_module(
            module_name="hostnet.llamafactory.job_status",
            module_args=dict(
                name=args["name"],
                output_dir=args["output_dir"],
                agent_state=args["agent_state"],
                tail=tail or args["tail"],
                stop=stop,
                stop_timeout=args["stop_timeout"],
                docker_socket=args["docker_socket"],
                docker_timeout=args["docker_timeout"],
            ),
            task_vars=self._task_vars,
        )
        if report.get("failed") or report.get("unreachable"):
            # Reported as a lost rank: the others see a container in an unknown state.
            return {"container": {"state": "unknown"}, "error": report.get("msg", "")}
        return report

    @staticmethod
    def _publish(shared, host, report, kind="json"):
        fd, path = tempfile.mkstemp(dir=shared, prefix=".%s." % host)
        with os.fdopen(fd, "w") as handle:
            json.dump(report, handle)
        os.rename(path, os.path.join(shared, "%s.%s" % (host, kind)))

    @staticmethod
    def _collect(shared, ranks, kind="json"):
        reports = {}
        for h in ranks:
            try:
                with open(os.path.join(shared, "%s.%s" % (h, kind))) as handle:
                    reports[h] = json.load(handle)
            except (IOError, OSError, ValueError):
                continue
        return reports

    def _fail_all(self, result, args, host, leader, outcome, reports, shared):
        own = reports[host]
        running = (own.get("container") or {}).get("state") in ("running", "restarting", "paused")
        # Stop this rank, and publish a longer log for the diagnosis: the cause is often far
        # above the last lines (a traceback, repeated warnings).
        final = self._query(args, stop=running, tail=FINAL_TAIL)
        final.update(rank=own.get("rank"), received=own.get("received"))
        self._publish(shared, host, final, kind="final")
        if leader:
            deadline = time.time() + FINAL_WAIT_S
            finals = self._collect(shared, reports, kind="final")
            while len(finals) < len(reports) and time.time() < deadline:
                time.sleep(0.5)
                finals = self._collect(shared, reports, kind="final")
            for h, report in finals.items():
                if report.get("log_lines"):
                    reports[h] = dict(reports[h], log_lines=report["log_lines"])
        result.update(failed=True, state=outcome["state"], changed=True)
        if outcome["state"] == "stalled":
            message = (
                "job %s stalled: no rank wrote a log line for %.0f s "
                "(launch_stall_timeout); every rank was stopped. A rendezvous that never "
                "completes looks like this (two nodes at one node rank, a closed port, "
                "MASTER_ADDR on the wrong network)." % (args["job"], outcome.get("quiet", 0))
            )
            findings = diagnosis.diagnose(
                dict((h, "\n".join(r.get("log_lines") or [])) for h, r in reports.items())
            )
            for finding in findings:
                message += "\nCause (%s): %s\nFix: %s" % (
                    finding["id"],
                    finding["cause"],
                    finding["fix"],
                )
        elif leader:
            message = job.failure_message(args["job"], outcome, reports, diagnosis.diagnose)
        else:
            first = outcome["failed"][0]
            message = "rank %s stopped: job %s failed on rank %s (%s %s); see rank 0's message" % (
                reports[host].get("rank"),
                args["job"],
                reports[first].get("rank"),
                first,
                outcome["reasons"][first],
            )
        findings = diagnosis.diagnose(
            dict((h, "\n".join(r.get("log_lines") or [])) for h, r in reports.items())
        )
        result.update(
            msg=message,
            failed_ranks=[reports[h].get("rank") for h in outcome.get("failed", [])],
            progress=outcome.get("progress"),
            restart=job.restart_advice(outcome, reports, findings),
        )
        return result
