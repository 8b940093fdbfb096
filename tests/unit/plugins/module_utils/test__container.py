"""The container's create body (module_utils/_container.py), against what docker run does with
the same flags (--env-file, --ulimit, --device, -p)."""

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
