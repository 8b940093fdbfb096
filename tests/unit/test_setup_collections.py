"""The collection installer's version check against requirements.yml ranges."""

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "setup_collections", Path(__file__).resolve().parents[2] / "tools" / "setup_collections.py"
)
setup_collections = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(setup_collections)


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [
        ("4.8.5", ">=4.8.0,<5.0.0", True),
        ("5.0.0", ">=4.8.0,<5.0.0", False),
        ("4.7.9", ">=4.8.0,<5.0.0", False),
        ("1.10.2", ">=1.10.0", True),
        ("1.9.0", ">=1.10.0", False),
        ("2.1.0", "*", True),
        ("2.1.0", "==2.1.0", True),
        ("2.1.0", "!=2.1.0", False),
    ],
)
def test_version_ranges(version, spec, ok):
    assert setup_collections.version_ok(version, spec) is ok
