"""The benchmarks' results: one JSON file rewritten after every measurement (so an interrupted
run keeps what it measured), and the Markdown table and PNG chart made from it.

A comparison pairs the runs of two variants by repetition (A B A B ...: run i of A with run i
of B), computes each pair's ratio and reports the median and the spread (min-max) of the
ratios, with the median and spread of each variant's own figures.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import tempfile
from pathlib import Path

# What each benchmark compares: (variant A, variant B, the figure, how the ratio reads).
COMPARISONS = {
    "time-to-cause": ("preflight", "hand", "seconds", "hand / preflight"),
    "rerun": ("2 nodes", "8 nodes", "seconds", "8 nodes / 2 nodes"),
    "allreduce": ("bare", "container", "busbw_GBps", "container / bare"),
    "demo": ("warm", "cold", "seconds", "cold / warm"),
    "peer-lost": ("launch_peer_timeout 30 s", "launch_peer_timeout 60 s", "seconds", "60 s / 30 s"),
    "restart": ("rank killed", "VM stopped", "seconds", "VM stopped / rank killed"),
    "restart-on-nodes": ("container killed", "worker killed", "seconds", "agents / controller"),
    "profile-rerun": ("2 nodes", "8 nodes", "seconds", "8 nodes / 2 nodes"),
    "profile-fault": ("2 nodes", "8 nodes", "seconds", "8 nodes / 2 nodes"),
    "profile-rerun-cpu": ("2 nodes", "8 nodes", "seconds", "8 nodes / 2 nodes"),
    "profile-fault-cpu": ("2 nodes", "8 nodes", "seconds", "8 nodes / 2 nodes"),
    # Each case is one figure at N VMs (in its name) next to the same figure at 2 VMs.
    "scale": ("2 VMs", "N VMs", "value", "N VMs / 2 VMs"),
    # The largest count's launch and fault with Ansible's default forks and the repository's.
    "forks": ("5 forks", "25 forks", "value", "25 forks / 5 forks"),
    # The floor: bare module calls, controller-only tasks and a container on 2 VMs and on N.
    "floor": ("2 VMs", "N VMs", "value", "N VMs / 2 VMs"),
    # One fault at a time on 2 VMs and on every VM: seconds until named, and the node it names.
    "scale-faults": ("2 VMs", "N VMs", "seconds", "N VMs / 2 VMs"),
    # The scale series' launch and fault, task by task, at 2 VMs and the largest count.
    "profile-scale-launch": ("2 VMs", "N VMs", "seconds", "N VMs / 2 VMs"),
    "profile-scale-fault": ("2 VMs", "N VMs", "seconds", "N VMs / 2 VMs"),
    # --compare REV: the collection at REV (before) and this tree (after), on the same cluster.
    "outputs-step": ("without output URI", "with output URI", "seconds", "with / without"),
    "outputs-transfer": ("upload", "restore", "seconds", "restore / upload"),
    "compare-rerun": ("before", "after", "seconds", "after / before"),
    "compare-time-to-cause": ("before", "after", "seconds", "after / before"),
    # The Hub model fetched by rank 0's node and copied, or by every node itself.
    "hub": ("each node", "once", "seconds", "once / each node"),
    # up.yml from an empty project: each case one figure at N VMs next to the 2-VM run's.
    "vms": ("2 VMs", "N VMs", "value", "N VMs / 2 VMs"),
    # A spot VM preempted mid-training: started again (STOP) or created again (DELETE).
    "preemption": ("preempted, STOP", "preempted, DELETE", "value", "DELETE / STOP"),
}
TITLES = {
    "time-to-cause": "1. Time to a named cause (s, lower is better; a hang counts as the cap)",
    "rerun": "2. Re-run with the job finished (train.yml, changed=0)",
    "allreduce": "3. all_reduce bus bandwidth between two VMs (Gloo, GB/s, higher is better)",
    "demo": "4. Wall time of `./dev demo` (s)",
    "peer-lost": "5. A node vanishes under a detached job: seconds until the survivor exits",
    "restart": "6. A restart (launch_max_restarts): seconds from the fault to training again",
    "restart-on-nodes": (
        "7. Restarted by the controller or by the agents: seconds from the kill to training again"
    ),
    "profile-rerun": "8. Where a re-run's time goes (train.yml with the job finished, s per task)",
    "profile-fault": (
        "9. Where a failing run's time goes (train.yml until the preflight names the fault, s "
        "per task)"
    ),
    "scale": "10. At scale: the stand-in job on 2 VMs versus 8, 16 and 32, Ansible's default forks",
    "forks": (
        "22. Ansible's forks: the default 5 versus the repository's 25 (the stand-in job, every VM "
        "of the bench cluster)"
    ),
    "floor": (
        "23. The floor of any per-node play on this machine: module calls, controller-only tasks "
        "and a container on 2 VMs versus every VM of the bench cluster, 5 forks"
    ),
    "scale-faults": (
        "24. Faults at scale: each fault on 2 VMs and on every VM of the bench cluster, named "
        "with its node (the stand-in job, 5 forks)"
    ),
    "profile-rerun-cpu": (
        "11. The controller's CPU in a re-run (train.yml with the job finished, CPU s per task)"
    ),
    "profile-fault-cpu": (
        "12. The controller's CPU in a failing run (until the preflight names the fault, CPU s "
        "per task)"
    ),
    "outputs-step": (
        "16. llamafactory_output_uri: a training step's mean time with and without the uploads (s)"
    ),
    "outputs-transfer": (
        "17. llamafactory_output_uri: a checkpoint to the bucket and back (s, the nodes' library "
        "against the box's Cloud Storage)"
    ),
    "compare-rerun": "13. Before and after a change (--compare REV): the re-run (s)",
    "compare-time-to-cause": (
        "14. Before and after a change (--compare REV): time until the preflight names a fault (s)"
    ),
    "hub": "15. The Hub model (200 MB) fetched once and copied, or by every node (s of the fetch)",
    "vms": "18. VMs from an empty project: up.yml creating N VMs and waiting for their SSH (s)",
    "profile-scale-launch": (
        "20. Where a launch's time goes at scale (the stand-in, detached, 5 forks; N: the largest "
        "count, s per task)"
    ),
    "profile-scale-fault": (
        "21. Where the time to a named cause goes at scale (the stand-in, bridge networking, 5 "
        "forks; N: the largest count, s per task)"
    ),
    "preemption": (
        "19. A spot VM preempted mid-training: seconds from the preemption to each step of the "
        "restart"
    ),
}
# The profiles' tables list the tasks that take longest (on either variant); the rest in a line.
PROFILE_ROWS = 30
PROFILE_BARS = 10


class Results:
    """The measurements of one benchmark run, kept in `folder`/results.json."""

    def __init__(self, folder: Path, meta: dict | None = None, resume: bool = False):
        self.folder = Path(folder)
        self.path = self.folder / "results.json"
        data = {}
        if resume and self.path.is_file():
            data = json.loads(self.path.read_text())
        before = data.get("meta", {})
        self.meta = {**before, **(meta or {})}
        # Every invocation that measured into this file (a --resume adds one), and the machine
        # of each (a resume may run on another).
        earlier = before.get("invocations", [])
        if meta and meta.get("command"):
            self.meta["invocations"] = [*earlier, meta["command"]]
            machines = before.get("machines") or [before.get("machine")] * len(earlier)
            self.meta["machines"] = [*machines, self.meta.get("machine")]
        self.measurements: list[dict] = data.get("measurements", [])

    def has(self, bench: str, case: str, variant: str, rep: int) -> bool:
        key = (bench, case, variant, rep)
        return any(_key(m) == key for m in self.measurements)

    def add(self, bench: str, case: str, variant: str, rep: int, **figures) -> dict:
        """Record one measurement and write every output at once (atomic replace)."""
        self.add_many([(bench, case, variant, rep, figures)])
        return self.measurements[-1]

    def add_many(self, items: list[tuple[str, str, str, int, dict]]) -> None:
        """Record (bench, case, variant, rep, figures) items and write the outputs once."""
        for bench, case, variant, rep, figures in items:
            if bench not in COMPARISONS:
                raise ValueError(f"unknown benchmark {bench!r}; known: {sorted(COMPARISONS)}")
            key = (bench, case, variant, rep)
            self.measurements = [m for m in self.measurements if _key(m) != key]
            self.measurements.append(
                {"bench": bench, "case": case, "variant": variant, "rep": rep, **figures}
            )
        self.save()

    def save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        summary = summarize(self.measurements)
        document = {"meta": self.meta, "summary": summary, "measurements": self.measurements}
        _atomic_write(self.path, json.dumps(document, indent=2) + "\n")
        _atomic_write(self.folder / "results.md", markdown(self.meta, summary))
        # matplotlib is a bench-only dependency; without it the JSON and the table stay
        with contextlib.suppress(ImportError):
            chart(summary, self.folder / "results.png")
            if summary.get("scale"):  # the README's chart
                scale_chart(summary["scale"], self.folder / "scale.png")


def _key(measurement: dict) -> tuple:
    return tuple(measurement[k] for k in ("bench", "case", "variant", "rep"))


def _atomic_write(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w") as stream:
        stream.write(text)
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


def spread(values: list[float]) -> dict:
    """median, min, max and n of a list (None when empty)."""
    if not values:
        return {"n": 0, "median": None, "min": None, "max": None}
    return {
        "n": len(values),
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def summarize(measurements: list[dict]) -> dict:
    """bench -> case -> {variant A, variant B, ratio}: each variant's figures and the pairwise
    ratios B/A over the repetitions both variants have (unpaired runs are left out of ratios)."""
    summary: dict = {}
    for bench, (first, second, figure, _reads) in COMPARISONS.items():
        cases = [m["case"] for m in measurements if m["bench"] == bench]
        for case in dict.fromkeys(cases):
            by_variant: dict[str, dict[int, float]] = {first: {}, second: {}}
            for m in measurements:
                wanted = m["bench"] == bench and m["case"] == case
                if wanted and m["variant"] in by_variant and m.get(figure) is not None:
                    by_variant[m["variant"]][m["rep"]] = float(m[figure])
            pairs = sorted(set(by_variant[first]) & set(by_variant[second]))
            ratios = [
                by_variant[second][rep] / by_variant[first][rep]
                for rep in pairs
                if by_variant[first][rep]
            ]
            summary.setdefault(bench, {})[case] = {
                first: spread(list(by_variant[first].values())),
                second: spread(list(by_variant[second].values())),
                "ratio": spread(ratios),
                "extra": _extra(measurements, bench, case),
            }
    return summary


def _extra(measurements: list[dict], bench: str, case: str) -> dict:
    """Per-benchmark details the table shows besides the main figure."""
    mine = [m for m in measurements if m["bench"] == bench and m["case"] == case]
    if bench == "time-to-cause":
        hand = [m for m in mine if m["variant"] == "hand"]
        ours = [m for m in mine if m["variant"] == "preflight"]
        return {
            "hand_capped": sum(1 for m in hand if m.get("capped")),
            "hand_runs": len(hand),
            "preflight_named": sum(1 for m in ours if m.get("named")),
            "preflight_runs": len(ours),
            "preflight_said": next((m["shown"] for m in ours if m.get("shown")), ""),
            "hand_showed": next((m["shown"] for m in reversed(hand) if m.get("shown")), ""),
        }
    if bench == "rerun":
        cpu: dict[str, list[float]] = {}
        vms: dict[str, list[float]] = {}
        for m in mine:
            if m.get("cpu_s_per_node") is not None:
                cpu.setdefault(m["variant"], []).append(float(m["cpu_s_per_node"]))
            if m.get("vm_cpu_s_per_node") is not None:
                vms.setdefault(m["variant"], []).append(float(m["vm_cpu_s_per_node"]))
        changed = sorted({m.get("changed") for m in mine if m.get("changed") is not None})
        return {
            "cpu_s_per_node": {k: spread(v) for k, v in cpu.items()},
            "vm_cpu_s_per_node": {k: spread(v) for k, v in vms.items()},
            "changed": changed,
        }
    if bench == "scale-faults":
        by_variant = {}
        for variant in COMPARISONS[bench][:2]:
            runs_ = [m for m in mine if m["variant"] == variant]
            by_variant[variant] = {
                "runs": len(runs_),
                "named": sum(1 for m in runs_ if m.get("named")),
                "node": next((m["node"] for m in runs_ if m.get("node")), None),
                "node_named": sum(1 for m in runs_ if m.get("node_named")),
                "vms": next((m["vms"] for m in runs_ if m.get("vms")), None),
                "said": next((m["shown"] for m in runs_ if m.get("shown")), ""),
            }
        return by_variant
    if bench == "vms":  # the mean as well: the runs of a count, not a pair's ratio
        values = [float(m["value"]) for m in mine if m["variant"] == COMPARISONS[bench][1]]
        return {"mean": statistics.fmean(values) if values else None}
    return {}


def _fmt(stats: dict, digits: int = 1) -> str:
    if not stats or not stats.get("n"):
        return "-"
    median, low, high = stats["median"], stats["min"], stats["max"]
    if stats["n"] == 1:
        return f"{median:.{digits}f}"
    return f"{median:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _invocations(meta: dict) -> str:
    """Each invocation with its machine named once per run of the same machine: `A`, then `B`
    on M1, then `C` on M2."""
    commands = meta.get("invocations") or [meta.get("command")]
    machines = meta.get("machines") or []
    if len(machines) != len(commands) or len(set(machines)) <= 1:
        listed = ", then ".join(f"`{command}`" for command in commands)
        return f"{listed} on {meta.get('machine', 'this machine')}"
    parts = []
    for index, (command, machine) in enumerate(zip(commands, machines, strict=True)):
        last = index == len(commands) - 1 or machines[index + 1] != machine
        parts.append(f"`{command}`" + (f" on {machine or 'an unnamed machine'}" if last else ""))
    return ", then ".join(parts)


def markdown(meta: dict, summary: dict) -> str:
    lines = ["# Benchmarks", ""]
    if meta:
        lines += [
            f"Measured until {meta.get('finished') or meta.get('started', '?')} with "
            + _invocations(meta)
            + ".",
            "Figures: median (min-max) over the repetitions; ratios are taken pair by pair "
            "(run i of one variant with run i of the other, the two interleaved).",
            "",
        ]
    for bench, (first, second, _figure, reads) in COMPARISONS.items():
        cases = summary.get(bench)
        if not cases:
            continue
        lines += [f"## {TITLES[bench]}", ""]
        if bench == "time-to-cause":
            lines += [
                f"| failure | preflight (s) | hand launch (s) | {reads} | named by the "
                "preflight | hand launches at the cap | what the preflight said | what the hand "
                "launch showed |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for case, row in cases.items():
                extra = row["extra"]
                lines.append(
                    f"| {case} | {_fmt(row[first])} | {_fmt(row[second])} | "
                    f"{_fmt(row['ratio'])}x | {extra['preflight_named']} of "
                    f"{extra['preflight_runs']} | {extra['hand_capped']} of {extra['hand_runs']} | "
                    f"{_cell(extra['preflight_said'])} | {_cell(extra['hand_showed'])} |"
                )
        elif bench == "rerun":
            lines += [
                "| nodes | wall time (s) | controller CPU s per node | the VMs' CPU s per node |",
                "|---|---|---|---|",
            ]
            for row in cases.values():
                cpu = row["extra"]["cpu_s_per_node"]
                vms = row["extra"].get("vm_cpu_s_per_node", {})
                for variant in (first, second):
                    lines.append(
                        f"| {variant} | {_fmt(row[variant])} | {_fmt(cpu.get(variant), 2)} | "
                        f"{_fmt(vms.get(variant), 2)} |"
                    )
                lines += [
                    "",
                    f"Wall time ratio {reads}: {_fmt(row['ratio'], 2)}x "
                    f"(changed tasks on the re-runs: {row['extra']['changed'] or '-'}).",
                ]
        elif bench == "allreduce":
            lines += [
                f"| tensor | {first} | {second} | {reads} |",
                "|---|---|---|---|",
            ]
            for case, row in cases.items():
                lines.append(
                    f"| {case} | {_fmt(row[first], 3)} | {_fmt(row[second], 3)} | "
                    f"{_fmt(row['ratio'], 3)} |"
                )
        elif bench == "demo":
            lines += [f"| {second} | {first} | {reads} |", "|---|---|---|"]
            for _case, row in cases.items():
                lines.append(
                    f"| {_fmt(row[second], 0)} | {_fmt(row[first], 0)} | {_fmt(row['ratio'], 2)}x |"
                )
        elif bench == "scale-faults":
            lines += scale_faults_table(cases, first, second, reads)
        elif bench.startswith("profile-"):
            lines += _profile_table(cases, first, second, reads)
        elif bench == "vms":
            lines += vms_table(cases, second)
        else:
            lines += [f"| case | {first} | {second} | {reads} |", "|---|---|---|---|"]
            for case, row in cases.items():
                # Sub-second figures (a training step) with their milliseconds.
                medians = [row[v]["median"] for v in (first, second) if (row[v] or {}).get("n")]
                digits = 3 if medians and max(medians) < 1 else 1
                ratio = _fmt(row["ratio"], 2)
                lines.append(
                    f"| {case} | {_fmt(row[first], digits)} | {_fmt(row[second], digits)} | "
                    f"{ratio}{'x' if ratio != '-' else ''} |"
                )
        notes = meta.get("notes", {}).get(bench)
        if notes:
            lines += ["", notes]
        lines.append("")
    return "\n".join(lines)


def scale_faults_table(cases: dict, first: str, second: str, reads: str) -> list[str]:
    """One row per fault: the seconds on 2 and on N VMs, their ratio, how many runs of each
    named it (and the faulty node, for a node's own fault), and what was said on N VMs."""
    counts = [row["extra"][second]["vms"] for row in cases.values()]
    vms = next((count for count in counts if count), "N")
    lines = [
        f"| failure | {first} (s) | {vms} VMs (s) | {reads.replace('N VMs', f'{vms} VMs')} | "
        f"named on {first} | named on {vms} VMs | the node named on {vms} VMs | "
        f"what was said on {vms} VMs |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def named(extra: dict) -> str:
        return f"{extra['named']} of {extra['runs']}"

    for case, row in cases.items():
        extra = row["extra"]
        node = extra[second]["node"]
        at_node = "-"
        if node:
            at_node = f"{node}: {extra[second]['node_named']} of {extra[second]['runs']}"
        ratio = _fmt(row["ratio"], 2)
        lines.append(
            f"| {case} | {_fmt(row[first])} | {_fmt(row[second])} | "
            f"{ratio}{'x' if ratio != '-' else ''} | {named(extra[first])} | "
            f"{named(extra[second])} | {at_node} | {_cell(extra[second]['said'])} |"
        )
    return lines


def _mean(row: dict, variant: str, digits: int = 1) -> str:
    """A row's mean of `variant` (min-max), or the one value."""
    stats = row.get(variant) or {}
    if not stats.get("n"):
        return "-"
    mean = row["extra"]["mean"]
    if stats["n"] == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ({stats['min']:.{digits}f}-{stats['max']:.{digits}f})"


def vms_table(cases: dict, second: str) -> list[str]:
    """The vms cases ("FIGURE, N VMs") as one row per number of VMs, one column per figure:
    mean (min-max) over the repetitions; then up.yml's ratio to the 2-VM run, pair by pair."""
    figures: list[str] = []
    counts: set[int] = set()
    for case in cases:
        name, _sep, count = case.rpartition(", ")
        if count.endswith(" VMs"):
            if name not in figures:
                figures.append(name)
            counts.add(int(count.split()[0]))
    lines = [
        "| VMs | " + " | ".join(figures) + " | up.yml / 2 VMs (median, min-max) |",
        "|---" * (len(figures) + 2) + "|",
    ]
    whole = figures[0] if figures else ""
    for count in sorted(counts):
        cells = [_mean(cases.get(f"{name}, {count} VMs", {}), second) for name in figures]
        ratio = _fmt(cases.get(f"{whole}, {count} VMs", {}).get("ratio", {}), 2)
        lines.append(
            f"| {count} | " + " | ".join(cells) + f" | {ratio}{'x' if ratio != '-' else ''} |"
        )
    return lines


def slowest(cases: dict, first: str, second: str, count: int) -> list[str]:
    """The `count` tasks of a profile with the largest median on either variant, in that
    order (the whole run's row left out)."""

    def largest(case: str) -> float:
        row = cases[case]
        return max(row[v]["median"] or 0.0 for v in (first, second))

    tasks = [case for case in cases if not case.startswith("(")]
    return sorted(tasks, key=largest, reverse=True)[:count]


def _profile_table(cases: dict, first: str, second: str, reads: str) -> list[str]:
    lines = [f"| task | {first} | {second} | {reads} |", "|---|---|---|---|"]
    shown = [case for case in cases if case.startswith("(")]
    shown += slowest(cases, first, second, PROFILE_ROWS)
    for case in shown:
        row = cases[case]
        lines.append(
            f"| {_cell(case)} | {_fmt(row[first])} | {_fmt(row[second])} | "
            f"{_fmt(row['ratio'], 2)}x |"
        )
    rest = [case for case in cases if case not in shown]
    if rest:
        totals = {
            variant: sum(cases[case][variant]["median"] or 0.0 for case in rest)
            for variant in (first, second)
        }
        lines.append(
            f"| the other {len(rest)} tasks (sum of medians) | {totals[first]:.1f} | "
            f"{totals[second]:.1f} | |"
        )
    return lines


def chart(summary: dict, path: Path) -> None:
    """One panel per benchmark: bars at the median, whiskers from min to max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    benches = [b for b in COMPARISONS if summary.get(b)]
    if not benches:
        return
    figure, axes = plt.subplots(1, len(benches), figsize=(5.2 * len(benches), 4.2), squeeze=False)
    for axis, bench in zip(axes[0], benches, strict=True):
        first, second, figure_name, _reads = COMPARISONS[bench]
        if bench == "scale":
            _scale_curves(axis, summary[bench], first, second)
            continue
        if bench == "vms":
            _vms_curves(axis, summary[bench], first, second)
            continue
        cases = list(summary[bench])
        if bench.startswith("profile-"):
            cases = slowest(summary[bench], first, second, PROFILE_BARS)
        width = 0.38
        for offset, variant in ((-width / 2, first), (width / 2, second)):
            medians, low, high = [], [], []
            for case in cases:
                stats = summary[bench][case][variant]
                median = stats["median"] if stats["n"] else 0.0
                medians.append(median)
                low.append(median - (stats["min"] if stats["n"] else 0.0))
                high.append((stats["max"] if stats["n"] else 0.0) - median)
            positions = [i + offset for i in range(len(cases))]
            axis.bar(positions, medians, width, label=variant, yerr=[low, high], capsize=3)
        axis.set_xticks(range(len(cases)))
        labels = [case.split(" : ")[-1] for case in cases]  # a role's task: without the role
        labels = [label if len(label) <= 40 else label[:39] + "..." for label in labels]
        axis.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
        axis.set_ylabel("GB/s" if figure_name == "busbw_GBps" else "seconds")
        axis.set_title(TITLES[bench].split(" (")[0], fontsize=9)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def scale_curves(cases: dict, first: str, second: str) -> dict[str, dict[int, float]]:
    """The scale table's cases ("FIGURE, N VMs") -> figure -> number of VMs -> median; the
    2-VM point from the runs each count is paired with."""
    curves: dict[str, dict[int, float]] = {}
    for case, stats in cases.items():
        name, _sep, count = case.rpartition(", ")
        if not count.endswith(" VMs") or not stats[second]["n"]:
            continue
        points = curves.setdefault(name, {})
        points[int(count.split()[0])] = stats[second]["median"]
        if stats[first]["n"]:
            points.setdefault(2, stats[first]["median"])
    return curves


def _scale_curves(axis, cases: dict, first: str, second: str) -> None:
    """The scale series as curves over the number of VMs: seconds (solid, left axis) and the
    controller's CPU per VM (dashed, right axis); medians."""
    curves = scale_curves(cases, first, second)
    cpu_axis = axis.twinx()
    # (a share in %, not seconds: in the table only)
    curves = {name: points for name, points in curves.items() if "(%)" not in name}
    for index, (name, points) in enumerate(curves.items()):
        counts = sorted(points)
        cpu = "CPU" in name
        (cpu_axis if cpu else axis).plot(
            counts,
            [points[c] for c in counts],
            linestyle="--" if cpu else "-",
            marker="o",
            color=f"C{index}",  # one color cycle over both axes
            label=name,
        )
    axis.set_xlabel("VMs (Ansible's default 5 forks)")
    axis.set_ylabel("seconds")
    cpu_axis.set_ylabel("controller CPU s per VM (dashed)")
    axis.set_xticks(sorted({c for points in curves.values() for c in points}))
    axis.set_title("10. At scale: the stand-in job, Ansible's default forks", fontsize=9)
    lines = axis.get_lines() + cpu_axis.get_lines()
    axis.legend(lines, [line.get_label() for line in lines], fontsize=7, loc="upper center")


def scale_chart(cases: dict, path: Path) -> None:
    """The scale series alone (table 10's curves), for the README."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.4, 4.2))
    first, second = COMPARISONS["scale"][:2]
    _scale_curves(axis, cases, first, second)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _vms_curves(axis, cases: dict, first: str, second: str) -> None:
    """up.yml and its steps over the number of VMs (medians)."""
    curves = scale_curves(cases, first, second)
    for name, points in curves.items():
        counts = sorted(points)
        axis.plot(counts, [points[c] for c in counts], marker="o", label=name)
    axis.set_xscale("log", base=2)
    axis.set_xticks(sorted({c for points in curves.values() for c in points}))
    axis.set_xticklabels([str(c) for c in axis.get_xticks()])
    axis.set_xlabel("VMs created (from an empty project)")
    axis.set_ylabel("seconds (median)")
    axis.set_title("18. VMs from an empty project", fontsize=9)
    axis.legend(fontsize=7)
