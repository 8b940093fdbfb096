"""Every role has meta/argument_specs.yml and a README generated from it."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_role_readmes_are_current():
    result = subprocess.run(
        [sys.executable, "tools/role_docs.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
