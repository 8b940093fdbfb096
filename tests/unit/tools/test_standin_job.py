"""The stand-in job for scale runs (tools/localcluster/standin/llamafactory-cli): its ranks as
subprocesses on loopback (rank 0 listens on MASTER_ADDR 127.0.0.2, each rank has its own output
folder, as each node has its own disk), checked with the collection's own readers: the
checkpoint rule of plugins/module_utils/_job.py and roles/launch/files/rank_agent.py, the
trainer log's progress, and the diagnosis table of plugins/plugin_utils/_diagnosis.py."""

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _job
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._diagnosis import diagnose
from loopback import free_port

ROOT = Path(__file__).resolve().parents[3]
CLI = ROOT / "tools" / "localcluster" / "standin" / "llamafactory-cli"
AGENT = ROOT / "roles" / "launch" / "files" / "rank_agent.py"
spec = importlib.util.spec_from_file_location("rank_agent", AGENT)
rank_agent = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rank_agent)

MASTER = "127.0.0.2"
# The shape of the collection's rendered config (to_nice_yaml), with the stand-in's own key.
CONFIG = {
    "stage": "sft",
    "deepspeed": "/var/lib/llamafactory/jobs/unit/ds_z3_config.json",
    "logging_steps": 1,
    "save_steps": 2,
    "plot_loss": True,
    "learning_rate": 0.01,
    "lr_scheduler_type": "cosine",
    "save_on_each_node": True,
    "standin_step_seconds": 0.05,
}


def yaml_value(value):
    return json.dumps(value) if isinstance(value, bool) else str(value)


class Job:
    """`nnodes` ranks of one stand-in job (or those of `ranks` only)."""

    def __init__(self, tmp_path, nnodes, args=(), ranks=None, env=None, **settings):
        self.tmp_path, self.nnodes = tmp_path, nnodes
        self.port = free_port()
        self.procs, self.logs, self.settings = {}, {}, settings
        for rank in range(nnodes) if ranks is None else ranks:
            self.start(rank, args, env or {}, settings)

    def output(self, rank):
        return self.tmp_path / f"out{rank}"

    def start(self, rank, args, env, settings):
        config = dict(CONFIG, output_dir=str(self.output(rank)), **settings)
        path = self.tmp_path / f"config{rank}.yaml"
        lines = [
            f"{key}: {yaml_value(value)}" for key, value in config.items() if value is not None
        ]
        path.write_text("### written as the launch role writes it\n" + "\n".join(lines) + "\n")
        environ = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "FORCE_TORCHRUN": "1",
            "NNODES": str(self.nnodes),
            "NODE_RANK": str(rank),
            "RANK": str(rank),
            "NPROC_PER_NODE": "1",
            "MASTER_ADDR": MASTER,
            "MASTER_PORT": str(self.port),
            "GLOO_SOCKET_IFNAME": "lo",
            "NCCL_SOCKET_IFNAME": "=lo",
            "PET_RDZV_CONF": "timeout=30,join_timeout=30",
            **env,
        }
        log = self.tmp_path / f"rank{rank}-{self.port}.log"  # one per job
        with log.open("w") as handle:
            self.procs[rank] = subprocess.Popen(
                [sys.executable, str(CLI), "train", str(path), *args],
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=environ,
            )
        self.logs[rank] = log

    def wait(self, rank, timeout=20):
        try:
            return self.procs[rank].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def log(self, rank):
        return self.logs[rank].read_text()

    def trainer_log(self, rank=0):
        text = (self.output(rank) / "trainer_log.jsonl").read_text()
        return [json.loads(line) for line in text.splitlines()]

    def checkpoints(self, rank):
        """complete_checkpoints of both parsers; they must agree."""
        out = self.output(rank)
        listing = {
            p.name: [c.name for c in p.iterdir()]
            for p in out.iterdir()
            if _job.CHECKPOINT.match(p.name) and p.is_dir()
        }
        steps = _job.complete_checkpoints(listing)
        assert rank_agent.complete_checkpoints(str(out)) == steps
        return steps

    def stepping(self, steps=2, timeout=15):
        """Wait until rank 0 logged `steps` steps."""
        deadline = time.monotonic() + timeout
        path = self.output(0) / "trainer_log.jsonl"
        while time.monotonic() < deadline:
            if path.exists() and len(path.read_text().splitlines()) >= steps:
                return
            time.sleep(0.05)
        raise AssertionError("the job did not start stepping: " + self.log(0))

    def close(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def job(tmp_path):
    jobs = []

    def make(nnodes, **kwargs):
        jobs.append(Job(tmp_path, nnodes, **kwargs))
        return jobs[-1]

    yield make
    for j in jobs:
        j.close()


def steps_of(records, with_loss=True):
    return [r["current_steps"] for r in records if ("loss" in r) == with_loss]


def test_two_ranks_train_log_every_step_and_save_complete_checkpoints(job):
    j = job(2, max_steps=5)
    assert [j.wait(rank) for rank in (0, 1)] == [0, 0], j.log(0) + j.log(1)
    for rank in (0, 1):
        text = j.log(rank)
        first = text.splitlines()[0]
        assert "hostnet.llamafactory stand-in job" in first and "not LLaMA-Factory" in first
        assert f"node rank: {rank}" in text and "world size: 2" in text  # as test_launch.py
        # LLaMA-Factory's launcher line, which the diagnosis reads for duplicate node ranks.
        assert f"Multi-node training enabled: num nodes: 2, node rank: {rank}" in text
        # Every save_steps and at the end, on every node, each counted complete.
        assert j.checkpoints(rank) == [2, 4, 5]
        shards = os.listdir(j.output(rank) / "checkpoint-4" / "global_step4")
        assert f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt" in shards
        names = set(os.listdir(j.output(rank)))
        assert not [n for n in names if n.startswith("tmp-")]
        # The adapter on every node (ZeRO-3 with save_on_each_node).
        assert (j.output(rank) / "adapter_model.safetensors").stat().st_size > 8
        assert json.loads((j.output(rank) / "adapter_config.json").read_text())["peft_type"]
    # DeepSpeed marks a checkpoint on rank 0 only; rank 0 alone keeps the metrics.
    assert (j.output(0) / "checkpoint-4" / "latest").read_text() == "global_step4"
    assert not (j.output(1) / "checkpoint-4" / "latest").exists()
    assert not (j.output(1) / "all_results.json").exists()
    # LLaMA-Factory's LogCallback writes where the Trainer saves: with save_on_each_node, every
    # node's trainer log holds the same steps and (all-reduced) losses.
    assert [(r["current_steps"], r.get("loss")) for r in j.trainer_log(1)] == [
        (r["current_steps"], r.get("loss")) for r in j.trainer_log(0)
    ]
    assert json.loads((j.output(0) / "all_results.json").read_text())["train_loss"] > 0
    assert (j.output(0) / "training_loss.png").read_bytes()[:4] == b"\x89PNG"
    # trainer_log.jsonl: LLaMA-Factory's records (the fixture's keys), every step, then the
    # end's record without a loss; the controller's and the agent's readers agree.
    records = j.trainer_log()
    fixture = ROOT / "tests" / "unit" / "fixtures" / "job" / "trainer_log-tail.jsonl"
    real = [json.loads(line) for line in fixture.read_text().splitlines()]
    assert [list(r) for r in records] == [list(real[0])] * 5 + [list(real[-1])]
    assert steps_of(records) == [1, 2, 3, 4, 5] and steps_of(records, False) == [5]
    assert records[0]["loss"] > 5.5 > 2.0 > records[-2]["loss"]  # from a guess's loss down
    text = (j.output(0) / "trainer_log.jsonl").read_text()
    progress = _job.last_progress(text)
    assert (progress["step"], progress["total"], progress["percentage"]) == (5, 5, 100.0)
    assert progress["loss"] == records[-2]["loss"]
    assert rank_agent.last_step(str(j.output(0))) == 5


def test_without_save_on_each_node_only_rank_0_holds_whole_checkpoints(job):
    """What the collection's save_on_each_node prevents (docs/how-it-works.md)."""
    j = job(2, max_steps=2, save_on_each_node=False)
    assert [j.wait(rank) for rank in (0, 1)] == [0, 0]
    assert j.checkpoints(0) == [2] and j.checkpoints(1) == []  # rank 1: its shard alone
    assert sorted(os.listdir(j.output(1) / "checkpoint-2")) == ["global_step2", "rng_state_1.pth"]
    assert not (j.output(1) / "trainer_log.jsonl").exists()
    assert not (j.output(1) / "adapter_model.safetensors").exists()


@pytest.mark.parametrize("victim", [1, 0])
def test_a_killed_rank_makes_the_others_exit_1_naming_it_for_the_diagnosis(job, victim):
    j = job(3, max_steps=1000)
    j.stepping()
    j.procs[victim].kill()
    killed_at = time.monotonic()
    assert j.wait(victim) == -signal.SIGKILL
    # Rank 0 is reached at MASTER_ADDR; the others from the address rank 0 saw them join from.
    joined = re.search(rf"rank {victim} joined from \[([^\]]+)\]", j.log(0))
    address = joined.group(1) if victim else MASTER
    for rank in {0, 1, 2} - {victim}:
        assert j.wait(rank, timeout=10) == 1, j.log(rank)
        assert time.monotonic() - killed_at < 10
        text = j.log(rank)
        findings = [f for f in diagnose(text) if f["id"] == "peer-crashed"]
        assert findings, text
        assert f"Connection closed by peer [{address}]:" in findings[0]["line"]
        assert f"(rank {victim}) during the " in findings[0]["line"]  # all-reduce or barrier
        assert f"The rank at {address} went away" in findings[0]["cause"]
        assert f"rank {victim} at [{address}]:" in text.splitlines()[-1]
        assert text.splitlines()[-1].endswith("exiting with code 1")


def test_a_frozen_rank_fails_the_others_after_the_collective_timeout(job):
    j = job(2, max_steps=1000, standin_collective_timeout=1)
    j.stepping()
    os.kill(j.procs[1].pid, signal.SIGSTOP)
    assert j.wait(0, timeout=10) == 1, j.log(0)
    assert [f["id"] for f in diagnose(j.log(0))] == ["collective-timeout"]
    assert "Timed out waiting 1000ms for recv operation to complete (rank 1 at" in j.log(0)


def test_a_resume_continues_after_the_checkpoint_and_appends_to_the_trainer_log(job, tmp_path):
    first = job(2, max_steps=4)
    assert [first.wait(rank) for rank in (0, 1)] == [0, 0], first.log(0) + first.log(1)
    # The launch role marks the common checkpoint on every node (DeepSpeed: rank 0 only).
    (tmp_path / "out1" / "checkpoint-2" / "latest").write_text("global_step2")
    resumed = Job(tmp_path, 2, ranks=[])
    for rank in (0, 1):  # the launch's arguments; max_steps on the command line over the YAML's
        args = [f"resume_from_checkpoint={tmp_path}/out{rank}/checkpoint-2", "max_steps=6"]
        resumed.start(rank, args, {}, {"max_steps": 4})
    try:
        assert [resumed.wait(rank) for rank in (0, 1)] == [0, 0], resumed.log(0)
    finally:
        resumed.close()
    for rank in (0, 1):
        assert "Continuing training from global step 2" in resumed.log(rank)  # as the real log
        assert resumed.checkpoints(rank) == [2, 4, 6]
    records = resumed.trainer_log()
    assert steps_of(records) == [1, 2, 3, 4, 3, 4, 5, 6]  # appended: the resumed run at N+1
    assert steps_of(records, False) == [4, 6]
    state = json.loads((tmp_path / "out0" / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["global_step"] == 6 and [h["step"] for h in state["log_history"]][-2:] == [5, 6]

    # overwrite_output_dir=true (the agent's fresh start): from step 1, the old log deleted.
    fresh = job(2, args=["overwrite_output_dir=true"], max_steps=3)
    assert [fresh.wait(rank) for rank in (0, 1)] == [0, 0], fresh.log(0)
    assert "Previous trainer log in this folder will be deleted." in fresh.log(0)
    assert steps_of(fresh.trainer_log()) == [1, 2, 3]


def test_a_checkpoint_without_deepspeeds_latest_fails_that_rank_and_the_others(job, tmp_path):
    """Why the launch role writes `latest` on every node before a resume."""
    first = job(2, max_steps=2)
    assert [first.wait(rank) for rank in (0, 1)] == [0, 0]
    j = Job(tmp_path, 2, ranks=[])
    for rank in (0, 1):
        j.start(
            rank, [f"resume_from_checkpoint={tmp_path}/out{rank}/checkpoint-2"], {}, first.settings
        )
    try:
        assert [j.wait(rank) for rank in (0, 1)] == [1, 1]
    finally:
        j.close()
    assert "Unable to find latest file at" in j.log(1)
    assert f"[deepspeed] failed to resume from checkpoint {tmp_path}/out1/checkpoint-2" in j.log(1)
    assert [f["id"] for f in diagnose(j.log(0))] == ["peer-crashed"]
    assert "(rank 1) during the first barrier" in j.log(0)


def run_alone(tmp_path, *args, env=None, **settings):
    """One rank without torchrun (FORCE_TORCHRUN unset: a one-device node trains alone)."""
    config = dict(CONFIG, output_dir=str(tmp_path / "alone"))
    config.update(settings)
    path = tmp_path / "alone.yaml"
    path.write_text("\n".join(f"{k}: {yaml_value(v)}" for k, v in config.items() if v is not None))
    return subprocess.run(
        [sys.executable, str(CLI), *(args or ("train", str(path)))],
        capture_output=True,
        text=True,
        timeout=20,
        env={"PATH": os.environ.get("PATH", ""), **(env or {})},
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "settings", "env", "message"),
    [
        ((), {"max_steps": None}, {}, "max_steps is None: the stand-in job needs a positive"),
        ((), {"max_steps": 3, "save_steps": 0}, {}, "save_steps is 0: the stand-in job needs"),
        ((), {"max_steps": 3, "output_dir": ""}, {}, "output_dir is missing"),
        ((), {"max_steps": 3, "standin_step_seconds": "fast"}, {}, "standin_step_seconds is"),
        (("export", "x.yaml"), {}, {}, "usage: llamafactory-cli train CONFIG.yaml"),
        (("train", "/nonexistent.yaml"), {}, {}, "cannot read the config /nonexistent.yaml"),
        (("train", "CONFIG", "max_steps"), {"max_steps": 3}, {}, "'max_steps' is not key=value"),
        (
            ("train", "CONFIG", "resume_from_checkpoint=/nowhere/checkpoint-4"),
            {"max_steps": 3},
            {},
            "ValueError: Can't find a valid checkpoint at /nowhere/checkpoint-4",
        ),
        (
            (),
            {"max_steps": 3},
            {"FORCE_TORCHRUN": "1", "NNODES": "2", "NODE_RANK": "2"},
            "node rank 2 is outside 0..1 (NNODES=2)",
        ),
    ],
)
def test_a_bad_config_exits_1_with_a_clear_message(tmp_path, args, settings, env, message):
    args = tuple(str(tmp_path / "alone.yaml") if a == "CONFIG" else a for a in args)
    result = run_alone(tmp_path, *args, env=env, **settings)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "hostnet.llamafactory stand-in job" in result.stdout.splitlines()[0]
    assert message in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1].endswith("exiting with code 1")


def test_an_interface_the_host_lacks_fails_as_gloo_does(tmp_path):
    env = {"FORCE_TORCHRUN": "1", "NNODES": "2", "NODE_RANK": "1", "GLOO_SOCKET_IFNAME": "nic9"}
    result = run_alone(tmp_path, env=env, max_steps=3)
    assert result.returncode == 1
    assert [f["id"] for f in diagnose(result.stderr)] == ["gloo-interface-missing"]


def test_alone_it_resumes_from_the_newest_checkpoint_as_llamafactory_does(tmp_path):
    assert run_alone(tmp_path, max_steps=2).returncode == 0
    result = run_alone(tmp_path, max_steps=4)
    assert result.returncode == 0, result.stderr
    assert f"Resuming training from {tmp_path}/alone/checkpoint-2." in result.stdout
    assert "Continuing training from global step 2" in result.stdout
    log = (tmp_path / "alone" / "trainer_log.jsonl").read_text().splitlines()
    assert steps_of([json.loads(line) for line in log]) == [1, 2, 3, 4]
    # A world of one: DeepSpeed's layout with rank 0's shard, rng_state.pth without a rank.
    names = os.listdir(tmp_path / "alone" / "checkpoint-4")
    assert "rng_state.pth" in names and "latest" in names


def test_a_rank_whose_peers_never_come_fails_at_the_rendezvous_timeout(job):
    env = {"PET_RDZV_CONF": "timeout=1,join_timeout=1"}
    j = job(3, ranks=[0], env=env, max_steps=3)
    other = Job(j.tmp_path, 2, ranks=[1], env=env, max_steps=3)  # rank 0 of another port
    try:
        assert j.wait(0, timeout=10) == 1 and other.wait(1, timeout=10) == 1
    finally:
        other.close()
    assert "Timed out after 1 seconds waiting for clients. 0/2 clients joined" in j.log(0)
    findings = diagnose(other.log(1))
    assert [f["id"] for f in findings] == ["master-unreachable"]
    assert f"({MASTER}, {other.port})" in findings[0]["line"]


def test_sigterm_ends_it_by_the_signal(job):
    j = job(1, max_steps=1000)
    j.stepping()
    j.procs[0].terminate()
    assert j.wait(0) == -signal.SIGTERM


def test_under_the_rank_agents_a_killed_rank_is_restarted_from_the_common_checkpoint(tmp_path):
    """The stand-in as the agents of roles/launch/files/rank_agent.py run it (PID 1 of each
    rank's container): its rank 1 killed after checkpoint-10, the agents restart both ranks from
    the newest checkpoint both hold (writing DeepSpeed's `latest` where it lacks), the job resumes
    after it and finishes - as test_launch.py checks it with real ranks."""
    agent_port, master_port = free_port(), free_port()
    addresses = {0: MASTER, 1: "127.0.0.3"}
    procs = []
    for rank in (0, 1):
        out = tmp_path / f"out{rank}"
        config = dict(CONFIG, output_dir=str(out), max_steps=40, save_steps=10)
        path = tmp_path / f"config{rank}.yaml"
        path.write_text("".join(f"{k}: {yaml_value(v)}\n" for k, v in config.items()))
        settings = {
            "job": "unit",
            "rank": rank,
            "address": addresses[rank],
            "port": agent_port,
            "peers": {str(r): a for r, a in addresses.items() if r != rank},
            "peer_timeout": 20,
            "rendezvous_timeout": 30,
            "interval": 1,
            "stop_grace": 2,
            "max_restarts": 1,
            "output_dir": str(out),
            "state_file": str(tmp_path / f"state{rank}.json"),
        }
        (tmp_path / f"agent{rank}.json").write_text(json.dumps(settings))
        env = {
            "PATH": os.environ.get("PATH", ""),
            "FORCE_TORCHRUN": "1",
            "NNODES": "2",
            "NODE_RANK": str(rank),
            "RANK": str(rank),
            "NPROC_PER_NODE": "1",
            "MASTER_ADDR": MASTER,
            "MASTER_PORT": str(master_port),
            "PET_RDZV_CONF": "timeout=30,join_timeout=30",
        }
        command = [sys.executable, str(AGENT), str(tmp_path / f"agent{rank}.json"), "--"]
        with (tmp_path / f"agent{rank}.log").open("w") as log:
            procs.append(
                subprocess.Popen(
                    [*command, sys.executable, str(CLI), "train", str(path)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
    try:
        deadline = time.monotonic() + 15
        shards = [tmp_path / f"out{rank}" / "checkpoint-10" for rank in (0, 1)]
        while not all(p.exists() for p in shards):
            assert time.monotonic() < deadline, (tmp_path / "agent0.log").read_text()
            time.sleep(0.05)
        os.kill(json.loads((tmp_path / "state1.json").read_text())["pid"], signal.SIGKILL)
        assert [p.wait(timeout=60) for p in procs] == [0, 0]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = (tmp_path / "agent0.log").read_text()
    restart = next(line for line in text.splitlines() if " on the nodes after " in line)
    assert "after rank 1 killed (SIGKILL, exit 137) at step " in restart
    resumed_at = int(restart.split("resuming from checkpoint-")[1].split(",")[0])
    assert resumed_at >= 10 and f"Continuing training from global step {resumed_at}" in text
    steps = [
        json.loads(line)["current_steps"]
        for line in (tmp_path / "out0" / "trainer_log.jsonl").read_text().splitlines()
    ]
    failed_at = int(restart.split(" at step ")[1].split(":")[0])
    assert steps[:failed_at] == list(range(1, failed_at + 1))
    assert steps[failed_at] == resumed_at + 1 and steps[-1] == 40
