"""The README's troubleshooting table is generated from the diagnosis table and kept current."""

import subprocess
import sys
from pathlib import Path

from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._diagnosis import (
    SIGNATURES,
    diagnose,
)

ROOT = Path(__file__).resolve().parents[3]


def test_every_example_line_is_recognised_as_its_own_signature():
    for signature in SIGNATURES:
        assert [f["id"] for f in diagnose(signature["example"])] == [signature["id"]]


def test_readme_table_is_current():
    result = subprocess.run(
        [sys.executable, "tools/troubleshooting.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    readme = (ROOT / "README.md").read_text()
    for signature in SIGNATURES:
        assert " ".join(signature["example"].split()) in readme
