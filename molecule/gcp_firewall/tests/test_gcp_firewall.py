"""The gcp_firewall role against the fake Compute Engine API (tools/localcluster/compute_api.py).

Molecule's check, converge and idempotence steps ran first; these tests then run converge.yml
again with other settings and fake behaviours, and assert on the requests the fake received.
Every run goes through the fake's loopback proxy; nothing else is contacted.
"""

import copy
import hashlib
import http.client
import importlib.util
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

SCENARIO = Path(__file__).resolve().parents[1]
STATE = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "fake-compute"
CLIENT = json.loads((STATE / "client.json").read_text())
PROJECT = CLIENT["project"]
NODES, SSH = "llamafactory-nodes", "llamafactory-ssh"
WRITES = ("POST", "PATCH", "DELETE")

CONTRACT = SCENARIO.parents[1] / "tests" / "compute_contract.py"
SPEC = importlib.util.spec_from_file_location("compute_contract", CONTRACT)
compute_contract = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(compute_contract)


def control(method, path, body=None):
    """A call to the fake's control API, straight to its loopback port (no proxy)."""
    url = urlsplit(CLIENT["control"])
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        data = None if body is None else json.dumps(body)
        connection.request(method, f"{url.path}/{path}", body=data)
        answer = connection.getresponse()
        assert answer.status == 200, answer.read()
        return json.loads(answer.read() or b"null")
    finally:
        connection.close()


def log():
    return control("GET", "requests")


def writes():
    return [
        (r["method"], r["path"].rsplit("/", 1)[-1], r["status"])
        for r in log()
        if r["method"] in WRITES
    ]


def rules():
    return {key.split("/", 1)[1]: rule for key, rule in control("GET", "firewalls").items()}


def put(rule):
    control("PUT", f"firewalls/{PROJECT}/{rule['name']}", rule)


def play(check=False, verbose=False, **extra):
    """Run converge.yml; returns (rc, output). The access token must never show in the output."""
    command = [
        "ansible-playbook",
        "-i",
        os.environ["MOLECULE_INVENTORY_FILE"],
        str(SCENARIO / "converge.yml"),
    ]
    if check:
        command.append("--check")
    if verbose:
        command.append("-vvv")  # shows every module's arguments
    if extra:
        command += ["-e", json.dumps(extra)]
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=180, env=env, check=False
    )
    output = done.stdout + done.stderr
    assert CLIENT["token"] not in output
    return done.returncode, " ".join(output.split())  # the callback folds long lines


def recap_changed(output):
    return sum(int(n) for n in re.findall(r"changed=(\d+)", output))


def leftovers():
    """What the role or a stopped module could leave in the temporary directory."""
    patterns = ("gcp_firewall.*", "gcp_firewall_module.*", "ansible_google.cloud.*_payload_*")
    return sorted(str(p) for pattern in patterns for p in Path(tempfile.gettempdir()).glob(pattern))


def only_api_hosts():
    entries = log()
    assert not [r for r in entries if r.get("refused")], "something tried to reach another host"
    assert {r["host"] for r in entries} <= {"compute.googleapis.com", "www.googleapis.com"}
    assert all(r["token_ok"] for r in entries)


@pytest.fixture(scope="module", autouse=True)
def contract_kept():
    """After the module: every exchange with the fake since it started (molecule's check,
    converge and idempotence included) kept Google's published contract (compute.v1.json)."""
    yield
    problems = compute_contract.validate_log(control("GET", "history"))
    assert problems == [], "\n".join(problems)


@pytest.fixture(scope="module")
def made():
    """The rules as molecule's converge made them; checks that converge, before any test."""
    return copy.deepcopy(rules())


@pytest.fixture
def fresh(made):
    """The fake holding exactly the role's rules, operations immediate, an empty log."""
    control("POST", "reset")
    for rule in made.values():
        put(rule)
    before = leftovers()
    yield made
    only_api_hosts()
    assert leftovers() == before


def test_molecule_steps_created_the_rules_once(made):
    # check, converge, idempotence: one list each; only converge wrote.
    entries = log()
    lists = [r for r in entries if r["method"] == "GET" and r["path"].endswith("/global/firewalls")]
    assert len(lists) == 3
    # The role's own rules by name pattern (the nodes rule and one per extra GPU network).
    assert lists[0]["query"]["filter"] == [f'name eq "(?:{SSH}|{NODES}[-a-z0-9]*)"']
    assert writes() == [("POST", "firewalls", 200), ("POST", "firewalls", 200)]
    assert [r["body"]["name"] for r in entries if r["method"] == "POST"] == [NODES, SSH]
    assert set(made) == {NODES, SSH}
    nodes = made[NODES]
    assert nodes["direction"] == "INGRESS"
    assert nodes["priority"] == 1000
    assert nodes["network"].endswith(f"/projects/{PROJECT}/global/networks/default")
    assert nodes["sourceRanges"] == ["10.128.0.5/32", "10.128.0.6/32"]
    assert nodes["allowed"] == [
        {"IPProtocol": "tcp", "ports": ["0-65535"]},
        {"IPProtocol": "udp", "ports": ["0-65535"]},
        {"IPProtocol": "icmp"},
    ]
    assert "targetTags" not in nodes
    assert nodes["description"].startswith("hostnet.llamafactory cluster llamafactory:")
    assert made[SSH]["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert made[SSH]["sourceRanges"] == ["203.0.113.0/24"]
    only_api_hosts()


def test_rerun_changes_nothing(fresh):
    rc, output = play()
    assert rc == 0, output
    assert recap_changed(output) == 0
    assert [(r["method"], r["path"].rsplit("/", 1)[-1]) for r in log()] == [("GET", "firewalls")]
    assert rules() == fresh


def test_the_access_token_is_never_shown(fresh):
    fresh_rule = copy.deepcopy(fresh[NODES])
    put(dict(fresh_rule, priority=5))
    rc, output = play(verbose=True)  # play() fails if the token shows
    assert rc == 0, output
    assert "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER" in output
    assert writes() == [("PATCH", NODES, 200)]


def test_drift_is_corrected_with_one_patch(fresh):
    drifted = copy.deepcopy(fresh[NODES])
    drifted["sourceRanges"] = ["10.128.0.5/32", "10.128.0.99/32"]
    drifted["priority"] = 900
    put(drifted)
    rc, output = play()
    assert rc == 0, output
    assert recap_changed(output) == 1
    assert writes() == [("PATCH", NODES, 200)]
    assert rules() == fresh


def test_added_source_is_removed_without_a_gap(fresh):
    # gcp_compute_firewall alone sees nothing wrong here: every wanted range is still present.
    widened = copy.deepcopy(fresh[NODES])
    widened["sourceRanges"] = [*widened["sourceRanges"], "0.0.0.0/0"]
    widened["allowed"] = [*widened["allowed"], {"IPProtocol": "esp"}]
    put(widened)
    rc, output = play()
    assert rc == 0, output
    assert writes() == [("PATCH", NODES, 200), ("PATCH", NODES, 200)]  # never deleted
    assert rules() == fresh


def test_scope_the_role_does_not_set_is_replaced(fresh):
    tagged = copy.deepcopy(fresh[NODES])
    tagged["sourceTags"] = ["web"]
    put(tagged)
    rc, output = play()
    assert rc == 0, output
    assert writes() == [("DELETE", NODES, 200), ("POST", "firewalls", 200)]
    assert "sourceTags" not in rules()[NODES]
    assert rules()[NODES]["sourceRanges"] == fresh[NODES]["sourceRanges"]


def test_check_mode_reports_drift_and_writes_nothing(fresh):
    drifted = copy.deepcopy(fresh[NODES])
    drifted["sourceRanges"] = ["10.128.0.5/32"]
    put(drifted)
    control("DELETE", "requests")
    rc, output = play(check=True)
    assert rc == 0, output
    assert "llamafactory-nodes: update (sourceRanges: add 10.128.0.6/32)" in output
    assert "llamafactory-ssh: no change" in output
    assert recap_changed(output) == 1
    assert writes() == []
    assert [r["method"] for r in log()] == ["GET"]
    assert rules()[NODES] == drifted


def test_slow_operation_is_waited_for(fresh):
    control("POST", "reset")
    control("POST", "config", {"operation_seconds": 3})
    started = time.monotonic()
    rc, output = play(gcp_firewall_ssh_source_ranges=[])
    assert rc == 0, output
    assert time.monotonic() - started >= 3
    polls = [r["operation"] for r in log() if "/global/operations/" in r["path"]]
    assert polls.count("RUNNING") >= 2
    assert polls[-1] == "DONE"
    assert rules()[NODES]["sourceRanges"] == fresh[NODES]["sourceRanges"]


def test_operation_that_never_finishes_hits_the_deadline(fresh):
    control("POST", "reset")
    control("POST", "config", {"operation_seconds": None})
    started = time.monotonic()
    rc, output = play(gcp_firewall_ssh_source_ranges=[], gcp_firewall_operation_timeout=4)
    took = time.monotonic() - started
    assert rc != 0
    assert (
        "Compute Engine did not finish writing the firewall rule llamafactory-nodes within "
        "gcp_firewall_operation_timeout (4 s), and the module was stopped"
    ) in output
    assert took < 30
    polls = len([r for r in log() if "/global/operations/" in r["path"]])
    assert polls >= 2
    time.sleep(2.5)  # a module left running would poll again by now
    assert len([r for r in log() if "/global/operations/" in r["path"]]) == polls
    assert rules() == {}


def test_absent_deletes_only_its_rules(fresh):
    other = copy.deepcopy(fresh[NODES])
    other.update(name="default-allow-internal", description="made by hand")
    put(other)
    rc, output = play(gcp_firewall_state="absent")
    assert rc == 0, output
    assert sorted(writes()) == [("DELETE", NODES, 200), ("DELETE", SSH, 200)]
    assert set(rules()) == {"default-allow-internal"}

    control("DELETE", "requests")
    rc, output = play(gcp_firewall_state="absent")
    assert rc == 0, output
    assert recap_changed(output) == 0
    assert writes() == []
    assert set(rules()) == {"default-allow-internal"}


def test_rule_of_its_name_made_by_someone_else_is_left_alone(fresh):
    control("POST", "reset")
    other = copy.deepcopy(fresh[NODES])
    other["description"] = "made by hand"
    put(other)
    rc, output = play(gcp_firewall_state="absent")
    assert rc == 0, output
    assert "llamafactory-nodes: left alone (not made by this role" in output
    rc, output = play()
    assert rc != 0
    assert "lacks the mark of cluster llamafactory" in output
    assert writes() == []
    assert rules() == {NODES: other}


def test_permission_denied_names_the_permission(fresh):
    control("POST", "reset")
    control("POST", "config", {"deny": ["compute.firewalls.create"]})
    rc, output = play(gcp_firewall_ssh_source_ranges=[])
    assert rc != 0
    assert (
        "Permission denied: the credentials (llamafactory_gcp_auth_kind=accesstoken) lack "
        "compute.firewalls.create" in output
    )
    assert "roles/compute.securityAdmin" in output
    assert writes() == [("POST", "firewalls", 403)]
    assert rules() == {}


def test_permission_denied_on_read(fresh):
    control("POST", "config", {"deny": ["compute.firewalls.list"]})
    rc, output = play()
    assert rc != 0
    assert "lack compute.firewalls.list in project hlf-test" in output
    assert [(r["method"], r["status"]) for r in log()] == [("GET", 403)]


def test_rejected_token(fresh):
    rc, output = play(llamafactory_gcp_access_token=CLIENT["token"][::-1])
    assert rc != 0
    assert (
        "rejected the credentials (llamafactory_gcp_auth_kind=accesstoken) and they cannot be"
        in output
    )
    assert [(r["method"], r["status"]) for r in control("GET", "requests")] == [("GET", 401)]
    control("DELETE", "requests")  # the teardown's check is for the real token


def test_missing_network(fresh):
    control("POST", "reset")
    rc, output = play(gcp_firewall_network="no-such-net", gcp_firewall_ssh_source_ranges=[])
    assert rc != 0
    assert (
        "The VPC network no-such-net (gcp_firewall_network=no-such-net) was not found in "
        "project hlf-test" in output
    )
    assert writes() == [("POST", "firewalls", 404)]


def test_missing_project(fresh):
    rc, output = play(llamafactory_gcp_project="hlf-missing")
    assert rc != 0
    assert "Project hlf-missing was not found" in output
    assert [(r["method"], r["path"], r["status"]) for r in log()] == [
        ("GET", "/compute/v1/projects/hlf-missing/global/firewalls", 404)
    ]


# 29500 + sha1("demo")[:6] % 500, as the job's name gives it (not a security use of sha1).
DEMO_PORT = 29500 + int(hashlib.sha1(b"demo", usedforsecurity=False).hexdigest()[:6], 16) % 500


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"gcp_firewall_ssh_source_ranges": ["0.0.0.0/0"]}, "contains 0.0.0.0/0: refused"),
        ({"gcp_firewall_ssh_source_ranges": ["10.0.0.0/8", "::/0"]}, "contains ::/0: refused"),
        ({"gcp_firewall_ssh_source_ranges": ["192.0.2.1/0"]}, "contains 192.0.2.1/0: refused"),
        (
            # The job's own port, derived from its name (29500 + sha1("demo")[:6] % 500): the
            # firewall once planned with llamafactory_master_port or 29500.
            {
                "llamafactory_job": "demo",
                "gcp_firewall_source": "ranges",
                "gcp_firewall_ranges": ["0.0.0.0/0"],
            },
            f"publish every port of the nodes, MASTER_PORT {DEMO_PORT} included",
        ),
        (
            {"gcp_firewall_source": "ranges", "gcp_firewall_ranges": ["34.64.0.0/10"]},
            "is not a private IPv4 range",
        ),
        ({"llamafactory_master_port": 22}, "llamafactory_master_port is 22: it must be from 1024"),
    ],
)
def test_unsafe_source_is_refused_before_any_call(fresh, settings, message):
    rc, output = play(**settings)
    assert rc != 0
    assert message in output
    assert log() == []


def test_network_tag_source(fresh):
    control("POST", "reset")
    rc, output = play(gcp_firewall_source="tag", gcp_firewall_ssh_source_ranges=[])
    assert rc == 0, output
    nodes = rules()[NODES]
    assert nodes["sourceTags"] == nodes["targetTags"] == ["llamafactory"]
    assert "sourceRanges" not in nodes


def test_skipped_off_gcp(fresh):
    rc, output = play(llamafactory_platform="local")
    assert rc == 0, output
    assert "gcp_firewall: skipped, llamafactory_platform is local, not gcp" in output
    assert log() == []
