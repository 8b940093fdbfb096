"""The preflight probe (roles/preflight/files/preflight_probe.py) itself, on loopback: a listener
answers with its node's name, a closed port is refused (and retried until the deadline), and a
source address the machine does not have fails at once with EADDRNOTAVAIL - what a
bridge-networked container gets when asked to send from its node's address."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loopback import free_port

PROBE = Path(__file__).resolve().parents[3] / "roles" / "preflight" / "files" / "preflight_probe.py"


@pytest.fixture
def listener():
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            str(PROBE),
            "listen",
            "--name",
            "node-a",
            "--seconds",
            "20",
            "--ports",
            str(port),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert json.loads(process.stdout.readline()) == {"listening": [port]}
    yield port
    process.kill()
    process.wait()


def connect(targets, bind="127.0.0.1", timeout=3):
    done = subprocess.run(
        [
            sys.executable,
            str(PROBE),
            "connect",
            "--name",
            "node-b",
            "--bind",
            bind,
            "--timeout",
            str(timeout),
            "--disk",
            "/",
            "--targets",
            json.dumps(targets),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_reach_refuse_and_report(listener):
    closed = free_port()
    started = time.monotonic()
    report = connect(
        [
            {"node": "node-a", "address": "127.0.0.1", "port": listener},
            {"node": "node-c", "address": "127.0.0.1", "port": closed},
        ]
    )
    elapsed = time.monotonic() - started
    reached, refused = report["results"]
    assert reached["ok"] and json.loads(reached["answer"]) == {"node": "node-a"}
    assert not refused["ok"] and "ECONNREFUSED" in refused["error"]
    assert refused["seconds"] >= 2.5  # retried until the deadline (the peer may start late)
    assert elapsed < 20
    assert report["source"] == "127.0.0.1" and report["bind"] == "127.0.0.1"
    assert report["disk"]["free"] > 0 and report["disk"]["path"] == "/"
    assert set(report["packages"]) >= {"llamafactory", "torch"}  # versions, or None


def test_an_address_this_machine_lacks_fails_at_once(listener):
    report = connect(
        [{"node": "node-a", "address": "127.0.0.1", "port": listener}], bind="198.18.255.254"
    )
    (result,) = report["results"]
    assert not result["ok"] and "EADDRNOTAVAIL" in result["error"]
    assert result["seconds"] < 1


def test_a_taken_port_ends_the_listener_and_is_named(listener):
    """A second listener on the same port (what a running job's MASTER_PORT does to the
    preflight's) exits at once; its last lines make the finding."""
    from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import (
        _preflight as preflight,
    )

    done = subprocess.run(
        [sys.executable, str(PROBE), "listen", "--seconds", "5", "--ports", str(listener)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode != 0
    lines = (done.stdout + done.stderr).strip().splitlines()[-5:]
    reports = {
        "vm0": {"listener": {"state": "exited", "exit_code": done.returncode, "log_lines": lines}}
    }
    nodes = {"vm0": {"rank": 0, "address": "10.0.0.2", "interface": "ens4"}}
    found = preflight.findings(reports, nodes, "10.0.0.2", listener, 49999)
    assert found[0]["id"] == "port-in-use"
    assert f"port {listener} (MASTER_PORT) or 49999 (preflight_port)" in found[0]["cause"]
    assert "llamafactory_master_port" in found[0]["fix"]


def start_probe(name, port, peer_port, expect=1, timeout=3, seconds=30, extra=(), targets=None):
    targets = targets or [{"node": "peer", "address": "127.0.0.1", "port": peer_port}]
    return subprocess.Popen(
        [
            sys.executable,
            str(PROBE),
            "probe",
            "--name",
            name,
            "--ports",
            str(port),
            "--expect",
            str(expect),
            "--bind",
            "127.0.0.1",
            "--timeout",
            str(timeout),
            "--seconds",
            str(seconds),
            "--disk",
            "/",
            "--targets",
            json.dumps(targets),
            *extra,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


def lines_of(process):
    out, _err = process.communicate(timeout=60)
    return [json.loads(line) for line in out.splitlines()]


def test_two_probes_started_apart_reach_each_other_and_end_once_signalled():
    """The second probe starts after the first began: the first's refusals are retried until
    its signal (every probe runs), and each ends once its peer reached it."""
    import signal

    a_port, b_port = free_port(), free_port()
    first = start_probe("node-a", a_port, b_port)
    time.sleep(4)  # past --timeout 3: a refusal is retried until the signal, not the timeout
    second = start_probe("node-b", b_port, a_port)
    time.sleep(1)
    started = time.monotonic()
    for process in (first, second):
        process.send_signal(signal.SIGUSR1)
    a_lines, b_lines = lines_of(first), lines_of(second)
    assert time.monotonic() - started < 10  # ended once reached, not at --seconds 30
    assert a_lines[0] == {"listening": [a_port]}
    for lines, peer in ((a_lines, "node-b"), (b_lines, "node-a")):
        (result,) = lines[-1]["results"]
        assert result["ok"] and json.loads(result["answer"]) == {"node": peer}
        assert lines[-1]["listen_error"] == ""
    assert first.returncode == second.returncode == 0


@pytest.fixture
def dropping_port():
    """A loopback port whose accept queue is full: Linux drops further SYNs (a firewall's DROP,
    without one)."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = [socket.socket() for _index in range(3)]
    for filler in fillers:
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
    time.sleep(0.5)
    yield port
    for sock in [*fillers, server]:
        sock.close()


def test_a_probe_without_its_signal_names_a_dropped_peer_after_its_timeout(dropping_port):
    """A peer that never answers is a time-out, final after --timeout even before the signal
    (a refusal would still be retried)."""
    process = start_probe("node-a", free_port(), dropping_port, timeout=2, seconds=6)
    started = time.monotonic()
    assert json.loads(process.stdout.readline())["listening"]
    report = json.loads(process.stdout.readline())
    assert time.monotonic() - started < 5
    (result,) = report["results"]
    assert not result["ok"] and result["error"] == "timed out"
    lines_of(process)  # it ends at --seconds: nobody reached it
    assert 4 < time.monotonic() - started < 20


def test_a_probe_that_cannot_listen_says_so_and_still_reaches_its_peers(listener):
    import signal

    process = start_probe("node-b", listener, listener, seconds=5)
    time.sleep(1)
    process.send_signal(signal.SIGUSR1)
    lines = lines_of(process)
    assert lines[0] == {"listening": []}
    assert "Address already in use" in lines[-1]["listen_error"]
    assert lines[-1]["results"][0]["ok"]  # the listener of the fixture answered
    assert process.returncode == 3


def test_rank_0_gathers_every_report_and_passes_on_its_signal():
    """Rank 0's probe (--collect) takes the others' hellos; its signal alone is the go for all
    of them (passed on over the same connections), and its report holds theirs. The others end
    without a signal of their own, once their peers reached them and rank 0 has their report."""
    import signal

    collect = free_port()
    ports = {name: free_port() for name in ("node-0", "node-1", "node-2")}

    def targets(me):
        return [
            {"node": name, "address": "127.0.0.1", "port": port}
            for name, port in ports.items()
            if name != me
        ]

    def start(name, *gather):
        return start_probe(name, ports[name], None, expect=2, extra=gather, targets=targets(name))

    others = [start(name, "--collector", f"127.0.0.1:{collect}") for name in ("node-1", "node-2")]
    time.sleep(1)  # they say hello before rank 0 listens: retried
    rank0 = start("node-0", "--collect", str(collect))
    time.sleep(1)
    started = time.monotonic()
    rank0.send_signal(signal.SIGUSR1)
    own = lines_of(rank0)[-1]
    assert own["collect_error"] == "" and all(r["ok"] for r in own["results"])
    assert set(own["gathered"]) == {"node-1", "node-2"}
    for name, process in zip(("node-1", "node-2"), others, strict=True):
        theirs = lines_of(process)[-1]
        assert process.returncode == 0
        assert own["gathered"][name] == theirs
        reached = {r["node"] for r in theirs["results"] if r["ok"]}
        assert reached == {"node-0", "node-1", "node-2"} - {name}
    assert time.monotonic() - started < 10  # ended once reached, not at --seconds 30


def test_a_probe_that_cannot_reach_the_collector_is_read_by_itself():
    """No collector answers (rank 0's port unreachable): the probe takes its go by its own
    signal and prints its report, as without gathering, then stays to be read (its container
    would go when it ends) until it is stopped."""
    import signal

    process = start_probe(
        "node-1",
        free_port(),
        free_port(),
        expect=0,
        extra=("--collector", f"127.0.0.1:{free_port()}"),
    )
    assert json.loads(process.stdout.readline())["listening"]
    time.sleep(1)
    started = time.monotonic()
    process.send_signal(signal.SIGUSR1)
    report = json.loads(process.stdout.readline())
    assert time.monotonic() - started < 10
    assert "gathered" not in report and not report["results"][0]["ok"]  # its peer never ran
    time.sleep(1)
    assert process.poll() is None
    process.terminate()
    assert process.wait(timeout=10) == 0


def test_rank_0_names_a_collector_port_it_cannot_take(listener):
    """The collector's port taken (a rank still running there): rank 0's probe says so and
    probes as before; the others are read by themselves."""
    import signal

    process = start_probe(
        "node-0", free_port(), listener, expect=0, extra=("--collect", str(listener))
    )
    time.sleep(1)
    process.send_signal(signal.SIGUSR1)
    report = lines_of(process)[-1]
    assert "Address already in use" in report["collect_error"]
    assert "gathered" not in report and report["results"][0]["ok"]
