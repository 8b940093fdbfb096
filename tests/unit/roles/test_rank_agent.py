"""The ranks' agent (roles/launch/files/rank_agent.py) on loopback: agents of one job on
127.0.0.2, 127.0.0.3, ... (one port, as on the nodes), each running a small stand-in command.
The decision itself (judge) is tested without processes; the cluster tests run it with real
LLaMA-Factory ranks (test_launch.py)."""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loopback import free_port

AGENT = Path(__file__).resolve().parents[3] / "roles" / "launch" / "files" / "rank_agent.py"
spec = importlib.util.spec_from_file_location("rank_agent", AGENT)
rank_agent = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rank_agent)

SETTINGS = {"port": 40000, "peer_timeout": 30, "rendezvous_timeout": 100}


def peer(rank=1, first=None, last=None, state=None):
    p = rank_agent.Peer(rank, f"10.0.0.{rank + 2}")
    p.first_seen, p.last_seen, p.state = first, last, state
    return p


@pytest.mark.parametrize(
    ("peers", "now", "expected"),
    [
        ([peer(last=100, state={"state": "running"})], 129, None),
        ([peer(last=100, state={"state": "running"})], 131, "has not answered for 31 s"),
        ([peer(state=None)], 99, None),
        ([peer(state=None)], 101, "never answered in 100 s"),
        ([peer(last=100, state={"state": "exited", "code": 0})], 500, None),
        ([peer(last=100, state={"state": "exited", "code": 137})], 101, "exited with code 137"),
        (
            [peer(last=100, state={"state": "exited", "code": 75, "why": "stopped by its agent"})],
            101,
            "exited with code 75 (stopped by its agent)",
        ),
        ([peer(1, last=80, state={"state": "running"}), peer(2, state=None)], 95, None),
    ],
)
def test_judge(peers, now, expected):
    found = rank_agent.judge(peers, now, 0, SETTINGS)
    if expected is None:
        assert found is None
    else:
        _kind, why = found
        assert expected in why
        assert why.startswith("rank 1 (10.0.0.3:40000) ")


def test_a_zero_timeout_never_stops_for_silence():
    settings = dict(SETTINGS, peer_timeout=0, rendezvous_timeout=0)
    assert rank_agent.judge([peer(last=1, state={"state": "running"})], 10**6, 0, settings) is None
    assert rank_agent.judge([peer()], 10**6, 0, settings) is None


def test_exit_code_of_a_signal_is_a_shells():
    assert rank_agent.exit_code(-9) == 137
    assert rank_agent.exit_code(3) == 3


class Job:
    """`size` agents of one job on loopback, rank r on 127.0.0.(r+2)."""

    def __init__(
        self, tmp_path, commands, peer_timeout=4, rendezvous_timeout=30, absent=0, **extra
    ):
        self.port = free_port()
        self.procs = []
        addresses = {r: f"127.0.0.{r + 2}" for r in range(len(commands) + absent)}
        for rank, command in enumerate(commands):
            settings = {
                "job": "unit",
                "rank": rank,
                "address": addresses[rank],
                "port": self.port,
                "peers": {str(r): a for r, a in addresses.items() if r != rank},
                "peer_timeout": peer_timeout,
                "rendezvous_timeout": rendezvous_timeout,
                "interval": 1,
                "stop_grace": 2,
                **{key: value(rank) for key, value in extra.items()},
            }
            path = tmp_path / f"agent{rank}.json"
            path.write_text(json.dumps(settings))
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, str(AGENT), str(path), "--", sys.executable, "-c", command],
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )

    def wait(self, rank, timeout):
        proc = self.procs[rank]
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, ""
        return proc.returncode, proc.stderr.read()

    def close(self):
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait()
            proc.stderr.close()


@pytest.fixture
def job(tmp_path):
    jobs = []

    def make(*commands, **settings):
        jobs.append(Job(tmp_path, commands, **settings))
        return jobs[-1]

    yield make
    for j in jobs:
        j.close()


SLEEP = "import time; time.sleep(120)"


def test_a_frozen_rank_stops_the_others_within_the_bound(job):
    j = job(SLEEP, SLEEP, peer_timeout=4)
    time.sleep(3)  # both answered
    os.kill(j.procs[1].pid, signal.SIGSTOP)  # its agent frozen: the kernel still accepts
    frozen = time.monotonic()
    code, err = j.wait(0, timeout=30)
    took = time.monotonic() - frozen
    assert code == rank_agent.EXIT_PEER_LOST, err
    assert 4 <= took < 25  # bound + interval + ask timeout + linger, generously
    assert f"rank 0: stopping this rank: rank 1 (127.0.0.3:{j.port}) has not answered" in err


def test_a_failed_rank_stops_the_others_and_its_code_is_kept(job, tmp_path):
    j = job(
        SLEEP,
        "import sys, time; time.sleep(2); sys.exit(3)",
        SLEEP,
        peer_timeout=60,
        state_file=lambda rank: str(tmp_path / f"state{rank}.json"),
    )
    for rank, expected in ((1, 3), (0, 75), (2, 75)):
        code, err = j.wait(rank, timeout=30)
        assert code == expected, err
    assert "exited with code 3" in err or "exited with code 75" in err
    # Rank 0's view of the others, which the controller's wait reads (one fork for the job).
    state = json.loads((tmp_path / "state0.json").read_text())
    view = state["peers"]
    assert sorted(view) == ["1", "2"]
    # Every rank's address as the agent was given them (the collect step's record after wait.yml).
    assert state["addresses"] == {"0": "127.0.0.2", "1": "127.0.0.3", "2": "127.0.0.4"}
    assert view["1"]["answer"]["state"] == "exited" and view["1"]["answer"]["code"] == 3
    assert isinstance(view["1"]["seen_at"], float) and "quiet_s" in view["2"]["answer"]


def test_a_silent_but_live_rank_is_not_stopped_and_all_finish(job):
    # No output at all for longer than the bound: the agents still answer.
    j = job("import time; time.sleep(8)", "import time; time.sleep(9)", peer_timeout=3)
    for rank in (0, 1):
        code, err = j.wait(rank, timeout=30)
        assert code == 0, err
        assert "stopping this rank" not in err


def test_a_rank_that_never_answers_is_bounded_by_the_rendezvous_timeout(job):
    j = job(SLEEP, peer_timeout=60, rendezvous_timeout=3, absent=1)  # rank 1 never started
    code, err = j.wait(0, timeout=30)
    assert code == rank_agent.EXIT_PEER_LOST
    assert "never answered in 3 s (rendezvous_timeout)" in err


def test_sigterm_stops_the_training_as_docker_stop_does(job):
    j = job("import time; time.sleep(120)", peer_timeout=0)
    time.sleep(1.5)
    j.procs[0].send_signal(signal.SIGTERM)
    code, err = j.wait(0, timeout=20)
    assert code == 128 + signal.SIGTERM, err


def test_the_time_limit_stops_every_rank_and_is_not_restarted(job, tmp_path):
    deadline = time.time() + 4
    j = job(
        SLEEP,
        SLEEP,
        peer_timeout=20,
        deadline=lambda _rank: deadline,
        max_duration=lambda _rank: 4,
        max_restarts=lambda _rank: 2,
        state_file=lambda rank: str(tmp_path / f"state{rank}.json"),
    )
    for rank in (0, 1):
        code, err = j.wait(rank, timeout=40)
        assert code == rank_agent.EXIT_MAX_DURATION, err
        assert time.time() >= deadline
        said = f"rank {rank}: stopping this rank: the job ran to gcp_instances_max_duration (4 s)"
        assert said in err
        assert "restart" not in err
        state = json.loads((tmp_path / f"state{rank}.json").read_text())
        assert state["why"].startswith("stopped by its agent: the job ran to")
        assert state["end"]["kind"] == "max-duration"


def test_a_peer_stopped_at_the_time_limit_is_the_limit_not_a_failure():
    """A node whose clock is a little behind sees its peer stop at the limit before its own."""
    settings = {"deadline": 1000.0, "max_duration": 60}
    stopped = peer(last=999, state={"state": "exited", "code": rank_agent.EXIT_MAX_DURATION})
    assert rank_agent.past_deadline([stopped], 990.0, settings) == (
        "the job ran to gcp_instances_max_duration (60 s) (rank 1 stopped at it)"
    )
    running = peer(last=999, state={"state": "running"})
    assert rank_agent.past_deadline([running], 990.0, settings) is None
    assert rank_agent.past_deadline([running], 1000.0, settings).endswith("(60 s)")
    assert rank_agent.past_deadline([stopped], 990.0, {"deadline": None}) is None


def test_a_command_that_cannot_start_is_named_and_stops_the_others(job, tmp_path):
    settings = {
        "job": "unit",
        "rank": 0,
        "address": "127.0.0.2",
        "port": free_port(),
        "peers": {},
        "peer_timeout": 0,
        "rendezvous_timeout": 0,
        "interval": 1,
        "stop_grace": 1,
    }
    path = tmp_path / "alone.json"
    path.write_text(json.dumps(settings))
    result = subprocess.run(
        [sys.executable, str(AGENT), str(path), "--", "/nonexistent/llamafactory-cli"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 127
    assert "cannot start /nonexistent/llamafactory-cli" in result.stderr


# torchrun's summary when it gives up (the format of torch.distributed.elastic's ChildFailedError).
TORCHRUN_FAILED = """[rank1]: Traceback (most recent call last):
E1202 10:00:07.123000 41 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9)
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/usr/local/bin/llamafactory-cli FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_10:00:07
  host      : vm1
  rank      : 1 (local_rank: 0)
  exitcode  : {code} (pid: 57)
  error_file: <N/A>
  traceback : {traceback}
============================================================
"""


LAUNCHER_KILLED = (
    "subprocess.CalledProcessError: Command '['torchrun', '--nnodes', '2', '--node_rank', '1', "
    "'--nproc_per_node', '1', '--master_addr', '198.18.32.10', '--master_port', '29807', "
    "'/opt/llamafactory/lib/python3.11/site-packages/llamafactory/launcher.py', "
    "'/var/lib/llamafactory/jobs/e2e-agent/config.yaml']' died with <Signals.SIGKILL: 9>.\n"
)


@pytest.mark.parametrize(
    ("code", "output", "oom", "kind"),
    [
        (0, "", False, "done"),
        (137, "", False, "killed"),
        (137, "", True, "oom"),
        (
            1,
            TORCHRUN_FAILED.format(code=-9, traceback="Signal 9 (SIGKILL) received by PID 57"),
            0,
            "killed",
        ),
        (
            1,
            TORCHRUN_FAILED.format(code=-6, traceback="Signal 6 (SIGABRT) received by PID 57"),
            0,
            "error",
        ),
        (
            1,
            TORCHRUN_FAILED.format(code=1, traceback="To enable traceback see: ..."),
            False,
            "error",
        ),
        # A SIGKILL named outside the root cause (a worker stopped after the real failure).
        (
            1,
            "exitcode  : -9 (pid: 3)\n" + TORCHRUN_FAILED.format(code=1, traceback="-"),
            0,
            "error",
        ),
        (1, "", False, "error"),
        # llamafactory-cli when the torchrun it runs was killed (captured on the local box).
        (1, LAUNCHER_KILLED, False, "killed"),
        (1, LAUNCHER_KILLED.replace("SIGKILL: 9", "SIGTERM: 15"), False, "error"),
    ],
)
def test_classify_names_a_killed_worker_from_torchruns_root_cause(code, output, oom, kind):
    assert rank_agent.classify(code, output, oom)[0] == kind


def end(kind, step=None):
    return {"kind": kind, "why": kind, "step": step}


@pytest.mark.parametrize(
    ("ends", "restarts", "maximum", "restart", "why"),
    [
        ({0: end("peer", 23), 1: end("killed")}, [], 1, True, "a killed rank"),
        ({0: end("error", 23), 1: end("killed")}, [], 1, True, "a killed rank"),
        ({0: end("error", 23), 1: end("killed")}, [], 0, False, "no restart left"),
        ({0: end("peer", 23), 1: end("error")}, [], 2, False, "failed on its own"),
        ({0: end("error", 23), 1: end("error")}, [], 2, False, "failed on its own"),
        ({0: end("lost", 23), 1: end("killed")}, [], 2, False, "a node is gone"),
        ({0: end("peer", 23), 1: end("oom")}, [], 2, False, "out of memory"),
        ({0: end("stopped"), 1: end("killed")}, [], 2, False, "on purpose"),
        (
            {0: end("peer", 23), 1: end("killed")},
            [{"kind": "killed", "step": 23}],
            2,
            False,
            "twice",
        ),
        (
            {0: end("peer", 24), 1: end("killed")},
            [{"kind": "killed", "step": 23}],
            2,
            True,
            "killed",
        ),
        ({0: end("done", 60), 1: end("done")}, [], 2, False, "finished"),
    ],
)
def test_restart_decision(ends, restarts, maximum, restart, why):
    again, cause, reason = rank_agent.restart_decision(ends, restarts, maximum)
    if again:  # the controller's restarts before this launch count too
        assert not rank_agent.restart_decision(ends, restarts, maximum, before=maximum)[0]
    assert again is restart
    assert why in reason
    if cause:
        assert cause.startswith("rank ")


def test_the_relaunch_replaces_the_launchs_resume_arguments():
    command = ["llamafactory-cli", "train", "c.yaml", "resume_from_checkpoint=/o/checkpoint-5"]
    assert rank_agent.relaunch_command(command, "/o", 10, False)[3:] == [
        "resume_from_checkpoint=/o/checkpoint-10"
    ]
    assert rank_agent.relaunch_command(command, "/o", None, True)[3:] == [
        "overwrite_output_dir=true"
    ]
    assert rank_agent.relaunch_command(command, "/o", None, False) == command[:3]


def checkpoint(root, step, *names):
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).mkdir() if name.startswith("global_step") else (folder / name).touch()


def test_complete_checkpoints_follow_the_controllers_rule(tmp_path):
    from ansible_collections.hostnet.llamafactory.plugins.module_utils import _job

    checkpoint(tmp_path, 10, "trainer_state.json", "global_step10", "latest")
    checkpoint(tmp_path, 20, "trainer_state.json", "latest")  # shards not written yet
    checkpoint(tmp_path, 30, "adapter_model.safetensors")  # no trainer state
    checkpoint(tmp_path, 40, "trainer_state.json", "adapter_model.safetensors")  # no DeepSpeed
    (tmp_path / "checkpoint-x").mkdir()
    listing = {p.name: [c.name for c in p.iterdir()] for p in tmp_path.iterdir()}
    assert rank_agent.complete_checkpoints(str(tmp_path)) == [10, 40]
    assert _job.complete_checkpoints(listing) == [10, 40]


# A stand-in rank: killed (SIGKILL) the first time (every time with ALWAYS), then it notes the
# arguments of its relaunch and finishes.
KILLED_ONCE = """
import os, signal, sys, time
marker = MARKER
if ALWAYS or not os.path.exists(marker):
    open(marker, "w").close()
    time.sleep(2)
    os.kill(os.getpid(), signal.SIGKILL)
open(marker + ".args", "w").write(" ".join(sys.argv[1:]))
"""
# The other rank: runs until its agent stops it, the first time (or always); then as KILLED_ONCE.
STOPPED_ONCE = """
import os, sys, time
marker = MARKER
if ALWAYS or not os.path.exists(marker):
    open(marker, "w").close()
    time.sleep(120)
open(marker + ".args", "w").write(" ".join(sys.argv[1:]))
"""


def restartable(job, tmp_path, max_restarts, always=False):
    """Rank 0 runs until stopped, rank 1 is killed; each has its own output folder: both hold
    checkpoint-2, rank 0 also checkpoint-4, and rank 0's trainer log ends at step 5."""
    outputs = [tmp_path / f"out{rank}" for rank in range(2)]
    for output in outputs:
        checkpoint(output, 2, "trainer_state.json", "global_step2")
    checkpoint(outputs[0], 4, "trainer_state.json", "global_step4", "latest")
    (outputs[0] / "trainer_log.jsonl").write_text('{"current_steps": 5, "total_steps": 9}\n')
    commands = [
        STOPPED_ONCE.replace("MARKER", repr(str(tmp_path / "marker0"))).replace(
            "ALWAYS", repr(always)
        ),
        KILLED_ONCE.replace("MARKER", repr(str(tmp_path / "marker1"))).replace(
            "ALWAYS", repr(always)
        ),
    ]
    return job(
        *commands,
        peer_timeout=20,
        max_restarts=lambda _rank: max_restarts,
        output_dir=lambda rank: str(outputs[rank]),
        state_file=lambda rank: str(tmp_path / f"state{rank}.json"),
    ), outputs


def test_a_killed_rank_restarts_the_job_on_the_nodes_from_the_common_checkpoint(job, tmp_path):
    j, outputs = restartable(job, tmp_path, max_restarts=1)
    ends = [j.wait(rank, timeout=60) for rank in (0, 1)]
    assert [code for code, _err in ends] == [0, 0], "\n".join(err for _code, err in ends)
    err = ends[1][1]
    line = next(line for line in err.splitlines() if "restart 1 of 1" in line)
    assert line.endswith(
        "restart 1 of 1 on the nodes after rank 1 killed (SIGKILL, exit 137) at step 5: "
        "resuming from checkpoint-2, 3 steps lost"
    )
    for rank in (0, 1):
        args = (tmp_path / f"marker{rank}.args").read_text()
        assert args == f"resume_from_checkpoint={outputs[rank]}/checkpoint-2"
    # DeepSpeed's "latest" marker, which rank 1's node lacked.
    assert (outputs[1] / "checkpoint-2" / "latest").read_text() == "global_step2"
    state = json.loads((tmp_path / "state0.json").read_text())
    assert state["state"] == "exited" and state["code"] == 0
    assert [(r["attempt"], r["step"], r["resume"], r["lost"]) for r in state["restarts"]] == [
        (1, 5, 2, 3)
    ]


def test_a_node_without_its_checkpoints_leaves_the_restart_to_the_controller(job, tmp_path):
    """Rank 1's node lost its disk (its checkpoints wiped) before its rank was killed: starting
    over would lose the training, so neither agent restarts; the controller restores or names."""
    j, outputs = restartable(job, tmp_path, max_restarts=2)
    shutil.rmtree(outputs[1] / "checkpoint-2")
    code, err = j.wait(1, timeout=60)
    assert code == 137, err
    assert "not restarted on the nodes: a node holds no checkpoint while another does" in err
    assert j.wait(0, timeout=30)[0] == rank_agent.EXIT_PEER_LOST
    assert not (tmp_path / "marker1.args").exists()
    assert rank_agent.missing_checkpoint([], [[2, 4]]) and not rank_agent.missing_checkpoint(
        [], [[]]
    )
    assert not rank_agent.missing_checkpoint([2], [[4]])


def test_the_same_kill_at_the_same_step_twice_ends_the_job(job, tmp_path):
    j, _outputs = restartable(job, tmp_path, max_restarts=3, always=True)
    code, err = j.wait(1, timeout=90)
    assert code == 137, err
    assert "not restarted on the nodes: the same failure (killed) at the same step (5) twice" in err
    assert "restart 1 of 3" in err and "restart 2 of 3" not in err
    assert j.wait(0, timeout=30)[0] == rank_agent.EXIT_PEER_LOST


def test_a_rank_that_fails_on_its_own_is_not_restarted(job, tmp_path):
    j = job(SLEEP, "import sys, time; time.sleep(2); sys.exit(3)", max_restarts=lambda _r: 2)
    code, err = j.wait(1, timeout=60)
    assert code == 3, err
    assert "not restarted on the nodes: a rank failed on its own" in err
    assert j.wait(0, timeout=30)[0] == rank_agent.EXIT_PEER_LOST


# -- the network profile's environment (network_env) ----------------------------------------


def env_script(tmp_path, body):
    script = tmp_path / "nccl-env-profile.sh"
    script.write_text(body)
    return str(script)


def test_network_env_sources_the_script_under_the_containers_values(tmp_path):
    # As Google's recipes: the plugin's script sets its tuned NCCL values (and its own
    # LD_LIBRARY_PATH); the job's values win; the plugin's libraries come first.
    script = env_script(
        tmp_path,
        'echo "profile loaded"\n'
        "NCCL_SOCKET_IFNAME=eth0\nNCCL_PROTO=Simple,LL128\nNCCL_BUFFSIZE=8388608\n"
        'LD_LIBRARY_PATH="${NCCL_LIB_DIR}:${LD_LIBRARY_PATH}"\n',
    )
    environ = {
        "PATH": os.environ["PATH"],
        "NCCL_LIB_DIR": "/var/lib/tcpxo/lib64",
        "NCCL_SOCKET_IFNAME": "=enp0s12",
        "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
    }
    network = {
        "env_script": script,
        "library_path": ["/var/lib/tcpxo/lib64", "/usr/lib/x86_64-linux-gnu"],
    }
    env = rank_agent.network_env(network, environ)
    assert env["NCCL_SOCKET_IFNAME"] == "=enp0s12"
    assert (env["NCCL_PROTO"], env["NCCL_BUFFSIZE"]) == ("Simple,LL128", "8388608")
    assert env["LD_LIBRARY_PATH"] == (
        "/var/lib/tcpxo/lib64:/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64"
    )
    assert "profile loaded" not in json.dumps(env)


def test_network_env_of_the_socket_profile_is_the_containers():
    environ = {"NCCL_SOCKET_IFNAME": "=ens4", "LD_LIBRARY_PATH": "/x"}
    assert rank_agent.network_env({}, environ) == environ
    assert rank_agent.network_env(None, environ) == environ


def test_network_env_names_a_missing_or_failing_script(tmp_path):
    with pytest.raises(rank_agent.NetworkEnvError, match="plugin is not installed on this node"):
        rank_agent.network_env({"env_script": str(tmp_path / "absent.sh")}, {})
    broken = env_script(tmp_path, "echo 'no such plugin build' >&2\nexit 4\n")
    with pytest.raises(rank_agent.NetworkEnvError, match=r"exit 4\): no such plugin build"):
        rank_agent.network_env({"env_script": broken}, {"PATH": os.environ["PATH"]})


def test_the_training_starts_with_the_profiles_environment_or_not_at_all(job, tmp_path):
    script = env_script(tmp_path, "NCCL_PROTO=Simple\n")
    check = (
        "import os, sys; e = os.environ; "
        "sys.exit(0 if e['NCCL_PROTO'] == 'Simple' and e['LD_LIBRARY_PATH'].startswith('/plugin')"
        " else 3)"
    )
    network = {"env_script": script, "library_path": ["/plugin/lib64"]}
    code, _err = job(check, network=lambda _r: network).wait(0, 60)
    assert code == 0
    missing = dict(network, env_script=str(tmp_path / "absent.sh"))
    code, err = job(check, network=lambda _r: missing).wait(0, 60)
    assert code == 127
    assert "plugin is not installed on this node" in err
