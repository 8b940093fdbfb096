"""The gce_instance module, run by ansible against the fake Compute Engine API
(tools/localcluster/compute_api.py, checked against Google's published contract): stop, start,
labels, a delete refused without the job's label, check mode, capacity retries."""

import compute_contract
import gce_module
import pytest
import requests

PROJECT = "hlf-test"
ZONE = "us-central1-a"


@pytest.fixture
def fake(fake_api):
    session = requests.Session()
    session.trust_env = False
    control = fake_api["control"]
    session.post(f"{control}/reset").raise_for_status()
    for name, labels in (("vm0", {"llamafactory-job": "demo"}), ("vm1", {"team": "ml"})):
        body = {"labels": {"llamafactory": "training", **labels}}
        session.put(f"{control}/instances/{PROJECT}/{ZONE}/{name}", json=body).raise_for_status()
    yield fake_api, session
    entries = [e for e in session.get(f"{control}/requests").json() if not e.get("refused")]
    assert compute_contract.validate_log(entries) == []
    session.close()


def instance(fake, name):
    info, session = fake
    listed = session.get(f"{info['control']}/instances").json()
    found = {i["name"]: i for i in listed.values()}
    return found.get(name)


def run(fake, check=False, **args):
    info, _session = fake
    return gce_module.run_module(
        "gce_instance", info, {"project": PROJECT, "zone": ZONE, **args}, check
    )


def test_stop_then_start_are_idempotent(fake):
    result = run(fake, name="vm0", state="stopped")
    assert (result["changed"], result["actions"]) == (True, ["stop"])
    assert (result["status_before"], result["status"]) == ("RUNNING", "TERMINATED")
    assert instance(fake, "vm0")["status"] == "TERMINATED"
    assert run(fake, name="vm0", state="stopped")["changed"] is False
    result = run(fake, name="vm0", state="running")
    assert (result["actions"], result["status"]) == (["start"], "RUNNING")
    assert run(fake, name="vm0", state="running")["changed"] is False


def test_check_mode_changes_nothing(fake):
    result = run(fake, check=True, name="vm0", state="stopped", labels={"llamafactory-job": "x"})
    assert result["changed"] and result["actions"] == ["setLabels", "stop"]
    assert instance(fake, "vm0")["status"] == "RUNNING"
    assert instance(fake, "vm0")["labels"]["llamafactory-job"] == "demo"


def test_labels_are_merged(fake):
    result = run(fake, name="vm1", labels={"llamafactory-job": "demo"})
    assert result["actions"] == ["setLabels"]
    assert instance(fake, "vm1")["labels"] == {
        "llamafactory": "training",
        "team": "ml",
        "llamafactory-job": "demo",
    }
    assert run(fake, name="vm1", labels={"llamafactory-job": "demo"})["changed"] is False


def test_delete_only_the_jobs_own(fake):
    result = run(fake, name="vm1", state="absent", require_labels={"llamafactory-job": "demo"})
    assert result.get("failed")
    assert "not deleted: it lacks the labels that make it this job's own" in result["msg"]
    assert "llamafactory-job=demo (has none)" in result["msg"]
    assert instance(fake, "vm1") is not None
    result = run(fake, name="vm0", state="absent", require_labels={"llamafactory-job": "demo"})
    assert (result["actions"], result["status"]) == (["delete"], "absent")
    assert instance(fake, "vm0") is None
    assert run(fake, name="vm0", state="absent")["changed"] is False


def test_a_start_refused_for_capacity_is_retried_then_named(fake):
    info, session = fake
    run(fake, name="vm0", state="stopped")
    session.post(f"{info['control']}/config", json={"start_capacity_errors": 1})
    result = run(fake, name="vm0", state="running", capacity_backoff=0.1)
    assert result["capacity_retries"] == 1 and result["status"] == "RUNNING"
    run(fake, name="vm0", state="stopped")
    session.post(f"{info['control']}/config", json={"start_capacity_errors": 5})
    result = run(fake, name="vm0", state="running", capacity_backoff=0.1, capacity_retries=2)
    assert result.get("failed")
    assert "start refused for capacity 3 times" in result["msg"]
    assert "does not have enough resources" in result["msg"]
    assert instance(fake, "vm0")["status"] == "TERMINATED"
    session.post(f"{info['control']}/config", json={"start_capacity_errors": 0})


def test_an_unknown_instance_is_named(fake):
    result = run(fake, name="nope", state="stopped")
    assert result.get("failed") and "hlf-test/us-central1-a/nope: no such instance" in result["msg"]


def test_a_spot_vm_its_preemption_deleted_reads_absent_with_the_time(fake):
    info, session = fake
    control = info["control"]
    body = {
        "labels": {"llamafactory": "training"},
        "scheduling": {
            "provisioningModel": "SPOT",
            "instanceTerminationAction": "DELETE",
            "preemptible": True,
        },
    }
    session.put(f"{control}/instances/{PROJECT}/{ZONE}/spot", json=body).raise_for_status()
    answer = session.post(
        f"{control}/preempt", json={"project": PROJECT, "zone": ZONE, "name": "spot"}
    )
    assert answer.status_code == 200, answer.text
    assert instance(fake, "spot") is None
    result = run(fake, name="spot", state="present", allow_absent=True)
    assert (result["changed"], result["status"]) == (False, "absent")
    assert result["preempted"].startswith("20")  # the operation's insertTime
    # Without allow_absent the instance is named as missing; vm0 was never preempted.
    assert "no such instance" in run(fake, name="spot", state="present")["msg"]
    run(fake, name="vm0", state="stopped")
    assert run(fake, name="vm0", state="present")["preempted"] is None
