"""The benchmarks' bookkeeping (tools/bench/results.py): pairing by repetition, ratios with
median and spread, the files rewritten after every measurement, resuming, the table."""

import json

import pytest
from bench import runs
from bench.results import Results, chart, markdown, scale_curves, spread, summarize


def test_spread_of_values():
    assert spread([3.0, 1.0, 2.0]) == {"n": 3, "median": 2.0, "min": 1.0, "max": 3.0}
    assert spread([]) == {"n": 0, "median": None, "min": None, "max": None}


def test_ratios_are_taken_pair_by_pair_over_the_repetitions_both_variants_have():
    measurements = [
        {"bench": "rerun", "case": "c", "variant": "2 nodes", "rep": 1, "seconds": 10},
        {"bench": "rerun", "case": "c", "variant": "8 nodes", "rep": 1, "seconds": 20},
        {"bench": "rerun", "case": "c", "variant": "2 nodes", "rep": 2, "seconds": 20},
        {"bench": "rerun", "case": "c", "variant": "8 nodes", "rep": 2, "seconds": 30},
        {"bench": "rerun", "case": "c", "variant": "2 nodes", "rep": 3, "seconds": 40},
    ]
    row = summarize(measurements)["rerun"]["c"]
    # pairs: 20/10 = 2.0 and 30/20 = 1.5; rep 3 has no partner and is not a ratio
    assert row["ratio"] == {"n": 2, "median": 1.75, "min": 1.5, "max": 2.0}
    assert row["2 nodes"]["n"] == 3 and row["2 nodes"]["median"] == 20
    assert row["8 nodes"]["median"] == 25


def test_a_ratio_is_not_the_ratio_of_medians():
    """Noise shared by a pair cancels in its ratio: pairs (10, 20) and (100, 200) give 2 and 2."""
    measurements = [
        {"bench": "allreduce", "case": "64 MB", "variant": v, "rep": r, "busbw_GBps": x}
        for v, r, x in (
            ("bare", 1, 10),
            ("container", 1, 20),
            ("bare", 2, 100),
            ("container", 2, 200),
            ("bare", 3, 50),
            ("container", 3, 30),
        )
    ]
    row = summarize(measurements)["allreduce"]["64 MB"]
    assert row["ratio"]["median"] == 2.0
    assert row["container"]["median"] / row["bare"]["median"] == 30 / 50


def test_every_measurement_is_written_at_once_and_a_resume_keeps_them(tmp_path):
    results = Results(tmp_path, meta={"started": "now"})
    results.add("time-to-cause", "wrong NIC", "preflight", 1, seconds=30.0, named=True)
    results.add("time-to-cause", "wrong NIC", "hand", 1, seconds=120.0, capped=True, shown="x")
    saved = json.loads((tmp_path / "results.json").read_text())
    assert len(saved["measurements"]) == 2
    row = saved["summary"]["time-to-cause"]["wrong NIC"]
    assert row["ratio"]["median"] == 4.0 and row["extra"]["hand_capped"] == 1
    table = (tmp_path / "results.md").read_text()
    assert "| wrong NIC | 30.0 | 120.0 | 4.0x | 1 of 1 | 1 of 1 |" in table

    resumed = Results(tmp_path, resume=True)
    assert resumed.has("time-to-cause", "wrong NIC", "hand", 1)
    assert not resumed.has("time-to-cause", "wrong NIC", "hand", 2)
    resumed.add("time-to-cause", "wrong NIC", "hand", 1, seconds=60.0)  # replaces, not appends
    assert len(json.loads(resumed.path.read_text())["measurements"]) == 2
    assert Results(tmp_path).measurements == []  # without --resume a run starts afresh


def test_an_unknown_benchmark_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown benchmark 'speed'"):
        Results(tmp_path).add("speed", "c", "a", 1, seconds=1)


def test_the_table_shows_cpu_per_node_and_changed_tasks():
    measurements = [
        {"bench": "rerun", "case": "train.yml re-run", "variant": v, "rep": 1, "seconds": s}
        | {"cpu_s_per_node": c, "vm_cpu_s_per_node": vm, "changed": 0}
        for v, s, c, vm in [("2 nodes", 40.0, 5.5, 1.25), ("8 nodes", 80.0, 3.25, 1.0)]
    ]
    text = markdown({}, summarize(measurements))
    assert "| 2 nodes | 40.0 | 5.50 | 1.25 |" in text and "| 8 nodes | 80.0 | 3.25 | 1.00 |" in text
    # A run without the VMs' figure (an earlier results.json) shows none.
    for m in measurements:
        del m["vm_cpu_s_per_node"]
    assert "| 2 nodes | 40.0 | 5.50 | - |" in markdown({}, summarize(measurements))
    assert "Wall time ratio 8 nodes / 2 nodes: 2.00x (changed tasks on the re-runs: [0])" in text


def test_changed_tasks_are_read_from_the_recap():
    output = """TASK [x] changed=9 in a message
PLAY RECAP *********
vm0                        : ok=40   changed=0    unreachable=0    failed=0    skipped=30
vm1                        : ok=38   changed=2    unreachable=0    failed=0    skipped=31
"""
    assert runs.changed_tasks(output) == 2


def test_names_and_the_telling_line_of_a_hand_launch():
    assert runs.slug("two nodes at rank 0") == "two-nodes-at-rank-0"
    assert runs.slug("wrong NIC") == "wrong-nic"
    log = [
        "[rank0]: Traceback (most recent call last):",
        "torch.distributed.DistNetworkError: The client socket has timed out after 60000ms",
        "subprocess.CalledProcessError: Command '['torchrun']' returned non-zero exit status 1.",
    ]
    assert "DistNetworkError" in runs.error_line(log)
    assert runs.error_line(["loading", "step 3"]) == "step 3"
    assert runs.error_line([]) == "(no output)"


def test_the_demo_ratio_is_cold_over_warm_and_invocations_add_up(tmp_path):
    first = Results(tmp_path, meta={"command": "./dev bench --only demo"})
    first.add("demo", "./dev demo", "cold", 1, seconds=450.0)
    first.add("demo", "./dev demo", "warm", 1, seconds=150.0)
    resumed = Results(tmp_path, meta={"command": "./dev bench --resume"}, resume=True)
    resumed.save()
    table = (tmp_path / "results.md").read_text()
    assert "| 450 | 150 | 3.00x |" in table
    assert "`./dev bench --only demo`, then `./dev bench --resume` on " in table


def test_a_resume_on_another_machine_names_each_machine(tmp_path):
    first = Results(tmp_path, meta={"command": "./dev bench --only demo", "machine": "AMD"})
    first.add("demo", "./dev demo", "cold", 1, seconds=450.0)
    again = Results(
        tmp_path, meta={"command": "./dev bench --resume", "machine": "AMD"}, resume=True
    )
    again.save()
    assert "`./dev bench --resume` on AMD." in (tmp_path / "results.md").read_text()
    other = Results(
        tmp_path, meta={"command": "./dev bench --only rerun", "machine": "Intel"}, resume=True
    )
    other.save()
    assert other.meta["machines"] == ["AMD", "AMD", "Intel"]
    assert (
        "with `./dev bench --only demo`, then `./dev bench --resume` on AMD, "
        "then `./dev bench --only rerun` on Intel."
    ) in (tmp_path / "results.md").read_text()


def _scale_rows() -> list[dict]:
    rows = []
    for rep in (1, 2):
        for count in (8, 32):
            for name, base, per_vm in (
                ("re-run (s)", 10.0, 2.0),
                ("re-run: controller CPU s per VM", 5.0, 0.0),
            ):
                case = f"{name}, {count} VMs"
                rows.append(
                    {
                        "bench": "scale",
                        "case": case,
                        "variant": "2 VMs",
                        "rep": rep,
                        "value": base + rep,
                    }
                )
                rows.append(
                    {
                        "bench": "scale",
                        "case": case,
                        "variant": "N VMs",
                        "rep": rep,
                        "value": base + per_vm * count + rep,
                    }
                )
    return rows


def test_the_scale_chart_has_one_curve_per_figure_over_the_vms():
    summary = summarize(_scale_rows())
    assert scale_curves(summary["scale"], "2 VMs", "N VMs") == {
        "re-run (s)": {2: 11.5, 8: 27.5, 32: 75.5},
        "re-run: controller CPU s per VM": {2: 6.5, 8: 6.5, 32: 6.5},
    }


def test_the_scale_chart_is_drawn(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is the bench's own dependency")
    chart(summarize(_scale_rows()), tmp_path / "results.png")
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_scale_series_gets_the_readmes_chart_of_its_own(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is the bench's own dependency")
    results = Results(tmp_path)
    results.add_many(
        [
            (r["bench"], r["case"], r["variant"], r["rep"], {"value": r["value"]})
            for r in _scale_rows()
        ]
    )
    assert (tmp_path / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
