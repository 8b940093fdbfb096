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
