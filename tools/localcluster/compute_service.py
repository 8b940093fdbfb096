"""The fake Compute Engine API (compute_api.py) as a service of a local cluster: `start(state_dir)`
and `stop(state_dir)`, which cluster.up and cluster.down call. The fake runs daemonized with
`--cluster STATE_DIR` (its instances are the cluster's VMs: gce_control.ClusterBackend, which it
makes in its own process), its state in STATE_DIR/gce, no idle timeout; state.json's "gce" says
how a client reaches it (proxy, CA, service-account file, project, zone).

Apart from gce_control.py, which acts on the VMs through cluster.py: cluster.py starts the
service, and gce_control.py imports cluster.py, so neither imports the other.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .util import ClusterError

FAKE = Path(__file__).resolve().with_name("compute_api.py")


def _fake(action: str, state_dir: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(FAKE), action, "--state", str(state_dir / "gce"), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise ClusterError(f"the fake Compute Engine API: {action} failed: {result.stderr.strip()}")
    return result


def start(state_dir: Path) -> dict:
    """Run the fake for the cluster whose state.json is in state_dir (keep it when it runs);
    record in state.json how to reach it, and return the state."""
    path = Path(state_dir) / "state.json"
    state = json.loads(path.read_text())
    client_file = Path(state_dir) / "gce" / "client.json"
    running = client_file.exists() and _is_running(json.loads(client_file.read_text())["pid"])
    if not running:
        _fake("start", Path(state_dir), "--cluster", str(state_dir), "--idle", "0")
    client = json.loads(client_file.read_text())
    state["gce"] = {
        "proxy": client["proxy"],
        "control": client["control"],  # the tests' control API (plain HTTP on loopback)
        "ca": client["ca"],
        "service_account_file": client["service_account_file"],
        "project": client["project"],
        "zone": state["definition"]["zone"],
        "pid": client["pid"],
        "env": client["env"],
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(path)
    return state


def _is_running(pid: int) -> bool:
    try:
        return FAKE.name in Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False


def stop(state_dir: Path) -> None:
    """End the cluster's fake (by the pid it recorded); nothing when none runs."""
    if (Path(state_dir) / "gce" / "client.json").exists():
        _fake("stop", Path(state_dir))
