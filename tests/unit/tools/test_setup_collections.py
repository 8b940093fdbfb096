"""The collection installer's version check against requirements.yml ranges."""

import pytest
import setup_collections


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [
        ("4.8.5", ">=4.8.0,<5.0.0", True),
        ("5.0.0", ">=4.8.0,<5.0.0", False),
        ("4.7.9", ">=4.8.0,<5.0.0", False),
        ("4.10.0", ">=4.8.0,<4.9.0", False),  # numeric, not string, order
        ("1.10.2", ">=1.10.0", True),
        ("1.9.0", ">=1.10.0", False),
        ("2.1.0", "*", True),
        ("2.1.0", "==2.1.0", True),
        ("2.1.0", "!=2.1.0", False),
        ("3.0.0-beta.1", ">=2.0.0", True),  # a collection's pre-release (semver)
    ],
)
def test_version_ranges(version, spec, ok):
    assert setup_collections.version_ok(version, spec) is ok
