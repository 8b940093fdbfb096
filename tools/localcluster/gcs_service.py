"""The box's Cloud Storage (gcs_api.py) as a service of a local cluster: `start(state_dir,
listen)` and `stop(state_dir)`, which cluster.up and cluster.down call after and before the fake
Compute Engine API (compute_service.py), whose CA, OAuth2 endpoint and proxy it relies on.

The front runs daemonized, its objects in STATE_DIR/gcs/data, listening on loopback and on the
`listen` addresses (the host's address on the VMs' network) at 443; start tells the compute
fake's proxy to relay CONNECT storage.googleapis.com to it, creates the cluster's bucket
`{project}-llamafactory`, and records in state.json's "gcs" how to reach it:

- endpoint: https://storage.googleapis.com (the real name; clients set nothing else);
- bucket, project;
- env: what a client on this machine needs (the compute fake's HTTPS_PROXY and
  REQUESTS_CA_BUNDLE, as `localcluster env` prints), service_account_file: its credentials;
- vm_address: where storage.googleapis.com resolves in the VMs (their /etc/hosts), vm_ca_bundle:
  the VMs' system bundle, which holds the box's CA;
- control: the control API (gcs_api.py's /_fake/...), api: the loopback TLS port, pid.

Apart from cluster.py, which starts it: it imports nothing of the cluster's.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import requests

from .util import ClusterError

FRONT = Path(__file__).resolve().with_name("gcs_api.py")
ENDPOINT = "https://storage.googleapis.com"
VM_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def bucket_name(project: str) -> str:
    return f"{project}-llamafactory"


def metadata_key(state_dir: Path) -> Path:
    """The cluster's key for the metadata servers' tokens (made once, 0600)."""
    path = Path(state_dir) / "metadata-token.key"
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(secrets.token_hex(32) + "\n")
    return path


def _front(action: str, state_dir: Path, *args: str) -> None:
    command = [sys.executable, str(FRONT), action, "--state", str(state_dir / "gcs"), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise ClusterError(f"the box's Cloud Storage: {action} failed: {result.stderr.strip()}")


def _control(session: requests.Session, url: str, body: dict) -> dict:
    answer = session.post(url, json=body, timeout=30)
    if answer.status_code != 200:
        raise ClusterError(f"POST {url}: {answer.status_code} {answer.text}")
    return answer.json()


def start(state_dir: Path, listen: list[str] | tuple[str, ...] = ()) -> dict:
    """Run the front for the cluster whose state.json (with "gce") is in state_dir (keep it when
    it runs with the same addresses); record "gcs" in state.json, and return the state."""
    state_dir = Path(state_dir)
    path = state_dir / "state.json"
    state = json.loads(path.read_text())
    gce = state["gce"]
    client_file = state_dir / "gcs" / "client.json"
    wanted = sorted(f"{address}:443" for address in listen)
    running = False
    if client_file.exists():
        client = json.loads(client_file.read_text())
        running = _is_running(client["pid"]) and sorted(client["listen"]) == wanted
        if not running:
            stop(state_dir)
    if not running:
        args = ["--ca-dir", str(state_dir / "gce"), "--project", gce["project"]]
        args += ["--metadata-key", str(metadata_key(state_dir))]
        for address in listen:
            args += ["--listen", address]
        _front("start", state_dir, *args)
    client = json.loads(client_file.read_text())
    session = requests.Session()
    session.trust_env = False  # loopback only, whatever this machine's proxy settings
    try:
        _control(session, f"{gce['proxy']}/_fake/config", {"storage": client["api"]})
        bucket = bucket_name(gce["project"])
        _control(session, f"{client['control']}/buckets", {"name": bucket})
    finally:
        session.close()
    state["gcs"] = {
        "endpoint": ENDPOINT,
        "bucket": bucket,
        "project": gce["project"],
        "env": dict(gce["env"]),
        "service_account_file": gce["service_account_file"],
        "ca": gce["ca"],
        "vm_address": next(iter(listen), None),
        "vm_ca_bundle": VM_CA_BUNDLE,
        "control": client["control"],
        "api": client["api"],
        "pid": client["pid"],
    }
    tmp = path.with_suffix(".gcs-tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(path)
    return state


def _is_running(pid: int) -> bool:
    try:
        return FRONT.name in Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False


def stop(state_dir: Path) -> None:
    """End the cluster's front (by the pid it recorded); nothing when none runs."""
    if (Path(state_dir) / "gcs" / "client.json").exists():
        _front("stop", Path(state_dir))
