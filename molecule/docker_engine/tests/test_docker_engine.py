"""docker_engine after converge, and what it does on bad input, failed restarts and while a
training container runs. Runs the role again through ansible-runner and asserts on its events."""

import json
from pathlib import Path

import pytest
from molecule_helpers import load_image, run_playbook, run_playbook_tasks

SCENARIO = Path(__file__).resolve().parents[1]
MARKER = "/etc/docker/.hostnet-llamafactory-restart-pending"
PROBE = "hostnet-llamafactory/probe:busybox"


def daemon_json(host) -> dict:
    return json.loads(host.file("/etc/docker/daemon.json").content_string)


def dockerd_pid(host) -> str:
    return host.check_output("systemctl show --property MainPID --value docker")


def run_role(host, tmp_path, **extravars):
    return run_playbook(host, SCENARIO / "role.yml", tmp_path, **extravars)


def run_role_after_facts(host, tmp_path, **extravars):
    """The role after node_facts, as train.yml runs it (run_playbook_tasks' answer)."""
    return run_playbook_tasks(host, SCENARIO / "role_after_facts.yml", tmp_path, **extravars)


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


def test_a_host_in_place_read_by_node_facts_ends_the_role_at_once(host, tmp_path):
    """After node_facts (train.yml's discovery) on a host with everything in place, the role
    ends at its first task: no other task of it runs or is skipped on the node."""
    rc, changed, _messages, tasks = run_role_after_facts(host, tmp_path)
    assert rc == 0 and changed == 0
    first = (
        "Read the host as train.yml's discovery does (node_facts)",
        "Run docker_engine",
        "End here when the host is as it should be (from the fact docker_host)",
    )
    ran = [task for task in tasks if task not in first and not task.startswith("Validating arg")]
    assert ran == []


def test_a_host_read_by_node_facts_is_still_put_right(host, tmp_path):
    """The same run puts right what differs: a mode changed by hand is written back, and a bad
    setting fails before anything changes, naming the variable."""
    before_pid, before = dockerd_pid(host), daemon_json(host)
    bad = tmp_path / "bad"
    bad.mkdir()
    rc, _changed, messages, _tasks = run_role_after_facts(host, bad, docker_engine_bip="x")
    assert rc != 0 and "'bip': 'x' must be the bridge's IPv4 address with a prefix" in messages
    assert dockerd_pid(host) == before_pid and daemon_json(host) == before
    host.check_output("chmod 0600 /etc/docker/daemon.json")
    mode = tmp_path / "mode"
    mode.mkdir()
    rc, changed, messages, tasks = run_role_after_facts(host, mode)
    assert rc == 0 and changed >= 1 and "Write daemon.json" in tasks, messages
    assert host.file("/etc/docker/daemon.json").mode == 0o644
    assert daemon_json(host) == before
