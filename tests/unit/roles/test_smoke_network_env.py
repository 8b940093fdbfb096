"""The preflight's smoke test makes the network profile's environment as the rank's agent does
(roles/launch/files/rank_agent.py network_env, tested in test_rank_agent.py): the shell prelude
of roles/preflight/vars/main.yml (preflight_smoke_network), rendered by Ansible and run by the
shell smoke.yml starts: bash where a plugin's script is sourced (Google's nccl-env-profile.sh is
bash-only), sh otherwise."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.include_vars: {vars}
    - ansible.builtin.copy:
        content: "# {{{{ preflight_smoke_network }}}}"
        dest: {out}
        mode: "0644"
"""


def prelude(tmp_path, setup, gpus=0):
    """preflight_smoke_network rendered for `setup` (llamafactory_network_setup) on a node
    with `gpus` GPUs."""
    out = tmp_path / "prelude.sh"
    playbook = tmp_path / "render.yml"
    playbook.write_text(PLAYBOOK.format(vars=ROOT / "roles/preflight/vars/main.yml", out=out))
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("ansible-playbook")),
            str(playbook),
            "-e",
            json.dumps({"llamafactory_network_setup": setup, "llamafactory_gpus_per_node": gpus}),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out.read_text().removeprefix("# ")  # a comment mark: copy needs some content


def run(text, env, shell="bash"):
    return subprocess.run(
        [shell, "-c", text + " exec env"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plugin")
    path = folder / "nccl-env-profile.sh"
    # bash-only, as nccl-env-profile.sh is (a function with `local`, [[ =~ ]]).
    path.write_text(
        'find() { local slot="0000:06:00.0"; [[ "${slot}" =~ 0[6-7]\\:00\\.0 ]]; }\n'
        "find || exit 9\n"
        'echo "profile loaded"\nNCCL_SOCKET_IFNAME=eth0\nNCCL_PROTO=Simple,LL128\n'
        'LD_LIBRARY_PATH="${NCCL_LIB_DIR}:${LD_LIBRARY_PATH}"\n'
    )
    return str(path)


def test_the_script_is_sourced_under_the_containers_values(tmp_path, script):
    setup = {
        "profile": "tcpxo",
        "env_script": script,
        "library_path": ["/var/lib/tcpxo/lib64", "/usr/lib/x"],
    }
    text = prelude(tmp_path, setup)
    env = {
        "PATH": os.environ["PATH"],
        "NCCL_LIB_DIR": "/var/lib/tcpxo/lib64",
        "NCCL_SOCKET_IFNAME": "=enp0s12",
        "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
    }
    done = run(text, env)
    assert done.returncode == 0, done.stderr
    got = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    assert got["NCCL_PROTO"] == "Simple,LL128"
    assert got["NCCL_SOCKET_IFNAME"] == "=enp0s12"
    assert got["LD_LIBRARY_PATH"] == "/var/lib/tcpxo/lib64:/usr/lib/x:/usr/local/cuda/lib64"
    assert "profile loaded" in done.stderr


def test_a_missing_script_stops_the_smoke_test_naming_it(tmp_path):
    setup = {"profile": "gib", "env_script": str(tmp_path / "absent.sh"), "library_path": []}
    done = run(prelude(tmp_path, setup), {"PATH": os.environ["PATH"]})
    assert done.returncode == 3
    assert "absent.sh is not on this node" in done.stderr


def test_the_socket_profile_adds_nothing(tmp_path):
    socket = {"profile": "socket", "env_script": None, "library_path": []}
    assert prelude(tmp_path, socket, gpus=8).strip() == ""


def test_gpu_nodes_of_a_plugin_profile_log_nccls_network(tmp_path, script):
    # NCCL's INFO lines name the network it used: the verdict reads them (test__preflight.py).
    setup = {"profile": "gib", "env_script": script, "library_path": []}
    done = run(prelude(tmp_path, setup, gpus=8), {"PATH": os.environ["PATH"]})
    got = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    assert (got["NCCL_DEBUG"], got["NCCL_DEBUG_SUBSYS"]) == ("INFO", "INIT,NET")
    assert "NCCL_DEBUG=" not in run(prelude(tmp_path, setup, gpus=0), {}).stdout


def test_smoke_yml_runs_a_plugins_script_under_bash(tmp_path, script):
    tasks = yaml.safe_load((ROOT / "roles/preflight/tasks/smoke.yml").read_text())
    block = next(t["block"] for t in tasks if "block" in t)
    start = next(t for t in block if t["name"].startswith("Start the"))
    shell = start["community.docker.docker_container"]["command"][0]
    assert shell == "{{ 'bash' if llamafactory_network_setup.env_script is not none else 'sh' }}"
    setup = {"profile": "tcpxo", "env_script": script, "library_path": []}
    text = prelude(tmp_path, setup)
    assert run(text, {"PATH": os.environ["PATH"], "NCCL_LIB_DIR": "/x"}).returncode == 0
    if Path("/bin/sh").resolve().name == "dash":  # where sh is not bash, the script fails in it
        assert run(text, {"PATH": os.environ["PATH"], "NCCL_LIB_DIR": "/x"}, "sh").returncode != 0
