# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for hostnet.llamafactory.job_wait (see plugins/modules/job_wait.py).

With the ranks' agents (O(agents)), one instance runs, on the lowest rank's node: each round it
queries that rank (the job_status module) and learns every other rank's state from that rank's
agent, which asks every peer every few seconds. Without agents it runs once per node, all nodes
at once: each instance queries its own rank, publishes the report in a folder that every
instance of this task shares on the controller and reads the others'. Either way every instance
draws the same conclusion - running, finished, failed or stalled - and stops its own rank after
a failure; the verdict with the reasons is the filter job_outcome's, over every node's report.
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
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _job_state as job

display = Display()

ARGUMENT_SPEC = dict(
    name=dict(type="str", required=True),
    job=dict(type="str", required=True),
    output_dir=dict(type="str", required=True),
    agent_state=dict(type="str"),
    agents=dict(type="bool", default=False),
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
        # The node the wait runs on: the delegated one (run_once on rank 0), else the task's.
        host = self._task.delegate_to or task_vars["inventory_hostname"]
        ranks = dict((h, int(r)) for h, r in args["ranks"].items())
        if host not in ranks:
            result.update(failed=True, msg="%s is not in ranks (%s)" % (host, sorted(ranks)))
            return result
        leader = min(ranks, key=ranks.get) == host
        if args["agents"] and not leader:
            result.update(
                failed=True,
                msg="with agents the wait runs on the lowest rank's node only (%s), not on %s"
                % (min(ranks, key=ranks.get), host),
            )
            return result
        if args["agents"] and not args["agent_state"]:
            result.update(failed=True, msg="agents needs agent_state (the agent's state file)")
            return result
        shared = None
        if not args["agents"]:
            shared = os.path.join(C.DEFAULT_LOCAL_TMP, "job-wait-%s" % self._task._uuid)
            os.makedirs(shared, exist_ok=True)
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
            if args["agents"]:
                reports = job.agent_reports(report, ranks, host, now)
                reports[host] = report
                missing = []
            else:
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
            own = (report.get("container") or {}).get("state")
            if args["agents"] and outcome["state"] == "running" and own not in job.RUNNING_STATES:
                # Its agent has ended: it tells no more of the others (every node's report
                # after the wait does).
                outcome["state"] = "ended"
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
            result.update(
                state=outcome["state"],
                progress=outcome.get("progress"),
                line=outcome["line"],
                elapsed=round(elapsed, 1),
            )
            if outcome["state"] in ("failed", "stalled"):
                # Stop this rank at once: with agents, the others' agents stop theirs on seeing
                # it exit; every node's report after the wait stops what still runs.
                stopped = own in job.RUNNING_STATES and bool(
                    self._query(args, stop=True).get("changed")
                )
                result.update(
                    changed=stopped,
                    stopped=stopped,
                    quiet=outcome.get("quiet"),
                    failed_hosts=outcome.get("failed", []),
                    reasons=outcome.get("reasons", {}),
                )
                return result
            if outcome["state"] in ("finished", "ended"):
                result.update(changed=False, checkpoints=report.get("checkpoints", []))
                return result
            if elapsed > args["timeout"]:
                result.update(
                    state="running",
                    msg="job %s is still running after %d s (launch_wait_timeout): %s. "
                    "It was left running: follow it with playbooks/status.yml, stop it with "
                    "playbooks/stop.yml." % (args["job"], args["timeout"], outcome["line"]),
                )
                return result
            time.sleep(args["interval"])

    def _query(self, args, stop=False):
        try:
            return self._query_once(args, stop)
        except AnsibleError as exc:  # the node is gone (its VM stopped, SSH cut): not fatal
            return {"container": {"state": "unknown"}, "error": str(exc)}

    def _query_once(self, args, stop=False):
        report = self._execute_module(
            module_name="hostnet.llamafactory.job_status",
            module_args=dict(
                name=args["name"],
                output_dir=args["output_dir"],
                agent_state=args["agent_state"],
                tail=args["tail"],
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
