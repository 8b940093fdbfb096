"""playbooks/up.yml and down.yml (role gcp_vms) run by ansible-playbook against the fake Compute
Engine API (tools/localcluster/compute_api.py, checked against Google's published contract):
bad settings named before any API call, the group created in the zone with room and a re-run
that changes nothing, and a delete refused until the model is safe on the controller."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import compute_contract
import gce_module
import pytest
import requests

ROOT = Path(__file__).resolve().parents[3]
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
PROJECT = "hlf-test"


@pytest.fixture
def fake(fake_api, tmp_path):
    session = requests.Session()
    session.trust_env = False
    control = fake_api["control"]
    session.post(f"{control}/reset").raise_for_status()
    key = tmp_path / "id.pub"
    key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE0 me@box\n")
    settings = {
        "gcp_vms_count": 2,
        "gcp_vms_project": PROJECT,
        "gcp_vms_zones": ["us-central1-a", "us-central1-b"],
        "gcp_vms_machine_type": "g2-standard-8",
        "gcp_vms_provisioning_model": "spot",
        "gcp_vms_prefix": "trainer",
        "gcp_vms_ssh_user": "gce",
        "gcp_vms_ssh_public_key_file": str(key),
        "llamafactory_gcp_auth_kind": "accesstoken",
        "llamafactory_gcp_access_token": fake_api["token"],
        "launch_results_dir": str(tmp_path / "results"),
        "llamafactory_job": "job1",
    }
    yield fake_api, session, settings, tmp_path
    entries = [e for e in session.get(f"{control}/requests").json() if not e.get("refused")]
    assert compute_contract.validate_log(entries) == []
    session.close()


def play(fake, playbook, **extra):
    info, _session, settings, tmp_path = fake
    variables = tmp_path / "vars.json"
    variables.write_text(json.dumps({**settings, **extra}))
    env = gce_module.ansible_env(info)
    command = [str(PLAYBOOK), str(ROOT / "playbooks" / playbook), "-i", "localhost,"]
    command += ["-c", "local", "-e", f"@{variables}"]
    command += ["-e", f"ansible_python_interpreter={sys.executable}"]
    result = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    output = json.loads(result.stdout)
    tasks = {
        t["task"]["name"].split(" : ")[-1]: t["hosts"].get("localhost", {})
        for p in output["plays"]
        for t in p["tasks"]
    }
    return result.returncode, output["stats"].get("localhost", {}), tasks


def names(fake):
    info, session, _settings, _tmp = fake
    listed = session.get(f"{info['control']}/instances").json()
    return sorted(i["name"] for i in listed.values())


def api_calls(fake):
    info, session, _settings, _tmp = fake
    return [e for e in session.get(f"{info['control']}/requests").json() if e.get("path")]


def test_bad_settings_are_named_before_any_api_call(fake):
    rc, _stats, tasks = play(fake, "up.yml", gcp_vms_zones=[])
    assert rc == 2
    check = tasks["Check the VM settings before any API call"]
    assert "gcp_vms_zones is empty" in check["msg"]
    rc, _stats, tasks = play(fake, "up.yml", gcp_vms_ssh_public_key_file="/nonexistent.pub")
    assert "gcp_vms_ssh_public_key_file /nonexistent.pub does not exist" in str(tasks)
    assert api_calls(fake) == []


def test_up_in_the_zone_with_room_then_nothing_and_down_once_the_model_is_safe(fake):
    info, session, _settings, tmp_path = fake
    session.post(
        f"{info['control']}/config", json={"capacity": {"us-central1-a": {"g2-standard-8": 0}}}
    ).raise_for_status()
    rc, stats, tasks = play(fake, "up.yml")
    assert rc == 0, tasks
    said = tasks["Say where the VMs are"]["msg"]
    assert "2 VMs in us-central1-b" in said
    assert "zones left: us-central1-a - ZONE_RESOURCE_POOL_EXHAUSTED" in said
    assert names(fake) == ["trainer-0", "trainer-1"]
    rc, stats, tasks = play(fake, "up.yml")
    assert (rc, stats["changed"]) == (0, 0)
    assert "none created (they existed)" in tasks["Say where the VMs are"]["msg"]

    # The model is not on the controller: nothing is deleted.
    rc, _stats, tasks = play(fake, "down.yml")
    assert rc == 2
    assert "may hold the only copy of the trained model" in str(tasks)
    assert names(fake) == ["trainer-0", "trainer-1"]
    adapter = tmp_path / "results" / "job1" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")
    digest = hashlib.sha256(b"weights").hexdigest()
    (adapter / "SHA256SUMS").write_text(f"{digest}  adapter_model.safetensors\n")
    rc, stats, tasks = play(fake, "down.yml")
    assert (rc, stats["changed"]) == (0, 1)
    assert "deleted trainer-0, trainer-1" in tasks["Say what was deleted"]["msg"]
    assert names(fake) == []
    rc, stats, _tasks = play(fake, "down.yml")
    assert (rc, stats["changed"]) == (0, 0)
