"""The benchmark runs' own logic: the cuts of its cluster, the order of the failure runs, the
task profile read from profile_tasks' recap and its table."""

import json
import threading
import time
from pathlib import Path

import pytest
import yaml
from bench import results as results_module
from bench import runs
from bench.results import Results
from localcluster import cluster


def test_a_cut_narrows_the_group_and_keeps_the_rest(tmp_path):
    source = tmp_path / "bench.gcp"
    source.mkdir()
    gce = {"project": "hostnet-box", "zone": "us-central1-a", "service_account_file": "/s/sa.json"}
    (source / "gcp_compute.yml").write_text(yaml.safe_dump(cluster.gcp_compute_config(gce)))
    (source / "box.yml").write_text("llamafactory:\n  vars: {ansible_user: gce}\n")
    bench = runs.BenchCluster(8, tmp_path / "logs")
    bench.state = {"gcp_inventory": str(source)}

    cut = bench.inventory(2)
    assert cut == tmp_path / "bench-n2.gcp"
    config = yaml.safe_load((cut / "gcp_compute.yml").read_text())
    whole = cluster.gcp_compute_config(gce)
    assert config["groups"]["llamafactory"] == (
        f"({whole['groups']['llamafactory']}) and (labels['llamafactory-rank'] | int) < 2"
    )
    assert {k: v for k, v in config.items() if k != "groups"} == {
        k: v for k, v in whole.items() if k != "groups"
    }
    assert (cut / "box.yml").read_text() == (source / "box.yml").read_text()
    assert (cut / "group_vars").readlink().as_posix() == "../group_vars"

    ranked = yaml.safe_load(
        (bench.inventory(2, duplicate_rank=True) / "gcp_compute.yml").read_text()
    )
    assert ranked["compose"]["llamafactory_node_rank"] == "0"
    assert bench.inventory(2) == cut  # made again in place
    # A VM's own variables: in host_vars/ of a folder of its own, only this run's.
    first = bench.inventory(2, host_vars={"vm1": {"llamafactory_node_rank": 0}})
    assert first == tmp_path / "bench-n2-vars.gcp"
    assert yaml.safe_load((first / "host_vars" / "vm1.yml").read_text()) == {
        "llamafactory_node_rank": 0
    }
    bench.inventory(2, host_vars={"vm7": {"llamafactory_interface": "ext0"}})
    assert sorted(p.name for p in (first / "host_vars").iterdir()) == ["vm7.yml"]
    assert not (cut / "host_vars").exists()


def test_the_failure_runs_are_interleaved_and_the_container_kill_counts_in_both_tables(
    tmp_path, monkeypatch
):
    order = []

    def restart_cost(_bench, case, rep):
        order.append((case, rep))
        return {"seconds": {"rank killed": 70.0, "VM stopped": 80.0, "worker killed": 35.0}[case]}

    monkeypatch.setattr(runs, "restart_cost", restart_cost)
    monkeypatch.setattr(runs, "peer_lost", lambda _bench, bound, _rep: {"seconds": bound + 8.0})
    monkeypatch.setattr(runs, "say", lambda _message: None)
    results = Results(tmp_path)
    runs.failures(None, results, reps=2)
    assert order == [
        ("rank killed", 1),
        ("VM stopped", 1),
        ("worker killed", 1),
        ("worker killed", 2),
        ("VM stopped", 2),
        ("rank killed", 2),
    ]
    summary = json.loads((tmp_path / "results.json").read_text())["summary"]
    assert summary["restart"]["after the first checkpoint"]["ratio"]["median"] == 80 / 70
    on_nodes = summary["restart-on-nodes"]["rank 1 after the first checkpoint"]
    assert on_nodes["ratio"]["median"] == 35 / 70 and on_nodes["worker killed"]["n"] == 2
    assert (
        "## 7. Restarted by the controller or by the agents"
        in (tmp_path / "results.md").read_text()
    )
    runs.failures(None, results, reps=2)  # everything measured: nothing runs again
    assert len(order) == 6


# ansible.posix.profile_tasks' recap as ansible-playbook printed it (2.19, ansible.posix 2.x,
# PROFILE_TASKS_SUMMARY_ONLY/TASK_OUTPUT_LIMIT=all/SORT_ORDER=none): a looped include's task is
# listed once per inclusion, a name longer than the terminal gets the dashes of the time only.
PROFILE_OUTPUT = """\
PLAY RECAP *********************************************************************
localhost                  : ok=6    changed=0    unreachable=0    failed=0    skipped=0

TASKS RECAP ********************************************************************
Wednesday 02 December 2026  08:16:27 +0000 (0:00:02.125)       0:00:02.125 ****
===============================================================================
A short task ------------------------------------------------------------ 0.63s
Loop - with a dash in its name ------------------------------------------ 0.04s
Included task ----------------------------------------------------------- 0.45s
Included task ----------------------------------------------------------- 0.50s
Pull the image (progress every llamafactory_progress_every s, cancelled at llamafactory_pull_timeout) --- 0.50s
"""  # noqa: E501


def test_the_task_profile_is_read_from_the_recap_and_repeated_tasks_are_summed():
    assert runs.task_profile(PROFILE_OUTPUT) == {
        "A short task": 0.63,
        "Loop - with a dash in its name": 0.04,
        "Included task": 0.95,
        "Pull the image (progress every llamafactory_progress_every s, cancelled at "
        "llamafactory_pull_timeout)": 0.5,
    }
    with pytest.raises(runs.BenchError, match="no TASKS RECAP"):
        runs.task_profile("PLAY RECAP ***\nlocalhost : ok=1\n")


def test_a_profile_table_shows_the_whole_run_then_the_slowest_tasks_and_sums_the_rest(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(results_module, "PROFILE_ROWS", 2)
    results = Results(tmp_path)
    items = []
    for rep in (1, 2):
        for variant, scale in (("2 nodes", 1.0), ("8 nodes", 2.0)):
            items.append(
                ("profile-rerun", "(the whole run)", variant, rep, {"seconds": 20 * scale})
            )
            for task, seconds in (("a", 1.0), ("b", 5.0), ("c", 3.0), ("d", 0.5)):
                items.append(("profile-rerun", task, variant, rep, {"seconds": seconds * scale}))
    results.add_many(items)
    table = (tmp_path / "results.md").read_text()
    assert (
        "| task | 2 nodes | 8 nodes | 8 nodes / 2 nodes |\n|---|---|---|---|\n"
        "| (the whole run) | 20.0 (20.0-20.0) | 40.0 (40.0-40.0) | 2.00 (2.00-2.00)x |\n"
        "| b | 5.0 (5.0-5.0) | 10.0 (10.0-10.0) | 2.00 (2.00-2.00)x |\n"
        "| c | 3.0 (3.0-3.0) | 6.0 (6.0-6.0) | 2.00 (2.00-2.00)x |\n"
        "| the other 2 tasks (sum of medians) | 1.5 | 3.0 | |\n"
    ) in table
    assert len(json.loads((tmp_path / "results.json").read_text())["measurements"]) == 20


class ScaleBench:
    """A bench of 16 VMs (the scale series measures 2, 8 and 16; 32 needs --nodes 32)."""

    nodes = [{}] * 16

    def __init__(self):
        self.trained = []

    @staticmethod
    def push_standin():
        return "registry/standin"

    @staticmethod
    def inventory(count):
        return f"bench-n{count}.gcp"

    def train(self, inventory, job, _label, _deadline, **extra):
        self.trained.append((inventory, job, extra.get("_playbook", "playbooks/train.yml")))
        return {"rc": 0, "output": f"job {job} finished"}


def scale_with(monkeypatch, once):
    """runs.scale measures each (count, rep) with `once`, in this process."""
    monkeypatch.setattr(runs, "_scale_once", once)
    monkeypatch.setattr(runs, "_become_subreaper", lambda: None)


def test_the_scale_series_is_interleaved_and_paired_with_the_2_vm_run(tmp_path, monkeypatch):
    order = []

    def once(_bench, count, rep, job_vars):
        order.append((rep, count))
        assert job_vars["_env"] == {"ANSIBLE_FORKS": "5"}  # Ansible's default forks
        assert job_vars["llamafactory_image"] == "registry/standin"
        return dict((name, float(count * 10 + rep)) for name in runs.SCALE_FIGURES)

    scale_with(monkeypatch, once)
    results = Results(tmp_path)
    bench = ScaleBench()
    runs.scale(bench, results, reps=2)
    # Every VM set up first, and its job waited for until it ends.
    assert bench.trained == [
        ("bench-n16.gcp", "scale-warm-n16", "playbooks/train.yml"),
        ("bench-n16.gcp", "scale-warm-n16", "playbooks/wait.yml"),
    ]
    assert order == [(1, 2), (1, 8), (1, 16), (2, 16), (2, 8), (2, 2)]
    rows = results.measurements
    case = "re-run (s), 16 VMs"
    assert [(m["variant"], m["rep"], m["value"]) for m in rows if m["case"] == case] == [
        ("2 VMs", 1, 21.0),
        ("N VMs", 1, 161.0),
        ("2 VMs", 2, 22.0),
        ("N VMs", 2, 162.0),
    ]
    assert len(rows) == 2 * 2 * 2 * len(runs.SCALE_FIGURES)  # 8 and 16 VMs, 2 reps, 2 variants
    assert "| re-run (s), 16 VMs | 21.5 (21.0-22.0) | 161.5 (161.0-162.0) |" in (
        (tmp_path / "results.md").read_text()
    )
    # A resumed run measures only what is missing (the 2-VM run again, for the pairs).
    order.clear()
    runs.scale(ScaleBench(), Results(tmp_path, resume=True), reps=2)
    assert order == [(1, 2), (2, 2)]


def test_a_scale_count_that_fails_keeps_the_smaller_ones(tmp_path, monkeypatch):
    """32 VMs failed once after 2, 8 and 16 had been measured: those are kept."""

    def once(_bench, count, rep, _job_vars):
        if count == 16:
            raise runs.BenchError("scale 16 VMs 1: the launch failed")
        return dict((name, float(count)) for name in runs.SCALE_FIGURES)

    scale_with(monkeypatch, once)
    results = Results(tmp_path)
    with pytest.raises(runs.BenchError):
        runs.scale(ScaleBench(), results, reps=1)
    saved = json.loads((tmp_path / "results.json").read_text())["measurements"]
    assert {m["case"] for m in saved} == {f"{name}, 8 VMs" for name in runs.SCALE_FIGURES}


class ForksBench(ScaleBench):
    """The scale bench whose runs take 10 s per fork setting (5 forks: 50 s) and name the fault."""

    def train(self, inventory, job, label, _deadline, **extra):
        forks = int(extra.get("_env", {}).get("ANSIBLE_FORKS", 0))
        self.trained.append((job, forks, extra.get("_playbook", "playbooks/train.yml")))
        return {
            "rc": 1 if "fault" in job else 0,
            "seconds": 10.0 * forks,
            "cpu_s": 16.0 * forks,
            "seen_s": 2.0 * forks,
            "output": f"job {job} finished",
        }


def test_the_forks_series_alternates_5_and_25_forks_on_every_vm(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "_become_subreaper", lambda: None)
    monkeypatch.setattr(runs, "settle", lambda **_kw: 0.0)
    results = Results(tmp_path)
    bench = ForksBench()
    runs.forks(bench, results, reps=2)
    launches = [(job, forks) for job, forks, playbook in bench.trained if "wait" not in playbook]
    assert launches == [
        ("forks-warm-n16", 5),  # every VM set up first, with Ansible's default
        ("forks-f5-r1", 5),
        ("forks-fault-f5-r1", 5),
        ("forks-f25-r1", 25),
        ("forks-fault-f25-r1", 25),
        ("forks-f25-r2", 25),  # the second repetition begins with the other
        ("forks-fault-f25-r2", 25),
        ("forks-f5-r2", 5),
        ("forks-fault-f5-r2", 5),
    ]
    rows = {(m["case"], m["variant"], m["rep"]): m["value"] for m in results.measurements}
    assert rows["launch, detached (s), 16 VMs", "25 forks", 2] == 250.0
    assert rows["launch: controller CPU s per VM, 16 VMs", "5 forks", 1] == 5.0
    assert rows["time to a named cause (s), 16 VMs", "5 forks", 1] == 10.0
    table = (tmp_path / "results.md").read_text()
    assert "| launch, detached (s), 16 VMs | 50.0 (50.0-50.0) | 250.0 (250.0-250.0) | 5.00" in table
    # A resumed run measures nothing more.
    bench = ForksBench()
    runs.forks(bench, Results(tmp_path, resume=True), reps=2)
    assert [(job, playbook) for job, _f, playbook in bench.trained] == [
        ("forks-warm-n16", "playbooks/train.yml"),
        ("forks-warm-n16", "playbooks/wait.yml"),
    ]


class FloorBench(ScaleBench):
    """The scale bench whose floor runs take 1 s per VM and per module call, 1 CPU-s each."""

    def __init__(self):
        super().__init__()
        self.nodes = [{"container": f"vm{i}"} for i in range(16)]

    def train(self, inventory, job, _label, _deadline, **extra):
        self.trained.append((inventory, job, extra.get("floor_calls")))
        count = int(inventory.split("-n")[1].split(".")[0])
        calls = extra.get("floor_calls", 0)
        return {
            "rc": 0,
            "seconds": float(count * (calls + 1)),
            "cpu_s": float(count * calls),
            "output": f"job {job} finished",
        }


def test_the_floor_series_alternates_2_and_every_vm_for_each_case(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "_become_subreaper", lambda: None)
    monkeypatch.setattr(runs, "settle", lambda **_kw: 0.0)
    readings = iter(range(0, 1000, 8))  # the VMs' CPU grows by 8 s in each run
    monkeypatch.setattr(runs, "vms_cpu_s", lambda vms: float(next(readings)))
    results = Results(tmp_path)
    bench = FloorBench()
    runs.floor(bench, results, reps=2)
    # Every VM set up first, and its job waited for until it ends.
    assert bench.trained[:2] == [("bench-n16.gcp", "floor-warm-n16", None)] * 2
    measured = [(inventory, calls) for inventory, job, calls in bench.trained[2:]]
    assert len(measured) == 2 * 2 * len(runs.FLOOR_CASES)
    assert measured[:2] == [("bench-n2.gcp", 0), ("bench-n16.gcp", 0)]
    assert measured[12:14] == [("bench-n16.gcp", 0), ("bench-n2.gcp", 0)]  # the other first
    rows = {(m["case"], m["variant"], m["rep"]): m["value"] for m in results.measurements}
    assert rows["2 module calls per VM: wall (s), 16 VMs", "N VMs", 1] == 48.0
    assert rows["2 module calls per VM: wall (s), 16 VMs", "2 VMs", 2] == 6.0
    assert rows["4 module calls per VM: controller CPU s per VM, 16 VMs", "N VMs", 1] == 4.0
    assert rows["1 module call per VM: the VMs' CPU s per VM, 16 VMs", "2 VMs", 1] == 4.0
    assert rows["1 module call per VM: the VMs' CPU s per VM, 16 VMs", "N VMs", 1] == 0.5
    table = (tmp_path / "results.md").read_text()
    row = "| 2 module calls per VM: wall (s), 16 VMs | 6.0 (6.0-6.0) | 48.0 (48.0-48.0) | 8.00"
    assert row in table
    # A resumed run measures nothing more.
    bench = FloorBench()
    runs.floor(bench, Results(tmp_path, resume=True), reps=2)
    assert [job for _i, job, _c in bench.trained] == ["floor-warm-n16"] * 2


def test_the_rerun_compares_2_vms_with_8_in_a_larger_cluster_too(tmp_path, monkeypatch):
    """With --nodes 32 (the scale series in the same invocation) the 8-VM re-run is the 8 VMs
    that trained, not the whole cluster."""
    asked = []

    class Bench:
        def __init__(self):
            self.nodes = [{"container": f"vm{i}"} for i in range(32)]

        @staticmethod
        def ensure_trained(count, job, deadline_s):
            asked.append(("trained", count))

        @staticmethod
        def inventory(count):
            asked.append(("inventory", count))
            return tmp_path / f"n{count}.gcp"

        @staticmethod
        def train(inventory, job, label, deadline_s):
            return {"rc": 0, "seconds": 10.0, "cpu_s": 8.0, "output": "changed=0 "}

    monkeypatch.setattr(runs, "_become_subreaper", lambda: None)
    rests = []
    monkeypatch.setattr(runs, "settle", lambda **limits: rests.append(limits) or 1.0)
    counted = []
    monkeypatch.setattr(
        runs, "vms_cpu_s", lambda vms: counted.append(len(vms)) or 4.0 * len(counted)
    )
    results = Results(tmp_path)
    runs.rerun(Bench(), results, reps=1)
    assert asked == [("trained", 8), ("inventory", 2), ("inventory", 8)]
    assert counted == [2, 2, 8, 8]  # before and after each run, its VMs only
    figures = {m["variant"]: m["vm_cpu_s_per_node"] for m in results.measurements}
    assert figures == {"2 nodes": 2.0, "8 nodes": 0.5}  # (8 - 4) / 2 and (16 - 12) / 8
    # Once after the trainings, then before each run: every run starts at rest.
    assert rests == [{}, *[{"threshold": runs.RERUN_REST, "quiet_s": 5, "max_s": 60}] * 2]
    assert {m["rested_s"] for m in results.measurements} == {1.0}


def test_task_cpu_gives_each_stretch_to_the_task_that_began_it_and_sums_repeats():
    from bench.callbacks import task_cpu

    marks = [(None, 1.0), ("A", 1.5), ("B", 2.0), ("A", 2.25), (None, 3.0), ("C", 3.5), (None, 4.0)]
    assert task_cpu.attribute(marks) == {"A": 1.25, "B": 0.25, "C": 0.5}
    assert task_cpu.attribute([(None, 1.0)]) == {}


def test_the_task_cpu_callback_writes_every_task_of_a_real_run(tmp_path):
    """ansible-playbook with the callback as the profile enables it, two local hosts."""
    import os
    import subprocess
    import sys

    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- hosts: all\n  gather_facts: false\n  connection: local\n  tasks:\n"
        "    - {name: Count, ansible.builtin.command: 'python3 -c \"sum(range(120000000))\"',"
        " changed_when: false}\n"
        "    - {name: Skip, ansible.builtin.debug: {msg: x}, when: false}\n"
    )
    out = tmp_path / "cpu.json"
    env = {
        **os.environ,
        "ANSIBLE_CALLBACK_PLUGINS": runs.PROFILE_ENV["ANSIBLE_CALLBACK_PLUGINS"],
        "ANSIBLE_CALLBACKS_ENABLED": "task_cpu",
        "TASK_CPU_OUT": str(out),
        "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
    }
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "a,b,", str(playbook)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    spent = runs.task_cpu(out)
    assert set(spent) == {"Count", "Skip"}
    # Two processes each summing 120 million numbers (1-3 s each: Python 3.13 sums faster than
    # 3.11, and 40 million once gave 0.88 s for both there), against two skips.
    assert spent["Count"] > 1.0 > spent["Skip"] >= 0


def test_busy_fraction_is_the_share_of_cpu_time_not_idle():
    # user nice system idle iowait irq softirq steal
    before = [100, 0, 50, 800, 50, 0, 0, 0]
    after = [160, 0, 70, 900, 60, 0, 0, 10]
    assert runs.busy_fraction(before, after) == pytest.approx(90 / 200)
    assert runs.busy_fraction(before, before) == 0.0


def test_a_containers_cpu_is_read_from_its_cgroup_v1_or_v2(tmp_path):
    v1 = tmp_path / "v1" / "cpuacct" / "docker" / "abc"
    v1.mkdir(parents=True)
    (v1 / "cpuacct.usage").write_text("2500000000\n")
    assert runs.container_cpu_s("abc", tmp_path / "v1") == 2.5
    v2 = tmp_path / "v2" / "system.slice" / "docker-abc.scope"
    v2.mkdir(parents=True)
    (v2 / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n")
    assert runs.container_cpu_s("abc", tmp_path / "v2") == 1.5
    assert runs.container_cpu_s("abc", tmp_path / "none") is None


def test_a_revision_is_a_worktree_on_a_collections_path_of_its_own(tmp_path):
    revision = runs.Revision("HEAD", tmp_path)
    try:
        assert (revision.tree / "playbooks" / "train.yml").is_file()
        link = revision.collections / "ansible_collections" / "hostnet" / "llamafactory"
        assert link.resolve() == revision.tree.resolve()
        first, rest = revision.env["ANSIBLE_COLLECTIONS_PATH"].split(":")
        assert first == str(revision.collections)
        assert rest == str(runs.ROOT / ".cache" / "collections")  # the other collections
        assert runs.Revision("HEAD", tmp_path).tree == revision.tree  # made once
        if (runs.ROOT / ".cache" / "assets").is_dir():  # the job's generated model and data
            assert (revision.tree / ".cache" / "assets").resolve() == (
                runs.ROOT / ".cache" / "assets"
            ).resolve()
    finally:
        revision.remove()
    assert not revision.tree.exists() and not revision.collections.exists()
    with pytest.raises(Exception, match="returned non-zero"):
        runs.Revision("no-such-revision", tmp_path)


def test_the_hub_benchmarks_cut_of_the_static_inventory(tmp_path):
    hosts = {
        f"vm{i}": {"ansible_host": f"198.19.3.{10 + i}", "llamafactory_node_rank": i}
        for i in range(8)
    }
    group = {"hosts": hosts, "vars": {"llamafactory_platform": "local"}}
    source = tmp_path / "benchhub.yml"
    source.write_text(yaml.safe_dump({"all": {"children": {"llamafactory": group}}}))
    cut = runs._static_inventory(source, 2)
    assert cut == tmp_path / "benchhub-n2.yml"  # beside it: the same group_vars apply
    data = yaml.safe_load(cut.read_text())["all"]["children"]["llamafactory"]
    assert list(data["hosts"]) == ["vm0", "vm1"] and data["vars"] == group["vars"]


def test_the_hub_benchmark_compares_once_with_each_node():
    assert results_module.COMPARISONS["hub"][:2] == ("each node", "once")
    assert set(runs.HUB_VARIANTS.values()) == {"once", "each_node"}


# profile_tasks' recap of a real up.yml run (1 VM), its role's tasks prefixed with the role.
ROLE = "hostnet.llamafactory.gcp_vms : "
VMS_OUTPUT = "\n".join(
    [
        "TASKS RECAP ********************************************************************",
        "=" * 79,
        ROLE + "Check the VM settings before any API call --- 0.03s",
        ROLE + "Create the VMs, or find them created (quotas first, then zone by zone) --- 8.02s",
        ROLE + "Say where the VMs are -------------------- 0.04s",
        ROLE + "Read the inventory again (the new VMs and their addresses) --- 0.16s",
        "Say what is awaited ----------------------------------------------------- 0.02s",
        "Wait for the VM's SSH (bounded by gcp_vms_ssh_timeout) ------------------ 0.61s",
    ]
)


def test_an_up_run_is_split_into_the_create_task_the_ssh_wait_and_the_rest():
    figures = runs.vms_split(runs.task_profile(VMS_OUTPUT), 9.84)
    assert figures == {
        "up.yml (s)": 9.8,
        "create task (s)": 8.0,
        "SSH wait (s)": 0.6,
        "the rest (s)": 1.2,  # 9.8 - 8.0 - 0.6
    }


def test_the_vms_series_is_interleaved_and_paired_with_the_2_vm_run(tmp_path):
    order = []

    def once(count, rep):
        order.append((rep, count))
        return {"up.yml (s)": float(count + rep), "SSH wait (s)": 1.0}

    results = Results(tmp_path)
    runs.vms_series(results, 2, once)
    assert order == [(r, c) for r in (1, 2) for c in runs.VMS_COUNTS]  # 1, 2, 8, 32, 1, 2 ...
    rows = results.measurements
    whole = [
        (m["variant"], m["rep"], m["value"]) for m in rows if m["case"] == "up.yml (s), 32 VMs"
    ]
    assert whole == [("N VMs", 1, 33.0), ("2 VMs", 1, 3.0), ("N VMs", 2, 34.0), ("2 VMs", 2, 4.0)]
    # The 1-VM run, made before the 2-VM one, is paired with it too.
    assert {m["variant"] for m in rows if m["case"] == "up.yml (s), 1 VMs"} == {"2 VMs", "N VMs"}
    table = (tmp_path / "results.md").read_text()
    assert "| VMs | up.yml (s) | SSH wait (s) | up.yml / 2 VMs (median, min-max) |" in table
    assert "| 32 | 33.5 (33.0-34.0) | 1.0 (1.0-1.0) | 9.75 (8.50-11.00)x |" in table
    assert "| 2 | 3.5 (3.0-4.0) | 1.0 (1.0-1.0) | 1.00 (1.00-1.00)x |" in table
    # A resumed run measures only what is missing, and the 2-VM run again for the pairs.
    results.measurements = [
        m for m in results.measurements if not (m["rep"] == 2 and "8 VMs" in m["case"])
    ]
    order.clear()
    runs.vms_series(results, 2, once)
    assert order == [(2, 2), (2, 8)]


def test_the_vms_chart_is_drawn(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is the bench's own dependency")
    results = Results(tmp_path)
    runs.vms_series(results, 1, lambda count, rep: {"up.yml (s)": 5.0 + count})
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_vms_counts_are_the_floor_2_8_and_the_largest():
    assert runs.vms_counts(32) == runs.VMS_COUNTS == (1, 2, 8, 32)
    assert runs.vms_counts(16) == (1, 2, 8, 16)
    assert runs.vms_counts(4) == (1, 2, 4)


def test_the_preemption_marks_are_timed_as_the_log_shows_them(tmp_path):
    """Each restart step's task banner is timed when it first appears in the followed log."""
    log = tmp_path / "run.log"
    log.write_text("TASK [hostnet.llamafactory.launch : Wait and judge] ***\n")
    seen: dict = {}
    stop = threading.Event()
    started = time.monotonic()
    watcher = threading.Thread(target=runs._marks_seen, args=(log, started, seen, stop))
    watcher.start()
    try:
        time.sleep(1.2)
        assert seen == {}
        banner = "TASK [hostnet.llamafactory.gcp_instances : {}] ***\n"
        with log.open("a") as handle:
            handle.write(banner.format(runs.PREEMPT_MARKS["cause named"]))
        time.sleep(1.2)
        with log.open("a") as handle:
            handle.write(banner.format(runs.PREEMPT_MARKS["VM back"]))
            handle.write(banner.format(runs.PREEMPT_MARKS["relaunch decided"]))
        deadline = time.monotonic() + 10
        while len(seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        watcher.join()
    assert list(seen) == ["cause named", "VM back", "relaunch decided"]
    assert 1.0 <= seen["cause named"] < seen["VM back"] == seen["relaunch decided"]


def test_the_scale_profiles_keep_2_vms_and_the_largest_count(tmp_path, monkeypatch):
    def once(_bench, count, rep, _job_vars):
        figures = dict((name, float(count)) for name in runs.SCALE_FIGURES)
        figures["profiles"] = {
            "launch, detached (s)": {runs.WHOLE_RUN: count * 2.0, "Start the rank": count / 4},
            "time to a named cause (s)": {runs.WHOLE_RUN: count * 1.0},
        }
        return figures

    scale_with(monkeypatch, once)
    results = Results(tmp_path)
    runs.scale(ScaleBench(), results, reps=1)
    launch = [m for m in results.measurements if m["bench"] == "profile-scale-launch"]
    assert {(m["case"], m["variant"], m["seconds"]) for m in launch} == {
        (runs.WHOLE_RUN, "2 VMs", 4.0),
        ("Start the rank", "2 VMs", 0.5),
        (runs.WHOLE_RUN, "N VMs", 32.0),
        ("Start the rank", "N VMs", 4.0),
    }
    assert "| Start the rank | 0.5 | 4.0 | 8.00x |" in (tmp_path / "results.md").read_text()


def test_the_machines_busy_time_grows_with_work():
    before = runs.machine_busy_s()
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # 0.3 s of this process's CPU
        pass
    assert runs.machine_busy_s() - before >= 0.25


class FaultBench(ScaleBench):
    """A bench of 16 VMs whose faulty runs name their fault after 2 s per VM: each names the
    cut's last VM, but the wrong NIC on 16 VMs names vm1 (not vm15)."""

    def __init__(self):
        super().__init__()
        self.nodes = [{"name": f"vm{i}", "container": f"c{i}", "nic": "ens4"} for i in range(16)]
        names = ("bench-n2-nodes", "bench-n16-nodes", "bench-n2-rank0-nodes", "default-allow-ssh")
        self.project_rules = {name: {"name": name} for name in names}
        self.box = self
        self.inventories = []
        self.rules_in_run = []

    def rules(self):
        return dict(self.project_rules)

    def rule(self, name):
        return self.project_rules.get(name)

    def delete_rule(self, name):
        del self.project_rules[name]

    def insert_rule(self, rule):
        self.project_rules[rule["name"]] = rule

    def inventory(self, count, host_vars=None):
        self.inventories.append((count, host_vars))
        return f"bench-n{count}.gcp"

    def train(self, inventory, job, _label, _deadline, **extra):
        self.trained.append((inventory, job, extra))
        count = int(inventory.split("-n")[1].split(".")[0])
        if "_watch" not in extra:
            return {"rc": 0, "output": f"job {job} finished"}
        if extra.get("gcp_firewall_state") == "absent":
            self.project_rules.pop(f"bench-n{count}-nodes", None)
            self.rules_in_run.append(sorted(self.project_rules))
        named = "vm1" if "wrong-nic" in job and count == 16 else f"vm{count - 1}"
        watch = extra["_watch"] if isinstance(extra["_watch"], str) else extra["_watch"][-1]
        line = f'fatal: [vm0]: FAILED! => {{"msg": "{watch}: about {named} there"}}'
        return {"rc": 2, "seen_s": 2.0 * count, "seconds": 9.0, "output": f"TASK\n{line}\nend"}


def test_the_faults_at_scale_alternate_2_and_every_vm_and_check_the_node_named(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(runs, "_become_subreaper", lambda: None)
    monkeypatch.setattr(runs, "rest", lambda: 0.0)
    commands = []
    monkeypatch.setattr(
        runs, "vm_sh", lambda container, script, **_kw: commands.append((container, script))
    )
    results = Results(tmp_path)
    bench = FaultBench()
    runs.scale_faults(bench, results, reps=2)
    # Every VM set up first, and its job waited for until it ends.
    assert [job for _i, job, _e in bench.trained[:2]] == ["scale-faults-warm-n16"] * 2
    measured = [(inventory, job.rsplit("-", 1)[0]) for inventory, job, _e in bench.trained[2:]]
    assert len(measured) == 2 * 2 * len(runs.SCALE_FAULTS)
    assert measured[:2] == [
        ("bench-n2.gcp", "sf-bridge-networking-n2-r1"),
        ("bench-n16.gcp", "sf-bridge-networking-n16-r1"),
    ]
    assert measured[10:12] == [
        ("bench-n16.gcp", "sf-bridge-networking-n16-r2"),
        ("bench-n2.gcp", "sf-bridge-networking-n2-r2"),
    ]  # the other first
    for _inventory, _job, extra in bench.trained[2:]:
        assert extra["_env"] == {"ANSIBLE_FORKS": "5"} and extra["launch_wait"] is False
    # A node's own fault on the cut's last VM: iptables there alone, put back; host_vars there.
    blocked = [c for c in commands if "30000:65535" in c[1]]
    assert blocked[:2] == [("c1", blocked[0][1]), ("c1", blocked[1][1])]
    assert blocked[0][1].startswith("iptables -I") and blocked[1][1].startswith("iptables -D")
    assert {container for container, _s in blocked} == {"c1", "c15"}
    assert (16, {"vm15": {"llamafactory_node_rank": 0}}) in bench.inventories
    assert (2, {"vm1": {"llamafactory_interface": "ext0"}}) in bench.inventories
    # No rule between the nodes in the run without one (every cut's deleted, the others kept),
    # each put back after it.
    assert bench.rules_in_run == [["default-allow-ssh"]] * 4
    assert bench.rules() == FaultBench().rules()
    rows = {(m["case"], m["variant"], m["rep"]): m for m in results.measurements}
    blocked_16 = rows["blocked port on the last node", "N VMs", 1]
    assert blocked_16["seconds"] == 32.0 and blocked_16["named"] and blocked_16["node_named"]
    assert blocked_16["node"] == "vm15" and blocked_16["vms"] == 16
    assert blocked_16["shown"] == 'peer-unreachable: about vm15 there"}'
    wrong_nic = rows["wrong NIC on the last node", "2 VMs", 1]
    assert wrong_nic["node_named"] is True and wrong_nic["shown"].startswith("Asymmetric paths")
    assert rows["wrong NIC on the last node", "N VMs", 1]["node_named"] is False
    assert rows["bridge networking", "N VMs", 2]["node_named"] is None
    table = (tmp_path / "results.md").read_text()
    assert "| failure | 2 VMs (s) | 16 VMs (s) | 16 VMs / 2 VMs |" in table
    assert (
        "| blocked port on the last node | 4.0 (4.0-4.0) | 32.0 (32.0-32.0) | 8.00 (8.00-8.00)x | "
        in table
    )
    assert "| 2 of 2 | 2 of 2 | vm15: 2 of 2 |" in table
    assert "| 2 of 2 | 2 of 2 | vm15: 0 of 2 |" in table  # the wrong NIC, named on vm1
    # A resumed run measures nothing more.
    bench = FaultBench()
    runs.scale_faults(bench, Results(tmp_path, resume=True), reps=2)
    assert [job for _i, job, _e in bench.trained] == ["scale-faults-warm-n16"] * 2


def test_a_findings_line_is_read_without_ansibles_host_and_names_a_vm_as_a_word():
    assert runs.watched("an Asymmetric paths line", ("which the rule is for", "Asymmetric paths"))
    assert not runs.watched("another line", ("which the rule is for", "Asymmetric paths"))
    assert runs.watched("peer-unreachable: x", "peer-unreachable")
    output = (
        'TASK [x]\nfatal: [vm0]: FAILED! => {"msg": "peer-unreachable: vm0 cannot reach vm31"}\n'
    )
    line = runs.finding_line(output, "peer-unreachable")
    assert line == 'peer-unreachable: vm0 cannot reach vm31"}'
    assert runs.finding_line(output, "absent id") == ""
    error = "[ERROR]: Task failed: Action failed: the training address of vm31 is 198.19.192.41"
    assert (
        runs.finding_line(error, "training address")
        == "the training address of vm31 is 198.19.192.41"
    )
    assert runs.names_node(line, "vm31") and runs.names_node(line, "vm0")
    assert not runs.names_node(line, "vm3") and not runs.names_node(line, "vm1")
    assert runs.names_node("shared: 0 (vm0, vm3)", "vm3")
    assert runs.names_node("cannot reach vm3.", "vm3") and not runs.names_node("vm3-b", "vm3")


def test_a_time_to_cause_fault_is_applied_for_one_run_and_undone(monkeypatch):
    commands = []
    monkeypatch.setattr(
        runs, "vm_sh", lambda container, script, **_kw: commands.append((container, script))
    )
    bench = FaultBench()
    bench.nodes_rule = lambda: bench.project_rules["bench-n2-nodes"]
    with runs.fault_applied(bench, "blocked port", hand=False):
        assert [c for c, s in commands if s.startswith("iptables -I")] == ["c0", "c1"]
    assert [c for c, s in commands if s.startswith("iptables -D")] == ["c0", "c1"]
    with runs.fault_applied(bench, "no firewall rule", hand=True):  # the hand launch's: deleted
        assert "bench-n2-nodes" not in bench.rules()
    assert "bench-n2-nodes" in bench.rules()
    with runs.fault_applied(bench, "no firewall rule", hand=False):  # the run deletes it itself
        assert "bench-n2-nodes" in bench.rules()
        bench.delete_rule("bench-n2-nodes")
    assert bench.rules() == FaultBench().rules()  # put back
