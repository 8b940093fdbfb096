"""The container's create body (module_utils/_container.py), against what docker run does with
the same flags (--env-file, --ulimit, --device, -p)."""

import shlex
import subprocess

import pytest
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _container as container


def test_an_env_file_reads_as_docker_run_reads_it():
    text = "A=1\n# B=2\nC\nD\n E= spaced \n"
    # C is set in the environment (taken from it), D is not (dropped); values are kept as written.
    assert container.env_file_lines(text, {"C": "from-env"}) == ["A=1", "C=from-env", "E= spaced "]
    with pytest.raises(container.ContainerSpecError, match="line 1"):
        container.env_file_lines("MY VAR=1\n", {})


@pytest.mark.parametrize(
    ("text", "mapping"),
    [
        ("/dev/fuse", ("/dev/fuse", "/dev/fuse", "rwm")),
        ("/dev/fuse:r", ("/dev/fuse", "/dev/fuse", "r")),
        ("/dev/sda:/dev/xvda", ("/dev/sda", "/dev/xvda", "rwm")),
        ("/dev/sda:/dev/xvda:rw", ("/dev/sda", "/dev/xvda", "rw")),
    ],
)
def test_devices_as_docker_run_device(text, mapping):
    found = container.device(text)
    assert (found["PathOnHost"], found["PathInContainer"], found["CgroupPermissions"]) == mapping


def test_ulimits_and_ports():
    assert container.ulimit("nofile:1024") == {"Name": "nofile", "Soft": 1024, "Hard": 1024}
    for bad in ("nofile", "nofile:x:1", ":1:1", "a:1:2:3"):
        with pytest.raises(container.ContainerSpecError):
            container.ulimit(bad)
    with pytest.raises(container.ContainerSpecError):
        container.device("/a:/b:/c")
    body = container.create_body(
        dict(
            image="i",
            command=["true"],
            network_mode="bridge",
            volumes=[],
            labels={},
            published_ports=["29500:29500"],
            device_requests=[],
        )
    )
    assert body["HostConfig"]["PortBindings"] == {
        "29500/tcp": [{"HostPort": "29500"}],
    }
    assert "Env" not in body and "IpcMode" not in body["HostConfig"]


RANK = {
    "image": "registry.example/llamafactory:0.9.5",
    "command": ["python3", "/jobs/my job/rank_agent.py", "--", "llamafactory-cli", "a'b"],
    "network_mode": "host",
    "volumes": ["/jobs/my job:/jobs/my job", "/shared:/shared:ro"],
    "published_ports": ["29500:29500"],
    "device_requests": [
        {"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]},
    ],
    "labels": {"hostnet.llamafactory.rank": 1, "hostnet.llamafactory.job": "demo"},
    "working_dir": "/jobs/my job",
    "ipc_mode": "host",
    "env_file": "/jobs/my job/env",
    "ulimits": ["memlock:-1:-1", "nofile:1024:4096"],
    "devices": ["/dev/infiniband", "/dev/aperture_devices:/dev/aperture_devices:rw"],
}


def parse_docker_run(script):
    """The script's `docker run` read back into the module's options, flag by flag (the docker
    CLI's own names), so that the test compares what Docker would be given."""
    text = script.replace("\\\n", " ")
    run = next(line for line in text.splitlines() if line.startswith("exec docker run"))
    words = shlex.split(run)
    assert words[:4] == ["exec", "docker", "run", "-d"]
    words = words[4:]
    params = {key: [] for key in ("volumes", "published_ports", "ulimits", "devices")}
    params.update(labels={}, device_requests=[])
    names = {"-v": "volumes", "-p": "published_ports", "--device": "devices"}
    while words[0].startswith("-"):
        flag, value = words.pop(0), words.pop(0)
        if flag in names:
            params[names[flag]].append(value)
        elif flag == "--ulimit":
            params["ulimits"].append(value.replace("=", ":"))
        elif flag == "--label":
            key, _eq, label = value.partition("=")
            params["labels"][key] = label
        elif flag == "--gpus":
            count = -1 if value == "all" else int(value)
            params["device_requests"].append({"count": count, "capabilities": [["gpu"]]})
        else:
            key = {
                "--name": "name",
                "--network": "network_mode",
                "--ipc": "ipc_mode",
                "--restart": "restart",
                "--env-file": "env_file",
                "--workdir": "working_dir",
            }
            params[key[flag]] = value
    params["image"], params["command"] = words[0], words[1:]
    return params


def test_the_script_starts_the_same_container_by_hand():
    script = container.docker_run_script("llamafactory-demo", RANK)
    assert script.startswith("#!/bin/sh\n") and "set -eu" in script
    assert "docker rm -f llamafactory-demo >/dev/null 2>&1 || true" in script
    assert "(job demo,\n# rank 1)" in script
    parsed = parse_docker_run(script)
    assert parsed.pop("name") == "llamafactory-demo" and parsed.pop("restart") == "no"
    assert parsed["env_file"] == RANK["env_file"]
    body, expected = container.create_body(parsed), container.create_body(RANK)
    # --gpus names no driver (the CLI's own); the rest is the create body the module sends.
    for request in expected["HostConfig"]["DeviceRequests"]:
        request["Driver"] = ""
    assert body == expected
    # `sh -n`: the script parses as a shell script.
    checked = subprocess.run(
        ["sh", "-n"], input=script, text=True, capture_output=True, check=False
    )
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize(
    "request_, flag",
    [
        ({"count": -1}, "--gpus all"),
        ({"count": 2}, "--gpus 2"),
        ({"device_ids": ["0", "3"], "count": 0}, "--gpus device=0,3"),
    ],
)
def test_gpu_requests_as_docker_run_gpus(request_, flag):
    params = dict(RANK, device_requests=[dict(request_, capabilities=[["gpu"]])])
    assert flag + " \\\n" in container.docker_run_script("x", params)
