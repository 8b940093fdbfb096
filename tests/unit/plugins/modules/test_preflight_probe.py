"""The module preflight_probe run as Ansible runs it against the dockerd stand-in of conftest.py
(the Engine API's create, start, kill, logs and delete): the probe container started with the
job's settings, then signalled, its report read and the container removed."""

import json
import struct

import ansible_run
import pytest

IMAGE = "registry.example/llamafactory:0.9.5"
NAME = "llamafactory-demo-preflight"
REPORT = {
    "node": "vm1",
    "results": [{"node": "vm0", "address": "10.0.0.2", "port": 49949, "ok": True}],
    "listen_error": "",
}


def run_module(tmp_path, **args):
    return ansible_run.module("preflight_probe", tmp_path, str(tmp_path), **args)


def start_true(tmp_path, socket_path, **extra):
    """A probe started with a command of no interest."""
    return run_module(
        tmp_path,
        name=NAME,
        state="started",
        image=IMAGE,
        command=["true"],
        docker_socket=socket_path,
        **extra,
    )


def log(text):
    return (1, b"2026-12-05T01:00:00.000000000Z " + text.encode() + b"\n")


@pytest.fixture
def started(dockerd, socket_path, tmp_path):
    dockerd.images[IMAGE] = "sha256:" + "1" * 64
    result = run_module(
        tmp_path,
        name=NAME,
        state="started",
        image=IMAGE,
        command=["python3", "/probe.py", "probe", "--ports", 49949],
        network_mode="bridge",
        published_ports=["29500:29500"],
        volumes=["/jobs/demo/preflight_probe.py:/probe.py:ro"],
        device_requests=[{"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}],
        labels={"hostnet.llamafactory.rank": 1},
        docker_socket=socket_path,
    )
    assert result["changed"] and not result.get("failed"), result
    return dockerd


def test_started_with_the_jobs_settings(started):
    inspect = started.containers[NAME]["inspect"]
    assert inspect["State"]["Running"]
    assert inspect["Config"]["Cmd"] == ["python3", "/probe.py", "probe", "--ports", "49949"]
    assert inspect["Config"]["Labels"] == {"hostnet.llamafactory.rank": "1"}
    host = inspect["HostConfig"]
    assert host["NetworkMode"] == "bridge"
    assert host["PortBindings"] == {"29500/tcp": [{"HostPort": "29500"}]}
    assert host["Binds"] == ["/jobs/demo/preflight_probe.py:/probe.py:ro"]
    assert host["DeviceRequests"][0]["Driver"] == "nvidia"
    assert host["DeviceRequests"][0]["Capabilities"] == [["gpu"]]


def test_a_probe_that_sends_its_report_to_rank_0_goes_when_it_ends(dockerd, socket_path, tmp_path):
    dockerd.images["img"] = "sha256:" + "2" * 64
    result = run_module(
        tmp_path,
        name=NAME,
        state="started",
        image="img",
        command=["true"],
        auto_remove=True,
        docker_socket=socket_path,
    )
    assert result["changed"] and not result.get("failed"), result
    assert dockerd.containers[NAME]["inspect"]["HostConfig"]["AutoRemove"] is True


def test_a_second_start_replaces_the_first(started, socket_path, tmp_path):
    first = started.containers[NAME]["inspect"]["Id"]
    again = start_true(tmp_path, socket_path)
    assert again["changed"] and started.containers[NAME]["inspect"]["Id"] != first
    assert next(r[2] for r in started.requests if r[0] == "DELETE") == {"force": "1"}


def test_collected_signals_reads_the_report_and_removes_the_ended_probe(
    started, socket_path, tmp_path
):
    def on_kill(name, signal):
        assert signal == "SIGUSR1"
        container = started.containers[name]
        container["logs"] += [log('{"listening": [49949]}'), log(json.dumps(REPORT))]
        container["inspect"]["State"].update(Status="exited", Running=False, ExitCode=0)

    started.on_kill = on_kill
    result = run_module(tmp_path, name=NAME, state="collected", docker_socket=socket_path)
    assert result["report"] == REPORT and result["error"] == ""
    assert result["listener"] == {
        "state": "running",
        "exit_code": None,
        "log_lines": [],
        "error": "",
    }
    assert result["changed"] and NAME not in started.containers


def test_a_listen_error_in_the_report_is_the_listeners_finding(started, socket_path, tmp_path):
    report = dict(
        REPORT, listen_error="cannot listen on [29500]: [Errno 98] Address already in use"
    )
    started.containers[NAME]["logs"] += [log(json.dumps(report))]
    result = run_module(tmp_path, name=NAME, state="collected", docker_socket=socket_path)
    assert result["listener"]["exit_code"] == 3
    assert "Address already in use" in result["listener"]["log_lines"][0]


def test_a_probe_that_crashed_gives_its_last_lines(started, socket_path, tmp_path):
    container = started.containers[NAME]
    container["logs"] += [(2, b"2026-12-05T01:00:00.000000000Z exec: python3: not found\n")]
    container["inspect"]["State"].update(Status="exited", Running=False, ExitCode=127)
    result = run_module(tmp_path, name=NAME, state="collected", docker_socket=socket_path)
    assert result["report"] is None and "python3: not found" in result["error"]
    assert result["listener"]["exit_code"] == 127
    assert NAME not in started.containers


def test_no_report_within_the_wait_removes_the_probe(started, socket_path, tmp_path):
    result = run_module(tmp_path, name=NAME, state="collected", wait=1, docker_socket=socket_path)
    assert result["report"] is None and result["error"] == "the probe printed no report within 1 s"
    assert result["changed"] and NAME not in started.containers


def test_a_healthy_probe_still_running_after_the_grace_is_removed(started, socket_path, tmp_path):
    """Every target answered, but a peer has not reached it within 2 s (that peer's own report
    names why): removed all the same, nothing is left."""
    started.containers[NAME]["logs"] += [log(json.dumps(REPORT))]
    result = run_module(tmp_path, name=NAME, state="collected", docker_socket=socket_path)
    assert result["report"] == REPORT and result["container"]["state"] == "running"
    assert result["changed"] and NAME not in started.containers


def test_no_probe_when_its_start_failed(dockerd, socket_path, tmp_path):
    result = run_module(tmp_path, name=NAME, state="collected", docker_socket=socket_path)
    assert result["report"] is None and "its start failed" in result["error"]


def test_an_image_the_daemon_lacks_fails_the_start(dockerd, socket_path, tmp_path):
    result = start_true(tmp_path, socket_path)
    assert result["failed"] and "No such image" in result["msg"]


def test_its_files_are_written_before_the_start(dockerd, socket_path, tmp_path):
    dockerd.images[IMAGE] = "sha256:" + "1" * 64
    job = tmp_path / "jobs" / "demo"
    files = [
        {"path": str(job), "state": "directory", "mode": "0750"},
        {"path": str(job / "env"), "content": "NNODES=2\n", "mode": "0600"},
        {"path": str(job / "preflight_probe.py"), "content": "print()\n", "mode": "0644"},
    ]
    result = start_true(tmp_path, socket_path, files=files)
    assert result["changed"] and not result.get("failed"), result
    assert result["changes"] == {
        str(job): ["create"],
        str(job / "env"): ["content"],
        str(job / "preflight_probe.py"): ["content"],
    }
    assert (job / "env").read_text() == "NNODES=2\n"
    assert "NNODES=2" not in json.dumps(result)  # the content is not echoed back (no_log)
    assert (job / "env").stat().st_mode & 0o777 == 0o600
    assert dockerd.containers[NAME]["inspect"]["State"]["Running"]
    again = start_true(tmp_path, socket_path, files=files)
    assert again["changes"] == {}  # written once; the probe is started again


def test_a_file_wrong_as_given_writes_and_starts_nothing(dockerd, socket_path, tmp_path):
    dockerd.images[IMAGE] = "sha256:" + "1" * 64
    job = tmp_path / "jobs" / "demo"
    files = [
        {"path": str(job), "state": "directory", "mode": "0750"},
        {"path": str(job / "agent.json"), "content": "{rank: 0", "mode": "0640", "json": True},
    ]
    result = start_true(tmp_path, socket_path, files=files)
    assert result["failed"] and "agent.json: not valid JSON" in result["msg"]
    assert NAME in result["msg"] and not job.exists() and NAME not in dockerd.containers


def test_rank_0s_read_returns_the_reports_its_probe_gathered(started, socket_path, tmp_path):
    """Rank 0's report holds the others' (its "gathered"): each comes back as that node's own
    read would, and rank 0's report without them."""
    theirs = dict(REPORT, node="vm2")
    broken = dict(REPORT, node="vm3", listen_error="cannot listen on [49949]: in use")
    own = dict(REPORT, node="vm0", gathered={"vm2": theirs, "vm3": broken, "vm4": "garbage"})
    started.containers[NAME]["logs"] += [log(json.dumps(own))]
    started.containers[NAME]["inspect"]["State"].update(Status="exited", Running=False)
    result = run_module(tmp_path, name=NAME, state="collected", docker_socket=socket_path)
    assert result["report"] == REPORT | {"node": "vm0"} and "gathered" not in result["report"]
    assert sorted(result["gathered"]) == ["vm2", "vm3"]
    assert result["gathered"]["vm2"]["report"] == theirs
    assert result["gathered"]["vm2"]["listener"]["state"] == "running"
    assert result["gathered"]["vm3"]["listener"]["exit_code"] == 3
    assert result["gathered"]["vm2"]["error"] == ""


def test_a_read_without_gathering_returns_none(started, socket_path, tmp_path):
    started.containers[NAME]["logs"] += [log(json.dumps(REPORT))]
    result = run_module(tmp_path, name=NAME, state="collected", docker_socket=socket_path)
    assert result["gathered"] == {}


def test_the_start_looks_on_the_host_for_what_the_container_does_not_show(
    dockerd, socket_path, tmp_path
):
    """host_paths and rxdm in the start's own call: the missing entries as given (a dangling
    link is there, as lstat finds it), the receive-datapath-manager's state and last lines."""
    dockerd.images[IMAGE] = "sha256:" + "1" * 64
    present, link = tmp_path / "mnt-data", tmp_path / "plugin-link"
    present.mkdir()
    link.symlink_to(tmp_path / "nowhere")
    dockerd.add_container(
        "receive-datapath-manager",
        {"Id": "rxdm", "State": {"Running": True, "Status": "running"}, "Config": {}},
        logs=b"".join(
            struct.pack(">BxxxL", 1, len(line)) + line
            for line in (b"2026-12-05T01:00:00Z line %d\n" % i for i in range(8))
        ),
    )
    host_paths = [
        {"path": str(present)},
        {"path": str(tmp_path / "mnt-gone")},
        {"path": str(link), "kind": "env_script"},
        {"path": str(tmp_path / "dev-gone"), "kind": "device"},
    ]
    result = start_true(
        tmp_path, socket_path, host_paths=host_paths, rxdm="receive-datapath-manager"
    )
    assert not result.get("failed"), result
    checks = result["host_checks"]
    assert checks["missing_paths"] == [
        {"path": str(tmp_path / "mnt-gone")},
        {"path": str(tmp_path / "dev-gone"), "kind": "device"},
    ]
    assert checks["rxdm"]["container"]["state"] == "running"
    assert checks["rxdm"]["log_lines"] == [f"line {i}" for i in range(3, 8)]
    assert dockerd.containers[NAME]["inspect"]["State"]["Running"]
    # Not asked: no container looked at; one that is not there is "missing".
    assert start_true(tmp_path, socket_path)["host_checks"] == {"missing_paths": [], "rxdm": None}
    gone = start_true(tmp_path, socket_path, rxdm="no-such-rxdm")["host_checks"]["rxdm"]
    assert gone == {"container": {"state": "missing"}, "log_lines": []}


def test_a_failed_start_returns_its_host_checks(dockerd, socket_path, tmp_path):
    result = start_true(tmp_path, socket_path, host_paths=[{"path": str(tmp_path / "gone")}])
    assert result["failed"] and "No such image" in result["msg"]
    assert result["host_checks"]["missing_paths"] == [{"path": str(tmp_path / "gone")}]
