"""docker_host_facts run as Ansible runs it on a node, against this machine's own dpkg and files
(the parsers: tests/unit/plugins/module_utils/test__docker_host.py)."""

from pathlib import Path

import ansible_run
import pytest


def run_module(args, tmp_path):
    """The module as Ansible runs it on a node, on this machine."""
    return ansible_run.module("docker_host_facts", tmp_path, "/usr/sbin:/usr/bin:/bin", **args)


@pytest.mark.skipif(not Path("/usr/bin/dpkg-query").exists(), reason="needs a Debian host")
def test_the_module_on_this_machine(tmp_path):
    daemon = tmp_path / "daemon.json"
    daemon.write_text('{"log-driver": "json-file"}\n')
    result = run_module(
        {
            "packages": ["dpkg", "hostnet-no-such-package"],
            "daemon_json": str(daemon),
            "pending_marker": str(tmp_path / "pending"),
        },
        tmp_path,
    )
    assert result["changed"] is False and not result.get("failed"), result
    assert list(result["packages"]) == ["dpkg"]
    assert result["missing"] == ["hostnet-no-such-package"]
    assert result["daemon_json"] == '{"log-driver": "json-file"}\n'
    assert result["pending"] is False and result["service"] is None
    assert result["dockerd_version"] is None  # not asked
    assert result["os"]["family"] == "Debian" and result["os"]["release"]  # this Debian machine
    (tmp_path / "pending").write_text("")
    result = run_module(
        {"daemon_json": str(tmp_path / "absent.json"), "pending_marker": str(tmp_path / "pending")},
        tmp_path,
    )
    assert result["daemon_json"] is None and result["pending"] is True


@pytest.mark.skipif(
    not Path("/var/lib/dpkg/info/docker.io.list").exists(), reason="needs docker.io"
)
def test_the_dockerd_version_comes_from_its_package(tmp_path):
    # This machine's dockerd is Debian's docker.io (tools/prereqs.sh installs it).
    asked = run_module({"dockerd": True}, tmp_path)  # no packages: dockerd --version
    from_package = run_module({"dockerd": True, "packages": ["docker.io"]}, tmp_path)
    assert asked["dockerd_version"] and from_package["packages"]["docker.io"]
    assert from_package["dockerd_version"] == asked["dockerd_version"]
