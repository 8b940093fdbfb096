# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A training job's state across its ranks, on the controller: from every node's job_status
report, whether a launch must start, keep or refuse the job (filter launch_decision), and while
waiting whether it runs, finished, failed or stalled, and the message a failure ends with (action
job_wait).

Pure functions over the reports; the node-side parsers are in plugins/module_utils/_job.py.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.hostnet.llamafactory.plugins.module_utils._job import LABEL_DIGEST

# roles/launch/files/rank_agent.py: its agent stopped the rank at the job's time limit.
EXIT_MAX_DURATION = 124


def common_checkpoint(reports):
    """The newest checkpoint step every rank holds completely, or None."""
    sets = [set(r.get("checkpoints") or []) for r in reports]
    if not sets:
        return None
    common = set.intersection(*sets)
    return max(common) if common else None


def _same_job(report, digest):
    # job_status compared the container's labels with the ones this run wants (labels_match).
    if report.get("labels_match") is not None:
        return report["labels_match"]
    labels = (report.get("container") or {}).get("labels") or {}
    return labels.get(LABEL_DIGEST) == report.get("wanted", digest)


def _state(report):
    return (report.get("container") or {}).get("state", "missing")


def _succeeded(report):
    container = report.get("container") or {}
    return container.get("state") == "exited" and container.get("exit_code") == 0


def decide_launch(
    reports, digest=None, restart_allowed=False, job="", restart_var="", ranks=None, durable=None
):
    """What the launch must do, from every rank's report before it:
    keep (the same job is running or finished), launch (nothing there, or it failed or was
    stopped; resume from the newest checkpoint all ranks hold) or refuse (a different config is
    running or finished and a restart was not allowed).
    `reports` maps host -> job_status's report {container, checkpoints, labels_match}:
    labels_match says whether the container carries the digest this run wants for that rank
    (it differs per rank); a report without it is compared with its own `wanted`, else with
    `digest`. `ranks` (host -> rank) orders the hosts where the reports carry no rank.
    `durable`: the steps complete in the output URI's bucket (None without one); the job then
    resumes from the newest of those and the local common ones, and `restore` lists the hosts
    that must download their part first. Without it, a node that holds no checkpoint while
    another does (its disk was lost) is refused rather than started over."""
    ranks = ranks or {}
    hosts = sorted(reports, key=lambda h: reports[h].get("rank", ranks.get(h, 0)))
    running = [h for h in hosts if _state(reports[h]) in ("running", "restarting", "paused")]
    alive = [h for h in hosts if _state(reports[h]) != "missing"]
    same = [h for h in alive if _same_job(reports[h], digest)]
    healthy = [h for h in hosts if h in running or _succeeded(reports[h])]
    result = {
        "action": "launch",
        "stop_first": running,
        "resume": None,
        "fresh": False,
        "restore": [],
    }
    if hosts and len(same) == len(hosts) and len(healthy) == len(hosts):
        state = "running" if running else "finished"
        result.update(action="keep", stop_first=[], why="job %s is already %s" % (job, state))
        result["state"] = state
        return result
    different = [h for h in healthy if not _same_job(reports[h], digest)]
    if different and not restart_allowed:
        result.update(
            action="refuse",
            stop_first=[],
            why="job %s is %s on %s with a different configuration; nothing was changed. To "
            "replace it set %s=true (it resumes from the newest checkpoint all ranks hold), or "
            "give the new run another llamafactory_job name"
            % (
                job,
                "running" if set(different) & set(running) else "finished",
                ", ".join(different),
                restart_var or "launch_restart_on_change",
            ),
        )
        return result
    resume = common_checkpoint([reports[h] for h in hosts])
    holding = dict((h, reports[h].get("checkpoints") or []) for h in hosts)
    bucket = max(durable) if durable else None
    if bucket is not None and (resume is None or bucket > resume):
        resume = bucket
        result["restore"] = [h for h in hosts if bucket not in holding[h]]
    elif any(holding.values()):
        empty = [h for h in hosts if not holding[h]]
        if empty:
            newest = max(max(c) for c in holding.values() if c)
            keeper = [h for h in hosts if newest in holding[h]]
            result.update(
                action="refuse",
                stop_first=[],
                why="job %s: %s hold%s no checkpoint while %s hold%s checkpoint-%d (a disk lost, "
                "replaced or wiped?): a launch would start over and lose %d steps. Nothing was "
                "changed. %s; to start over anyway, remove the job's outputs with "
                "playbooks/cleanup.yml (job_admin_cleanup_outputs=true)"
                % (
                    job,
                    ", ".join(empty),
                    "s" if len(empty) == 1 else "",
                    ", ".join(keeper),
                    "s" if len(keeper) == 1 else "",
                    newest,
                    newest,
                    "llamafactory_output_uri (gs://BUCKET/PREFIX) keeps every checkpoint in a "
                    "bucket and restores a node's part"
                    if durable is None
                    else "no checkpoint of the job is complete in llamafactory_output_uri's "
                    "bucket to restore from",
                ),
            )
            return result
    result["resume"] = resume
    # Checkpoints on some ranks but none common: start over rather than let each rank resume
    # from a different step.
    result["fresh"] = resume is None and any(reports[h].get("checkpoints") for h in hosts)
    if not alive:
        result["why"] = "job %s is not on the nodes: launching" % job
    elif different:
        result["why"] = "job %s changed and launch_restart_on_change allows a restart" % job
    else:
        result["why"] = "job %s did not finish (%s): launching again" % (
            job,
            ", ".join("%s %s" % (h, describe(reports[h])) for h in hosts),
        )
    if resume is not None:
        result["why"] += ", resuming from checkpoint-%d" % resume
    if result["restore"]:
        result["why"] += " (from the bucket on %s)" % ", ".join(result["restore"])
    return result


def record_of(report):
    """What the collect step records on rank 0's node when every rank finished (job_results'
    `record`), from rank 0's last look at its container (`report`): the container it binds to."""
    container = (report or {}).get("container") or {}
    return {"id": container.get("id"), "started_at": container.get("started_at")}


def settled(report, digest, job, ranks, host):
    """A job every rank finished, read from rank 0's node alone: `report` is rank 0's
    job_status read (node_facts' job_state) with `record`, what the collect step of the run that
    saw every rank finish wrote there. It stands for every rank when rank 0's container is the
    one it names, exited 0 with `digest` (this run's for rank 0: the same job, image and
    settings), and the job's nodes and ranks (`ranks`, host -> rank) are the recorded ones.
    Returns {reports: host -> a job_status report (rank 0's own; each other's as the record
    gives it), addresses: host -> training address}, or {} - then every node is read."""
    report = report or {}
    found = report.get("record") or {}
    container = report.get("container") or {}
    labels = container.get("labels") or {}
    if not (
        found.get("job") == job
        and _succeeded(report)
        and labels.get(LABEL_DIGEST) == digest
        and found.get("container") == record_of(report)
        and found.get("ranks") == ranks
        and ranks.get(host) == 0
        and set(found.get("addresses") or {}) == set(ranks)
        and all(found["addresses"].values())
    ):
        return {}
    reports = {}
    for other, rank in ranks.items():
        if other == host:
            reports[other] = dict(report, rank=rank, wanted=digest)
        else:
            reports[other] = {
                "rank": rank,
                "container": {"state": "exited", "exit_code": 0},
                "labels_match": True,
                "checkpoints": [],
            }
    return {"reports": reports, "addresses": dict(found["addresses"])}


def describe(report):
    """A few words on a rank's container state."""
    container = report.get("container") or {}
    state = container.get("state", "missing")
    if state == "exited":
        code = container.get("exit_code")
        if container.get("oom_killed"):
            return "killed by the kernel's OOM killer (exit %s)" % code
        if code == 137:
            return "killed (SIGKILL, exit 137)"
        if code == 143:
            return "stopped (SIGTERM, exit 143)"
        if code == EXIT_MAX_DURATION:
            return "stopped at the job's time limit (gcp_instances_max_duration, exit %s)" % code
        return "exited with code %s" % code
    if state == "missing":
        return "has no container"
    return state


def verdict(reports, now, stall_timeout, stale_after):
    """The job's state while waiting. `reports` maps host -> the rank's latest report plus
    `received` (controller time). Returns {state, failed: [host...], line, progress}:
    state is running, finished, failed (a rank exited non-zero, lost its container or stopped
    answering) or stalled (no rank wrote a log line for stall_timeout seconds)."""
    hosts = sorted(reports, key=lambda h: reports[h].get("rank", 0))
    failed = []
    for host in hosts:
        report = reports[host]
        container = report.get("container") or {}
        state = container.get("state", "missing")
        if now - report.get("received", now) > stale_after:
            failed.append((report.get("received", 0), host, "stopped answering"))
        elif state == "missing":
            failed.append((now, host, "lost its container"))
        elif state == "unknown":
            failed.append((now, host, "could not be queried: %s" % report.get("error", "")))
        elif state in ("exited", "dead") and container.get("exit_code") != 0:
            failed.append((container.get("finished_at") or now, host, describe(report)))
    progress = None
    for host in hosts:
        progress = progress or reports[host].get("progress")
    result = {"progress": progress, "failed": [], "reasons": {}}
    if failed:
        failed.sort()
        result["state"] = "failed"
        result["failed"] = [host for _when, host, _why in failed]
        result["reasons"] = dict((host, why) for _when, host, why in failed)
    elif hosts and all(_succeeded(reports[h]) for h in hosts):
        result["state"] = "finished"
    else:
        newest = max([reports[h].get("last_output_at") or 0 for h in hosts] or [0])
        started = max(
            [(reports[h].get("container") or {}).get("started_at") or 0 for h in hosts] or [0]
        )
        quiet = now - max(newest, started)
        if stall_timeout and quiet > stall_timeout:
            result["state"] = "stalled"
            result["quiet"] = quiet
        else:
            result["state"] = "running"
    result["line"] = progress_line(reports, hosts, progress) if hosts else "no ranks"
    return result


def progress_line(reports, hosts, progress):
    parts = []
    if progress and progress.get("step") is not None:
        part = "step %s/%s" % (progress["step"], progress.get("total") or "?")
        if progress.get("loss") is not None:
            part += " loss %.4f" % progress["loss"]
        parts.append(part)
    else:
        newest = [line for line in reports[hosts[0]].get("log_lines") or [] if line.strip()]
        parts.append("starting: %s" % newest[-1].strip()[:90] if newest else "starting")
    parts.append(
        ", ".join("rank %s %s" % (reports[h].get("rank"), describe(reports[h])) for h in hosts)
    )
    return " | ".join(parts)


def failure_message(job, result, reports, diagnose=None, lines=15):
    """The message a failed wait ends with: the first failing rank, its last log lines, what
    happened to the others, and the known causes found in every rank's log."""
    first = result["failed"][0]
    report = reports[first]
    progress = result.get("progress") or {}
    at = (
        " at step %s/%s" % (progress["step"], progress.get("total")) if progress.get("step") else ""
    )
    text = [
        "job %s failed%s: rank %s (%s) %s first."
        % (job, at, report.get("rank"), first, result["reasons"][first])
    ]
    others = list(result["failed"][1:])
    if others:
        text.append(
            "Then: "
            + "; ".join(
                "rank %s (%s) %s" % (reports[h].get("rank"), h, result["reasons"][h])
                for h in others
            )
            + "."
        )
    text.append(
        "The other ranks were stopped (a surviving rank hangs until the collective "
        "timeout otherwise)."
    )
    tail = condense(report.get("log_lines") or [])[-lines:]
    if tail:
        text.append("Last log lines of rank %s:" % report.get("rank"))
        text.extend("  " + line for line in tail)
    if diagnose is not None:
        findings = diagnose(logs_of(reports))
        for finding in findings:
            text.append(
                "Cause (%s, %s): %s" % (finding["id"], finding["host"] or "log", finding["cause"])
            )
            text.append("Fix: %s" % finding["fix"])
    return "\n".join(text)


# Diagnosis findings that say a rank failed because another one went away, not on its own.
TRANSIENT_FINDINGS = ("peer-crashed", "peer-lost", "collective-timeout")
EXIT_PEER_LOST = 75  # roles/launch/files/rank_agent.py: stopped because another rank was lost


def restart_advice(result, reports, findings=()):
    """Whether relaunching from the newest checkpoint every rank holds can cure a failed wait:
    {restartable, kind, cause, step, why}. A rank killed, a node lost or unreachable, a rank its
    agent stopped because another was lost, a collective that timed out: yes. A rank that
    failed on its own (a bad config, a missing dataset, an error in the code, out of memory), a
    deliberate stop (SIGTERM) or a stall: no, it would fail again."""
    progress = result.get("progress") or {}
    step = progress.get("step")
    if result.get("state") == "stalled":
        return {
            "restartable": False,
            "kind": "stalled",
            "cause": "no rank wrote a log line for %.0f s" % result.get("quiet", 0),
            "step": step,
            "why": "a stalled job (often a rendezvous that never completes) would stall again",
        }
    first = result["failed"][0]
    reason = result["reasons"][first]
    container = (reports.get(first) or {}).get("container") or {}
    code = container.get("exit_code")
    cause = "rank %s (%s) %s" % ((reports.get(first) or {}).get("rank"), first, reason)
    ids = set(f["id"] for f in findings)
    advice = {"restartable": False, "kind": reason, "cause": cause, "step": step}
    if reason == "stopped answering" or reason.startswith(("could not be queried", "lost its")):
        advice.update(restartable=True, kind="lost", why="its node or its container was lost")
    elif container.get("oom_killed"):
        advice["why"] = "out of memory: the same step needs the same memory again"
    elif code == 137:
        advice.update(restartable=True, kind="killed", why="a killed rank can be started again")
    elif code == 143:
        advice["why"] = "stopped on purpose (SIGTERM: playbooks/stop.yml or docker stop)"
    elif code == EXIT_MAX_DURATION:
        advice.update(
            kind="max-duration",
            why="the job ran to its time limit (gcp_instances_max_duration): a cap is not retried",
        )
    elif code == EXIT_PEER_LOST:
        advice.update(restartable=True, kind="peer-lost", why="another rank was lost")
    elif ids and ids <= set(TRANSIENT_FINDINGS):
        advice.update(
            restartable=True,
            kind="network",
            why="its log says a peer went away (%s)" % ", ".join(sorted(ids)),
        )
    else:
        advice["why"] = (
            "it failed on its own (exit %s): a bad config, a missing dataset or an error in "
            "the training would fail again" % code
        )
    return advice


def decide_restart(advice, restarts, max_restarts):
    """Whether the controller relaunches after `advice` (restart_advice, or a stopped VM's),
    given the restarts so far (controller's and agents', each with its kind and step):
    {restart, why}."""
    if not advice.get("restartable"):
        return {"restart": False, "why": advice.get("why") or "it cannot be cured by a restart"}
    if len(restarts) >= max_restarts:
        return {
            "restart": False,
            "why": "no restart left (launch_max_restarts %d)" % max_restarts,
        }
    last = restarts[-1] if restarts else {}
    if last.get("kind") == advice.get("kind") and last.get("step") == advice.get("step"):
        return {
            "restart": False,
            "why": "the same failure (%s) at the same step (%s) twice"
            % (advice.get("kind"), advice.get("step")),
        }
    return {"restart": True, "why": ""}


def condense(lines):
    """Log lines without the repeats (warnings printed every step), each kept where it last
    appeared, noting how many went."""
    seen, kept, dropped = set(), [], 0
    for line in reversed(lines):
        if line in seen:
            dropped += 1
            continue
        seen.add(line)
        kept.append(line)
    kept.reverse()
    if dropped:
        kept.append("(%d repeated lines left out)" % dropped)
    return kept


RUNNING_STATES = ("running", "restarting", "paused", "created")


def agent_reports(report, ranks, host, now):
    """The other ranks as the wait sees them through the agent of its own rank (`report`, the
    job_status report of `host`, with `agent.peers` and the node's clock `now`): one fork waits
    for the whole job. A peer whose agent last answered `exited` has exited with that code; any
    other answer (running, restarting on the nodes), or none yet, counts as a running container
    (the agents bound a peer that never answers: rendezvous_timeout). `received` is when the
    agent last heard from the peer, on the controller's clock (`now`)."""
    peers = (report.get("agent") or {}).get("peers") or {}
    node_now = report.get("now") or now
    reports = {}
    for other, rank in ranks.items():
        if other == host:
            continue
        seen = peers.get(str(rank)) or {}
        answer = seen.get("answer") or {}
        received = now
        if seen.get("seen_at") is not None:
            received = now - max(0.0, node_now - seen["seen_at"])
        if answer.get("state") == "exited":
            container = {
                "state": "exited",
                "exit_code": answer.get("code"),
                "oom_killed": (answer.get("end") or {}).get("kind") == "oom",
                "finished_at": received,
            }
            received = now  # its last word: nothing more is expected from it
        else:
            container = {"state": "running"}
        quiet = answer.get("quiet_s")
        reports[other] = {
            "rank": rank,
            "container": container,
            "received": received,
            "last_output_at": None if quiet is None else received - quiet,
        }
    return reports


def _final_report(final, rank, now):
    """A node's job_status report after the wait, or the reason there is none (a report whose
    retries ran out, a rank still running, still counts)."""
    final = final or {}
    if final.get("unreachable") or not final.get("container"):
        why = final.get("msg") or "no report"
        report = {"container": {"state": "unknown"}, "error": why}
    else:
        report = dict(final)
    report.update(rank=rank, received=now)
    return report


def judge_wait(watch, finals, ranks, job, now, diagnose=None, stopped=()):
    """The end of a wait, from the wait's own outcome (`watch`: job_wait's result on the lowest
    rank's node) and every node's job_status report after it (`finals`, by host; an unreachable
    node's result counts as a rank that could not be queried). `stopped` names the hosts whose
    rank the wait stopped after the failure: their exit is not a cause.
    Returns {failed, state, msg, progress, line, elapsed, checkpoints, restarts, failed_ranks,
    restart}: what job_wait returned when every node's instance waited."""
    hosts = sorted(ranks, key=ranks.get)
    reports = dict((h, _final_report(finals.get(h), ranks[h], now)) for h in hosts)
    leader = reports[hosts[0]] if hosts else {}
    result = {
        "failed": False,
        "state": watch.get("state"),
        "elapsed": watch.get("elapsed"),
        "restarts": (leader.get("agent") or {}).get("restarts") or watch.get("restarts") or [],
        "checkpoints": leader.get("checkpoints") or [],
    }
    if watch.get("state") in ("running", "unknown") or watch.get("failed"):
        # The wait's own end: its timeout (the job was left running), or its own error.
        result.update(
            failed=True,
            msg=watch.get("msg") or "the wait ended without a verdict",
            progress=watch.get("progress"),
            line=watch.get("line"),
        )
        return result
    findings = diagnose(logs_of(reports)) if diagnose is not None else []
    if watch.get("state") == "stalled":
        outcome = {"state": "stalled", "quiet": watch.get("quiet", 0), "failed": []}
        outcome["progress"] = verdict(reports, now, 0, float("inf"))["progress"]
        message = (
            "job %s stalled: no rank wrote a log line for %.0f s (launch_stall_timeout); every "
            "rank was stopped. A rendezvous that never completes looks like this (two nodes at "
            "one node rank, a closed port, MASTER_ADDR on the wrong network)."
            % (job, outcome["quiet"])
        )
        for finding in findings:
            message += "\nCause (%s): %s\nFix: %s" % (
                finding["id"],
                finding["cause"],
                finding["fix"],
            )
    else:
        considered = dict((h, r) for h, r in reports.items() if h not in stopped)
        outcome = verdict(considered, now, 0, float("inf"))
        outcome["progress"] = verdict(reports, now, 0, float("inf"))["progress"]
        if outcome["state"] == "finished" and len(considered) == len(reports):
            result.update(
                progress=outcome["progress"],
                line=progress_line(reports, hosts, outcome["progress"]),
            )
            return result
        if outcome["state"] != "failed" and watch.get("failed_hosts"):
            # What the wait saw fail is no longer visible (a peer seen through the agent
            # only): its view stands.
            outcome.update(
                state="failed",
                failed=watch["failed_hosts"],
                reasons=watch.get("reasons") or {},
            )
        if outcome["state"] != "failed":
            running = [h for h in hosts if _state(reports[h]) in RUNNING_STATES]
            outcome.update(
                state="failed",
                failed=running or hosts[:1],
                reasons=dict(
                    (h, "was still %s after rank %s ended" % (_state(reports[h]), ranks[hosts[0]]))
                    for h in running or hosts[:1]
                ),
            )
        message = failure_message(job, outcome, reports, diagnose)
    result.update(
        failed=True,
        state=outcome["state"],
        msg=message,
        progress=outcome.get("progress"),
        line=progress_line(reports, hosts, outcome.get("progress")),
        failed_ranks=[reports[h]["rank"] for h in outcome.get("failed", []) if h in reports],
        restart=restart_advice(outcome, reports, findings),
    )
    return result


def logs_of(reports):
    """Every rank's log text, by host, for the diagnosis."""
    return dict((h, "\n".join(r.get("log_lines") or [])) for h, r in reports.items())
