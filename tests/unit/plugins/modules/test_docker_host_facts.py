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
