"""docker_engine after converge, and what it does on bad input, failed restarts and while a
training container runs. Runs the role again through ansible-runner and asserts on its events."""

import json
from pathlib import Path

import pytest
from molecule_helpers import load_image, run_playbook

SCENARIO = Path(__file__).resolve().parents[1]
MARKER = "/etc/docker/.hostnet-llamafactory-restart-pending"
PROBE = "hostnet-llamafactory/probe:busybox"


def daemon_json(host) -> dict:
    return json.loads(host.file("/etc/docker/daemon.json").content_string)


def dockerd_pid(host) -> str:
    return host.check_output("systemctl show --property MainPID --value docker")


def run_role(host, tmp_path, **extravars):
    return run_playbook(host, SCENARIO / "role.yml", tmp_path, **extravars)


def test_docker_is_installed_enabled_and_running(host):
    assert host.package("docker.io").is_installed
    service = host.service("docker")
    assert service.is_running and service.is_enabled
    assert host.run("docker info --format '{{.CgroupDriver}}'").stdout.strip() == "cgroupfs"


def test_daemon_json_merged_without_losing_the_users_key(host):
    config = host.file("/etc/docker/daemon.json")
    assert (config.user, config.group, config.mode) == ("root", "root", 0o644)
    settings = daemon_json(host)
    assert settings["max-concurrent-downloads"] == 7  # put there by prepare.yml
    assert settings["exec-opts"] == ["native.cgroupdriver=cgroupfs"]
    assert settings["bip"] == "172.31.0.1/16"
    assert settings["default-address-pools"] == [{"base": "172.30.0.0/16", "size": 24}]
    assert settings["log-opts"] == {"max-size": "100m", "max-file": "3"}
    backups = host.run("ls /etc/docker/ | grep -c '^daemon.json\\..*~$'").stdout.strip()
    assert int(backups) >= 1
    assert "inet 172.31.0.1/16" in host.check_output("ip -4 addr show docker0")


def test_bad_value_fails_before_anything_changes(host, tmp_path):
    before_pid, before = dockerd_pid(host), daemon_json(host)
    rc, _changed, messages = run_role(host, tmp_path, docker_engine_bip="x")
    assert rc != 0
    assert "'bip': 'x' must be the bridge's IPv4 address with a prefix" in messages
    assert dockerd_pid(host) == before_pid
    assert daemon_json(host) == before


def test_a_file_docker_rejects_is_rolled_back(host, tmp_path):
    before = daemon_json(host)
    rc, _changed, messages = run_role(
        host, tmp_path, docker_engine_daemon_settings={"no-such-docker-option": True}
    )
    assert rc != 0
    assert "Docker did not come back with the new daemon.json" in messages
    assert "previous file was put back" in messages
    assert daemon_json(host) == before
    assert host.service("docker").is_running


@pytest.fixture
def training_container(host):
    load_image(host, PROBE)
    host.check_output(
        f"docker run -d --name training --label hostnet.llamafactory.job=test {PROBE} sleep 600"
    )
    yield
    host.run("docker rm -f training")


def test_no_restart_while_training_runs_and_pending_is_reported(host, tmp_path, training_container):
    pid = dockerd_pid(host)
    rc, changed, messages = run_role(host, tmp_path / "1", docker_engine_log_max_size="20m")
    assert rc == 0 and changed >= 1
    assert "Docker restart PENDING" in messages
    assert daemon_json(host)["log-opts"]["max-size"] == "20m"
    assert host.file(MARKER).exists and dockerd_pid(host) == pid

    rc, changed, messages = run_role(host, tmp_path / "2", docker_engine_log_max_size="20m")
    assert (rc, changed) == (0, 0)
    assert "Docker restart PENDING" in messages
    assert dockerd_pid(host) == pid

    host.check_output("docker rm -f training")
    rc, changed, messages = run_role(host, tmp_path / "3", docker_engine_log_max_size="20m")
    assert rc == 0 and changed >= 1 and "PENDING" not in messages
    assert dockerd_pid(host) != pid and not host.file(MARKER).exists
    assert host.service("docker").is_running

    # Back to the converged settings, so that the scenario's last state is the normal one.
    rc, _changed, _messages = run_role(host, tmp_path / "4")
    assert rc == 0 and daemon_json(host)["log-opts"]["max-size"] == "100m"


def test_a_wrong_mode_alone_is_put_right(host, tmp_path):
    """The role skips the write when the file it read is already right: text, owner, group and
    mode are all compared, so a mode changed by hand is still put back."""
    before = daemon_json(host)
    host.check_output("chmod 0600 /etc/docker/daemon.json")
    rc, changed, _messages = run_role(host, tmp_path)
    assert rc == 0 and changed >= 1
    config = host.file("/etc/docker/daemon.json")
    assert (config.user, config.group, config.mode) == ("root", "root", 0o644)
    assert daemon_json(host) == before
