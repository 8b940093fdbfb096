"""node_survey end to end on this machine (a local connection plays the node, a dockerd stand-in
its daemon): its answers serve docker_host_facts and job_status in the same playbook run without
a module call, and never in another run (a fact cache's survey), nor for another question."""

import itertools
import json
import sys
from pathlib import Path

import ansible_run
import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "job"
RUNS = itertools.count()


def play(tmp_path, tasks, extravars=None):
    playbook = tmp_path / "survey.yml"
    playbook.write_text(f"- hosts: node\n  gather_facts: false\n  tasks:\n{tasks}")
    inventory = f"node ansible_connection=local ansible_python_interpreter={sys.executable}\n"
    folder = tmp_path / f"runner-{next(RUNS)}"
    run = ansible_run.run(folder, inventory, playbook=playbook, hosts="node", extravars=extravars)
    assert run.rc == 0, run.messages()
    return json.loads((tmp_path / "got.json").read_text())


SAVE = """
    - ansible.builtin.copy:
        content: >-
          {{{{ {{'survey': node_survey | default(none), 'host': host, 'job': job}} | to_json }}}}
        dest: {tmp_path}/got.json
        mode: "0644"
"""


def reads(tmp_path, socket_path, survey_expr, tail=5):
    return f"""
    - hostnet.llamafactory.docker_host_facts:
        packages: [dpkg]
        daemon_json: {tmp_path}/daemon.json
        survey: "{survey_expr}"
      register: host
    - hostnet.llamafactory.job_status:
        name: llamafactory-demo
        output_dir: {tmp_path}/output
        tail: {tail}
        labels: {{hostnet.llamafactory.digest: wanted}}
        docker_socket: {socket_path}
        survey: "{survey_expr}"
      register: job
""" + SAVE.format(tmp_path=tmp_path)


@pytest.fixture
def node(tmp_path, dockerd):
    inspect = json.loads((FIXTURES / "inspect-exited-0.json").read_text())
    inspect["Config"]["Labels"] = {"hostnet.llamafactory.digest": "wanted"}
    dockerd.add_container("llamafactory-demo", inspect)
    (tmp_path / "daemon.json").write_text('{"log-driver": "json-file"}\n')
    (tmp_path / "output").mkdir()
    return dockerd


def survey_task(tmp_path, socket_path):
    return f"""
    - hostnet.llamafactory.node_survey:
        docker_host:
          packages: [dpkg, hostnet-no-such-package]
          daemon_json: {tmp_path}/daemon.json
        job:
          name: llamafactory-demo
          output_dir: {tmp_path}/output
          tail: 5
          docker_socket: {socket_path}
"""


@pytest.mark.skipif(not Path("/usr/bin/dpkg-query").exists(), reason="needs a Debian host")
def test_the_survey_answers_the_same_reads_of_the_same_run(tmp_path, socket_path, node):
    got = play(
        tmp_path,
        survey_task(tmp_path, socket_path)
        + reads(tmp_path, socket_path, "{{ node_survey | default(omit) }}"),
    )
    asked = len(node.requests)
    assert got["host"]["surveyed"] is True and got["job"]["surveyed"] is True
    assert asked == 2  # the survey's inspect and logs; the later reads made none
    assert list(got["host"]["packages"]) == ["dpkg"] and got["host"]["missing"] == []
    assert got["host"]["daemon_json"] == '{"log-driver": "json-file"}\n'
    assert got["job"]["container"]["state"] == "exited" and got["job"]["labels_match"] is True
    # The same reads against a survey of another run (a fact cache's): the node answers.
    again = play(tmp_path, reads(tmp_path, socket_path, "{{ stale }}"), {"stale": got["survey"]})
    assert again["host"]["surveyed"] is False and again["job"]["surveyed"] is False
    assert again["host"]["packages"] == got["host"]["packages"]
    assert again["job"]["container"] == got["job"]["container"]
    assert len(node.requests) == asked + 2


def test_a_read_the_survey_did_not_ask_goes_to_the_node(tmp_path, socket_path, node):
    got = play(
        tmp_path,
        survey_task(tmp_path, socket_path)
        + reads(tmp_path, socket_path, "{{ node_survey | default(omit) }}", tail=40),
    )
    assert got["job"]["surveyed"] is False and got["job"]["labels_match"] is True
    assert len(node.requests) == 4  # the survey's inspect and logs, then job_status's own


def test_no_daemon_is_no_job_in_the_survey(tmp_path):
    result = ansible_run.module(
        "node_survey",
        tmp_path,
        "/usr/sbin:/usr/bin:/bin",
        job={"name": "x", "docker_socket": str(tmp_path / "docker.sock")},
        docker_host={"daemon_json": str(tmp_path / "absent.json")},
    )
    assert not result.get("failed"), result
    assert result["job"] is None and result["job_error"].startswith("cannot query container x")
    assert list(result["ansible_facts"]["node_survey"]) == ["docker_host"]
    assert result["nic"] is None and "primary_nic" not in result["ansible_facts"]
