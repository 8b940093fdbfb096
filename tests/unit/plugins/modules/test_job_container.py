"""The module job_container run as Ansible runs it against the dockerd stand-in of conftest.py
(the Engine API's create, start and delete): a rank's container replaced and started with the
launch's settings, its env file read on the node, and the faults named."""

import ansible_run

IMAGE = "registry.example/llamafactory:0.9.5"
NAME = "llamafactory-demo"


def run_module(tmp_path, **args):
    return ansible_run.module("job_container", tmp_path, str(tmp_path), **args)


def rank(tmp_path, socket_path, **extra):
    (tmp_path / "env").write_text(
        "\ufeff# the rank's env\nNCCL_SOCKET_IFNAME=ens4\n\n  HF_HUB_OFFLINE=1\nQUOTED='a b'\n"
    )
    args = dict(
        name=NAME,
        image=IMAGE,
        command=[
            "python3",
            "/jobs/demo/rank_agent.py",
            "/jobs/demo/agent.json",
            "--",
            "llamafactory-cli",
        ],
        working_dir="/jobs/demo",
        ipc_mode="host",
        env_file=str(tmp_path / "env"),
        volumes=["/jobs/demo:/jobs/demo"],
        ulimits=["memlock:-1:-1", "nofile:1048576:1048576"],
        device_requests=[{"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}],
        devices=["/dev/infiniband", "/dev/aperture_devices:/dev/aperture_devices:rw"],
        labels={"hostnet.llamafactory.rank": 1},
        docker_socket=socket_path,
    )
    args.update(extra)
    return run_module(tmp_path, **args)


def test_a_rank_replaces_the_container_of_its_name_and_runs(dockerd, socket_path, tmp_path):
    dockerd.images[IMAGE] = "sha256:" + "1" * 64
    dockerd.add_container(NAME, {"Id": "old", "State": {"Running": True}, "Config": {}})
    result = rank(tmp_path, socket_path)
    assert result["changed"] and not result.get("failed"), result
    inspect = dockerd.containers[NAME]["inspect"]
    assert inspect["Id"] == result["container_id"] != "old"
    assert inspect["State"]["Running"]
    config, host = inspect["Config"], inspect["HostConfig"]
    assert config["Cmd"][-1] == "llamafactory-cli" and config["WorkingDir"] == "/jobs/demo"
    # As docker run --env-file reads it: no BOM, no comments, values as written.
    assert config["Env"] == ["NCCL_SOCKET_IFNAME=ens4", "HF_HUB_OFFLINE=1", "QUOTED='a b'"]
    assert config["Labels"] == {"hostnet.llamafactory.rank": "1"}
    assert host["NetworkMode"] == "host" and host["IpcMode"] == "host"
    assert host["Ulimits"][0] == {"Name": "memlock", "Soft": -1, "Hard": -1}
    assert host["Devices"] == [
        {
            "PathOnHost": "/dev/infiniband",
            "PathInContainer": "/dev/infiniband",
            "CgroupPermissions": "rwm",
        },
        {
            "PathOnHost": "/dev/aperture_devices",
            "PathInContainer": "/dev/aperture_devices",
            "CgroupPermissions": "rw",
        },
    ]
    assert host["DeviceRequests"][0]["Driver"] == "nvidia" and host["RestartPolicy"] == {
        "Name": "no"
    }
    calls = [tuple(request[:2]) for request in dockerd.requests]
    assert calls == [
        ("DELETE", f"/containers/{NAME}"),
        ("POST", "/containers/create"),
        ("POST", f"/containers/{NAME}/start"),
    ]


def test_check_mode_changes_nothing(dockerd, socket_path, tmp_path):
    result = run_module(
        tmp_path,
        _ansible_check_mode=True,
        name=NAME,
        image=IMAGE,
        command=["true"],
        docker_socket=socket_path,
    )
    assert result["changed"] and result["container_id"] is None
    assert dockerd.requests == []


def test_faults_are_named_with_the_container(dockerd, socket_path, tmp_path):
    missing = rank(tmp_path, socket_path)  # the daemon lacks the image
    assert missing["failed"] and missing["msg"].startswith(f"container {NAME}: ")
    assert "No such image" in missing["msg"]
    bad = rank(tmp_path, socket_path, ulimits=["memlock=-1"])
    assert bad["failed"] and "memlock:-1:-1" in bad["msg"]
    no_env = rank(tmp_path, socket_path, env_file=str(tmp_path / "absent"))
    assert no_env["failed"] and "absent" in no_env["msg"]


def test_the_ended_probe_is_removed_in_the_same_call(dockerd, socket_path, tmp_path):
    """remove: the preflight's probe, ended on a node whose report rank 0 gathered, goes before
    the rank starts; one that is not there is no fault."""
    dockerd.images[IMAGE] = "sha256:" + "1" * 64
    probe = "llamafactory-demo-preflight"
    dockerd.add_container(probe, {"Id": "probe", "State": {"Running": False}, "Config": {}})
    result = rank(tmp_path, socket_path, remove=[probe])
    assert result["changed"] and not result.get("failed"), result
    assert probe not in dockerd.containers
    assert dockerd.containers[NAME]["inspect"]["State"]["Running"]
    assert [tuple(r[:2]) for r in dockerd.requests][:2] == [
        ("DELETE", f"/containers/{probe}"),
        ("DELETE", f"/containers/{NAME}"),
    ]
    again = rank(tmp_path, socket_path, remove=[probe])
    assert again["changed"] and not again.get("failed"), again


def test_the_script_is_the_started_container_by_hand(dockerd, socket_path, tmp_path):
    """script: the container's docker run, written as it starts (0750), rewritten only when it
    differs; nothing written in check mode."""
    dockerd.images[IMAGE] = "sha256:" + "1" * 64
    script = tmp_path / "launch.sh"
    checked = rank(tmp_path, socket_path, script=str(script), _ansible_check_mode=True)
    assert checked["script_changed"] and not script.exists()
    first = rank(tmp_path, socket_path, script=str(script))
    assert first["script_changed"] and not first.get("failed"), first
    text = script.read_text()
    assert oct(script.stat().st_mode & 0o777) == "0o750"
    assert f"exec docker run -d \\\n    --name {NAME} \\\n    --network host \\\n" in text
    assert f"--env-file {tmp_path}/env \\\n" in text and "--gpus all \\\n" in text
    command = "python3 /jobs/demo/rank_agent.py /jobs/demo/agent.json -- llamafactory-cli"
    assert text.endswith(f"    {IMAGE} {command}\n")
    again = rank(tmp_path, socket_path, script=str(script))
    assert again["changed"] and not again["script_changed"]
    other = rank(tmp_path, socket_path, script=str(script), labels={"hostnet.llamafactory.rank": 2})
    assert other["script_changed"] and "hostnet.llamafactory.rank=2" in script.read_text()
