"""When a node_survey answers a later read (docker_host_facts, job_status) and how the answer is
narrowed to that read's question; the run mark that keeps another run's survey out."""

import os

import pytest
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _survey as survey

RUN = "4242:99"
HOST_QUESTION = dict(
    packages=["ca-certificates", "gnupg", "python3-requests", "docker.io", "docker-ce"],
    service="docker",
    daemon_json="/etc/docker/daemon.json",
    pending_marker="/etc/docker/.pending",
    dockerd=True,
)
HOST_ANSWER = dict(
    changed=False,
    packages={"ca-certificates": "ii 1", "gnupg": "ii 2", "docker.io": "ii 26.1.5+dfsg1-9"},
    missing=["python3-requests", "docker-ce"],
    service={"enabled": True, "active": True},
    daemon_json="{}\n",
    pending=False,
    dockerd_version="26.1.5",
)
JOB_QUESTION = dict(
    name="llamafactory-demo",
    output_dir="/srv/jobs/demo/output",
    agent_state=None,
    tail=5,
    docker_socket="/var/run/docker.sock",
    docker_timeout=60,
)
JOB_ANSWER = dict(
    changed=False,
    container={"state": "exited", "exit_code": 0, "labels": {"hostnet.llamafactory.digest": "d1"}},
    log_lines=["a", "b", "c", "d", "e"],
    labels_match=None,
    checkpoints=[20, 40],
)


def surveyed(run=RUN):
    return {
        "run": run,
        "docker_host": {"question": HOST_QUESTION, "answer": HOST_ANSWER},
        "job": {"question": JOB_QUESTION, "answer": JOB_ANSWER},
    }


def host_args(**changes):
    args = dict(
        packages=["ca-certificates", "gnupg", "python3-requests", "docker.io"],
        service="docker",
        daemon_json="/etc/docker/daemon.json",
        pending_marker="/etc/docker/.pending",
        dockerd=True,
    )
    args.update(changes)
    return args


def test_the_docker_host_answer_is_narrowed_to_the_packages_asked():
    answer = survey.docker_host_answer(surveyed(), host_args(), RUN)
    assert answer["packages"] == {
        k: HOST_ANSWER["packages"][k] for k in ("ca-certificates", "gnupg", "docker.io")
    }
    assert answer["missing"] == ["python3-requests"]  # docker-ce was not asked
    assert answer["dockerd_version"] == "26.1.5" and answer["daemon_json"] == "{}\n"
    assert survey.docker_host_answer(surveyed(), host_args(packages=[]), RUN)["missing"] == []
    without = survey.docker_host_answer(surveyed(), host_args(dockerd=False), RUN)
    assert without["dockerd_version"] is None


@pytest.mark.parametrize(
    "changes",
    [
        {"packages": ["docker.io", "containerd.io"]},  # a package the survey did not look up
        {"service": "containerd"},
        {"daemon_json": "/etc/docker/other.json"},
        {"pending_marker": None},
    ],
)
def test_a_docker_host_read_the_survey_did_not_ask_goes_to_the_node(changes):
    assert survey.docker_host_answer(surveyed(), host_args(**changes), RUN) is None


def test_dockerd_asked_but_not_surveyed_goes_to_the_node():
    survey_without = surveyed()
    survey_without["docker_host"] = {
        "question": dict(HOST_QUESTION, dockerd=False),
        "answer": HOST_ANSWER,
    }
    assert survey.docker_host_answer(survey_without, host_args(), RUN) is None


def test_another_runs_survey_or_none_is_never_an_answer():
    for given in (surveyed("1:1"), None, {}, {"run": RUN}, "text"):
        assert survey.docker_host_answer(given, host_args(), RUN) is None
        assert survey.job_answer(given, {"name": "llamafactory-demo", "tail": 5}, RUN) is None


def job_args(**changes):
    args = dict(
        name="llamafactory-demo",
        output_dir="/srv/jobs/demo/output",
        tail=5,
        labels={"hostnet.llamafactory.digest": "d1"},
    )
    args.update(changes)
    return args


def test_the_job_answer_matches_the_labels_here_and_keeps_the_tail_asked():
    answer = survey.job_answer(surveyed(), job_args(), RUN)
    assert answer["labels_match"] is True and answer["checkpoints"] == [20, 40]
    assert (
        survey.job_answer(surveyed(), job_args(labels={"hostnet.llamafactory.digest": "d2"}), RUN)[
            "labels_match"
        ]
        is False
    )
    assert survey.job_answer(surveyed(), job_args(tail=2), RUN)["log_lines"] == ["d", "e"]
    assert survey.job_answer(surveyed(), job_args(tail="0"), RUN)["log_lines"] == []


@pytest.mark.parametrize(
    "changes",
    [
        {"stop": True},  # a stop is never answered from a survey
        {"tail": 40},  # more lines than the survey read
        {"name": "llamafactory-other"},
        {"output_dir": "/srv/jobs/other/output"},
        {"agent_state": "/srv/jobs/demo/agent-state.json"},
        {"docker_socket": "/run/user/docker.sock"},
    ],
)
def test_a_job_read_the_survey_did_not_ask_goes_to_the_node(changes):
    assert survey.job_answer(surveyed(), job_args(**changes), RUN) is None


def test_the_run_is_the_parent_process_and_its_start(tmp_path):
    (tmp_path / "77").mkdir()
    fields = [f"f{n}" for n in range(3, 45)]  # after "(comm)": field 3 (state) onwards
    (tmp_path / "77" / "stat").write_text("77 (ansible-play) ) x) " + " ".join(fields) + "\n")
    assert survey.run_identity(77, proc=str(tmp_path)) == "77:f22"  # starttime, field 22
    assert survey.run_identity(78, proc=str(tmp_path)) == "78:"  # no /proc entry: the PID alone
    assert survey.run_identity() == survey.run_identity(os.getppid())
