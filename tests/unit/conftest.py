"""Fixtures shared by unit tests in different folders."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

FAKE_COMPUTE = Path(__file__).resolve().parents[2] / "tools" / "localcluster" / "compute_api.py"


@pytest.fixture(scope="module")
def fake_api(tmp_path_factory):
    """The fake Compute Engine API (tools/localcluster/compute_api.py) as a daemon for the module's
    tests: its client.json (proxy, CA, token, control URL, env)."""
    state = tmp_path_factory.mktemp("fake-compute")
    start = [sys.executable, str(FAKE_COMPUTE), "start", "--state", str(state), "--idle", "120"]
    subprocess.run(start, check=True, capture_output=True, timeout=30)
    try:
        yield json.loads((state / "client.json").read_text())
    finally:
        stop = [sys.executable, str(FAKE_COMPUTE), "stop", "--state", str(state)]
        subprocess.run(stop, timeout=30, check=True)
