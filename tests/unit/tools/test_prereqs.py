"""tools/prereqs.sh on a machine made of stand-ins (no root needed): which packages it installs,
when and how it starts Docker's daemon, and what it tells a user who is not root."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "tools" / "prereqs.sh"
REAL = ("bash", "sed", "tail", "sleep", "cat", "setsid", "touch", "chmod")

pytestmark = pytest.mark.skipif(
    Path("/run/systemd/system").is_dir(), reason="systemd runs here: prereqs.sh uses systemctl"
)


def fake(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def machine(tmp_path):
    """A PATH with the base tools, a docker client that answers once $STATE/up exists, and
    apt-get that records its calls and installs a dockerd when asked for docker.io."""
    bin_, state = tmp_path / "bin", tmp_path / "state"
    bin_.mkdir()
    state.mkdir()
    for name in REAL:
        (bin_ / name).symlink_to(shutil.which(name))
    (bin_ / "python3").symlink_to(sys.executable)  # with ensurepip (python3-venv)
    for name in ("git", "shellcheck", "gpg", "debootstrap", "busybox", "ssh"):
        fake(bin_ / name, "exit 0")
    fake(bin_ / "id", 'echo "$FAKE_UID"')
    fake(bin_ / "docker", f'[[ "$1" == info && -e {state}/up ]]')
    dockerd = f"echo 'dockerd: starting'; [[ -e {state}/broken ]] && {{ echo boom; exit 1; }}; "
    dockerd += f"touch {state}/up"
    fake(
        bin_ / "apt-get",
        f'echo "$*" >>{state}/apt.log\n'
        f'if [[ "$1" == install && " $* " == *" docker.io "* ]]; then\n'
        f"  printf '#!/bin/bash\\n%s\\n' \"{dockerd}\" >{bin_}/dockerd; chmod +x {bin_}/dockerd\n"
        "fi",
    )

    class Machine:
        def install_dockerd(self):
            fake(bin_ / "dockerd", dockerd)

        def break_dockerd(self):
            (state / "broken").touch()

        def docker_up(self):
            (state / "up").touch()

        def apt_calls(self):
            log = state / "apt.log"
            return log.read_text().splitlines() if log.exists() else []

        def run(self, *args, uid=1000):
            env = {"PATH": str(bin_), "FAKE_UID": str(uid), "DOCKERD_WAIT_S": "3"}
            env["DOCKERD_LOG"] = str(tmp_path / "dockerd.log")
            return subprocess.run(
                [str(bin_ / "bash"), str(SCRIPT), *args],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )

    return Machine()


def test_docker_answering_needs_nothing(machine):
    machine.install_dockerd()
    machine.docker_up()
    done = machine.run("docker")
    assert done.returncode == 0, done.stderr
    assert machine.apt_calls() == []
    assert "starting" not in done.stderr


def test_a_client_alone_gets_docker_io_and_a_started_daemon_as_root(machine):
    done = machine.run("docker", uid=0)
    assert done.returncode == 0, done.stderr
    assert machine.apt_calls()[-1].split()[-1] == "docker.io"
    assert "starting dockerd" in done.stderr and "Docker answers" in done.stderr


def test_not_root_is_told_the_exact_commands(machine):
    done = machine.run("docker")
    assert done.returncode == 1
    assert "sudo apt-get install -y docker.io" in done.stderr
    assert machine.apt_calls() == []
    machine.install_dockerd()  # installed, but the daemon is down and there is no systemd
    done = machine.run("docker")
    assert done.returncode == 1
    assert "sudo sh -c 'setsid dockerd >" in done.stderr
    assert "systemctl" not in done.stderr


def test_a_daemon_that_does_not_start_fails_at_the_deadline_with_its_log(machine):
    machine.install_dockerd()
    machine.break_dockerd()
    done = machine.run("docker", uid=0)
    assert done.returncode == 1
    assert "did not answer within 3 s" in done.stderr
    assert "boom" in done.stderr  # the end of dockerd's log


def test_base_does_not_touch_docker(machine):
    done = machine.run("base")
    assert done.returncode == 0, done.stderr
    assert machine.apt_calls() == []
