"""The module image_pull's start phase run as Ansible runs it (its own process, arguments as JSON)
against the dockerd stand-in of conftest.py: what it decides from the node's images before any
registry is asked."""

import ansible_run

IMAGE = "registry.example:5000/hostnet/llamafactory:0.9.5"


def run_module(tmp_path, **args):
    return ansible_run.module("image_pull", tmp_path, "/usr/bin:/bin", **args)


def test_an_image_on_the_node_is_kept_without_asking_a_registry(tmp_path, dockerd, socket_path):
    dockerd.images[IMAGE] = "sha256:" + "1" * 64
    dockerd.pull_refusal = (500, "no registry should be asked")
    for pull in ("not_present", "never"):
        result = run_module(tmp_path, name=IMAGE, pull=pull, docker_socket=socket_path)
        assert result.get("failed") is not True, result
        assert (result["changed"], result["state"]) == (False, "present")
        assert result["image_id"] == "sha256:" + "1" * 64


def test_never_fails_on_a_missing_image_naming_the_fix(tmp_path, dockerd, socket_path):
    dockerd.pull_refusal = (500, "no registry should be asked")
    result = run_module(tmp_path, name=IMAGE, pull="never", docker_socket=socket_path)
    assert result["failed"] is True and result["state"] == "absent"
    assert f"{IMAGE} is not on this node and pull is never (llamafactory_pull)" in result["msg"]
    assert "llamafactory_pull=not_present" in result["msg"]
