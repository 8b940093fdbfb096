"""bounded_python.py (role gcp_firewall): the deadline the role puts on google.cloud modules."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

RUNNER = (
    Path(__file__).resolve().parents[3] / "roles" / "gcp_firewall" / "files" / "bounded_python.py"
)


def run(args, deadline, stdin=""):
    env = dict(os.environ, GCP_FIREWALL_DEADLINE=str(deadline))
    return subprocess.run(
        [sys.executable, str(RUNNER), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_module_that_finishes_passes_through():
    done = run(["-c", "import sys; print('{\"changed\": true}'); sys.exit(3)"], 30)
    assert done.returncode == 3
    assert done.stdout == '{"changed": true}\n'


def test_the_module_comes_on_stdin_with_pipelining():
    done = run(["-"], 30, stdin="print(6 * 7)\n")
    assert done.returncode == 0
    assert done.stdout == "42\n"


def test_the_deadline_stops_the_module_and_what_it_started(tmp_path):
    pids = tmp_path / "pids"
    program = (
        "import os, subprocess, sys, tempfile, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "payload = tempfile.mkdtemp(prefix='ansible_payload_')\n"
        f"open({str(pids)!r}, 'w').write('%d %d %s' % (os.getpid(), child.pid, payload))\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    done = run(["-c", program], 1.5)
    assert time.monotonic() - started < 15
    assert done.returncode == 1
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["failed"] is True
    assert result["deadline_exceeded"] is True
    assert result["msg"] == "The module did not finish within 1.5 s and was stopped."
    module, grandchild, payload = pids.read_text().split()
    module, grandchild = int(module), int(grandchild)
    assert Path(payload).parent.name.startswith("gcp_firewall_module.")
    assert not Path(payload).exists()  # the module's temporary files went with it
    deadline = time.monotonic() + 5
    while (alive(module) or alive(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(module)
    assert not alive(grandchild)


def test_the_shipped_interpreter_runs_the_runner_with_the_python_named():
    """files/bounded_python, the role's ansible_python_interpreter: executable (a collection
    build keeps the bit), runs bounded_python.py with GCP_FIREWALL_PYTHON, stdin passed on."""
    shipped = RUNNER.with_suffix("")
    assert os.access(shipped, os.X_OK)
    env = dict(os.environ, GCP_FIREWALL_DEADLINE="30", GCP_FIREWALL_PYTHON=sys.executable)
    done = subprocess.run(
        [str(shipped)],
        input="import sys; print(sys.executable)\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, sys.executable + "\n")
    env.pop("GCP_FIREWALL_PYTHON")
    done = subprocess.run(
        [str(shipped)], input="", capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode != 0 and "GCP_FIREWALL_PYTHON" in done.stderr
