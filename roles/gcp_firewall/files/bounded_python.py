# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run a module under a deadline: the interpreter of the role's google.cloud module tasks.

gcp_compute_firewall polls its operation with no deadline, and the task `timeout` keyword stops
waiting but leaves the module process running. The tasks' ansible_python_interpreter is
bounded_python, the shell script next to this file, which runs this file with the controller's
Python the role names (GCP_FIREWALL_PYTHON). It runs that Python with the same arguments and
stdin in a session of its own; after GCP_FIREWALL_DEADLINE seconds it ends the session's
processes and prints a module result that fails with deadline_exceeded: true. The module gets a
temporary directory (TMPDIR) of its own, removed at the end: a stopped module cannot remove its
unpacked payload itself.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

GRACE = 5.0


def end(child):
    """Stop the child's whole session: SIGTERM, then SIGKILL after GRACE seconds."""
    for sig, wait in ((signal.SIGTERM, GRACE), (signal.SIGKILL, None)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def main(argv, environ):
    deadline = float(environ.get("GCP_FIREWALL_DEADLINE") or 300)
    scratch = tempfile.mkdtemp(prefix="gcp_firewall_module.")
    try:
        return run(argv, dict(environ, TMPDIR=scratch), deadline)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run(argv, environ, deadline):
    child = subprocess.Popen([sys.executable, *argv], env=environ, start_new_session=True)

    def interrupted(signum, _frame):
        end(child)
        sys.exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, interrupted)
    try:
        return child.wait(deadline)
    except subprocess.TimeoutExpired:
        end(child)
    result = {
        "failed": True,
        "deadline_exceeded": True,
        "deadline": deadline,
        "msg": f"The module did not finish within {deadline:g} s and was stopped.",
    }
    print(json.dumps(result))
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], os.environ))
