"""node_facts run as Ansible runs it on a node (this machine, a dockerd stand-in as its daemon):
the facts it sets, named and each with what was read, and a daemon that does not answer."""

import json
from pathlib import Path

import ansible_run
import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "job"


@pytest.fixture
def node(tmp_path, dockerd):
    inspect = json.loads((FIXTURES / "inspect-exited-0.json").read_text())
    inspect["Config"]["Labels"] = {"hostnet.llamafactory.digest": "wanted"}
    dockerd.add_container("llamafactory-demo", inspect)
    (tmp_path / "daemon.json").write_text('{"log-driver": "json-file"}\n')
    (tmp_path / "output").mkdir()
    return dockerd


def run_module(tmp_path, **args):
    return ansible_run.module("node_facts", tmp_path, "/usr/sbin:/usr/bin:/bin", **args)


@pytest.mark.skipif(not Path("/usr/bin/dpkg-query").exists(), reason="needs a Debian host")
def test_the_docker_host_and_the_job_are_facts_that_say_what_was_read(tmp_path, socket_path, node):
    result = run_module(
        tmp_path,
        docker_host={
            "packages": ["dpkg", "hostnet-no-such-package"],
            "daemon_json": str(tmp_path / "daemon.json"),
            "service": None,
        },
        job={
            "name": "llamafactory-demo",
            "output_dir": str(tmp_path / "output"),
            "tail": 5,
            "docker_socket": socket_path,
        },
    )
    assert not result.get("failed"), result
    facts = result["ansible_facts"]
    assert sorted(facts) == ["docker_host", "job_state"]  # no nic asked: no primary_nic
    host = facts["docker_host"]
    assert list(host["packages"]) == ["dpkg"] and host["missing"] == ["hostnet-no-such-package"]
    assert host["daemon_json"] == '{"log-driver": "json-file"}\n'
    # What was read, the module's defaults included: docker_engine compares it with its own read.
    assert host["read"]["packages"] == ["dpkg", "hostnet-no-such-package"]
    assert host["read"]["dockerd"] is True and host["read"]["pending_marker"].startswith("/etc/")
    job = facts["job_state"]
    assert job["container"]["state"] == "exited" and job["container"]["exit_code"] == 0
    assert job["container"]["labels"] == {"hostnet.llamafactory.digest": "wanted"}
    assert job["read"]["name"] == "llamafactory-demo" and job["read"]["tail"] == 5
    assert "labels_match" not in job  # launch compares the labels with its own digest
    assert job["docker_since"] is None  # no unit read: never taken for launch's look
    assert len(node.requests) == 2  # inspect and logs: one call, read once


def test_no_daemon_is_a_null_job_state_not_a_failure(tmp_path):
    result = run_module(
        tmp_path,
        job={"name": "x", "docker_socket": str(tmp_path / "docker.sock")},
        docker_host={"daemon_json": str(tmp_path / "absent.json"), "service": None},
    )
    assert not result.get("failed"), result
    assert result["ansible_facts"]["job_state"] is None
    assert result["job_error"].startswith("cannot query container x")
    assert "primary_nic" not in result["ansible_facts"]


def test_the_image_is_read_with_the_job_when_asked(tmp_path, socket_path, node):
    node.images["registry.example/llamafactory:1"] = "sha256:abc"
    job = {"name": "llamafactory-demo", "docker_socket": socket_path, "tail": 1}
    present = run_module(tmp_path, job={**job, "image": "registry.example/llamafactory:1"})
    assert present["ansible_facts"]["job_state"]["image_id"] == "sha256:abc"
    absent = run_module(tmp_path, job={**job, "image": "registry.example/llamafactory:2"})
    assert absent["ansible_facts"]["job_state"]["image_id"] is None  # the launch pulls it
    unasked = run_module(tmp_path, job=job)
    assert "image_id" not in unasked["ansible_facts"]["job_state"]
