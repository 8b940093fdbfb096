"""The ranks' agent (roles/launch/files/rank_agent.py) on loopback: agents of one job on
127.0.0.2, 127.0.0.3, ... (one port, as on the nodes), each running a small stand-in command.
The decision itself (judge) is tested without processes; the cluster tests run it with real
LLaMA-Factory ranks (test_launch.py)."""

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
    why = rank_agent.judge(peers, now, 0, SETTINGS)
    if expected is None:
        assert why is None
    else:
        assert expected in why
        assert why.startswith("rank 1 (10.0.0.3:40000) ")


def test_a_zero_timeout_never_stops_for_silence():
    settings = dict(SETTINGS, peer_timeout=0, rendezvous_timeout=0)
    assert rank_agent.judge([peer(last=1, state={"state": "running"})], 10**6, 0, settings) is None
    assert rank_agent.judge([peer()], 10**6, 0, settings) is None


def test_exit_code_of_a_signal_is_a_shells():
    assert rank_agent.exit_code(-9) == 137
    assert rank_agent.exit_code(3) == 3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """`size` agents of one job on loopback, rank r on 127.0.0.(r+2)."""

    def __init__(self, tmp_path, commands, peer_timeout=4, rendezvous_timeout=30, absent=0):
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


def test_a_failed_rank_stops_the_others_and_its_code_is_kept(job):
    j = job(SLEEP, "import sys, time; time.sleep(2); sys.exit(3)", SLEEP, peer_timeout=60)
    for rank, expected in ((1, 3), (0, 75), (2, 75)):
        code, err = j.wait(rank, timeout=30)
        assert code == expected, err
    assert "exited with code 3" in err or "exited with code 75" in err


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
