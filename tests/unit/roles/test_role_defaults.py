"""Every role's defaults are what its argument spec declares (tools/role_docs.py generates both
defaults/main.yml and the README from the spec; a templated default is the same text in both), and
the signing keys the roles pin are full fingerprints."""

import re
from pathlib import Path

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[3] / "roles"


def documented(role: Path) -> dict:
    """name -> option, over every entry point of the role's spec."""
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    options = {}
    for entry in specs.values():
        options.update(entry.get("options") or {})
    return options


@pytest.mark.parametrize(
    "role", sorted(p.parent.parent for p in ROLES.glob("*/defaults/main.yml")), ids=lambda p: p.name
)
def test_defaults_are_documented_with_the_same_value(role):
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    options = documented(role)
    for name, value in defaults.items():
        assert name in options, f"{role.name}: {name} has a default but no spec entry"
        assert "default" in options[name], f"{role.name}: {name} has no default in its spec"
        assert options[name]["default"] == value, f"{role.name}: {name}"


def test_a_changed_default_is_caught(tmp_path):
    """The comparison itself: a default that differs from its spec is reported."""
    role = tmp_path / "demo"
    (role / "meta").mkdir(parents=True)
    (role / "defaults").mkdir()
    (role / "meta" / "argument_specs.yml").write_text(
        "argument_specs:\n  main:\n    options:\n      demo_port: {type: int, default: 1}\n"
    )
    (role / "defaults" / "main.yml").write_text("demo_port: 2\n")
    with pytest.raises(AssertionError, match="demo_port"):
        test_defaults_are_documented_with_the_same_value(role)


@pytest.mark.parametrize(
    ("role", "name"),
    [
        ("nvidia_container_toolkit", "nvidia_container_toolkit_gpgkey_fingerprint"),
        ("docker_engine", "docker_engine_docker_repo_key_fingerprint"),
    ],
)
def test_pinned_keys_are_full_fingerprints(role, name):
    value = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())[name]
    assert re.fullmatch(r"[0-9A-F]{40}", value), f"{name} is not a 40-hex-digit fingerprint"
