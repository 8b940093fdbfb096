"""Readers of the jobs captured on the local cluster (tests/unit/fixtures/job, see its README),
shared by the tests of the node's side (module_utils/_job.py) and the controller's side
(plugin_utils/_job_state.py) of the job logic."""

from __future__ import annotations

import calendar
import json
from pathlib import Path

from ansible_collections.hostnet.llamafactory.plugins.module_utils import _job as job

FIXTURES = Path(__file__).resolve().parent / "unit" / "fixtures" / "job"
LOGS = Path(__file__).resolve().parent / "unit" / "fixtures" / "logs"

# The digests the captured containers carry (hostnet.llamafactory.digest).
DIGEST_DEMO_RANK0 = "21435cc2ce05c521"  # inspect-exited-0.json
DIGEST_CAPTURE_RANK0 = "ff205cb65880541b"  # inspect-exited-1.json
DIGEST_CAPTURE_RANK1 = "71be230307bea743"  # inspect-running.json, inspect-killed-137.json


def epoch(text: str, fraction: float = 0.0) -> float:
    """Epoch seconds of 'YYYY-MM-DDTHH:MM:SS' (UTC) plus a fraction."""
    fields = text.replace("T", "-").replace(":", "-").split("-")
    return calendar.timegm(tuple(int(x) for x in fields)) + fraction


def inspect(name: str) -> dict:
    return json.loads((FIXTURES / f"inspect-{name}.json").read_text())


def logs(name: str) -> tuple[list[str], float | None]:
    return job.parse_logs(
        (FIXTURES / f"logs-{name}.stdout").read_text(),
        (FIXTURES / f"logs-{name}.stderr").read_text(),
    )


def listing(rank: int) -> dict[str, list[str]]:
    """checkpoints-rankN.txt (`checkpoint-N: file file ...`) as {folder: [names inside]}."""
    result = {}
    for line in (FIXTURES / f"checkpoints-rank{rank}.txt").read_text().splitlines():
        name, _colon, children = line.partition(":")
        result[name.strip()] = children.split()
    return result


def report(name, rank, wanted=None, checkpoints=(), log=None, **extra) -> dict:
    """One rank's report as job_status returns it, given the digest label this run wants
    (`wanted`; by default the one the container carries: the same job), plus `rank`; name None:
    no container."""
    container = job.container_state(inspect(name) if name else None)
    digest = wanted or container.get("labels", {}).get(job.LABEL_DIGEST, "0" * 16)
    result = {
        "rank": rank,
        "container": container,
        "checkpoints": list(checkpoints),
        "labels_match": job.labels_match(container, {job.LABEL_DIGEST: digest}),
    }
    if log:
        result["log_lines"], result["last_output_at"] = logs(log)
    result.update(extra)
    return result
