"""Every role has meta/argument_specs.yml, and a README and defaults/main.yml generated from it."""

import subprocess
import sys
from pathlib import Path

import role_docs

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


def test_a_roles_defaults_are_written_from_its_spec(tmp_path):
    """Every option with a default, in the spec's order, under its description's first
    sentence; values plain where YAML reads them back the same, else double-quoted."""

    role = tmp_path / "demo"
    (role / "meta").mkdir(parents=True)
    (role / "meta" / "argument_specs.yml").write_text(
        """argument_specs:
  main:
    options:
      demo_image: {type: str, default: "hub/demo:1.0", description: The C(demo) image. Pinned.}
      demo_port: {type: int, description: No default, none written.}
      demo_job: {type: str, default: null, description: [Derived when null. Really., More.]}
      demo_empty: {type: str, default: "", description: Empty.}
      demo_dir: {type: path, default: "{{ lookup('env', 'HOME') }}/x", description: Home.}
      demo_list: {type: list, elements: str, default: [a, "b c"], description: A list.}
      demo_on: {type: bool, default: true, description: On.}
"""
    )
    assert role_docs.render_defaults(role) == (
        "---\n"
        f"{role_docs.DEFAULTS_MARK}\n"
        "# The demo image.\ndemo_image: hub/demo:1.0\n"
        "# Derived when null.\ndemo_job: null\n"
        '# Empty.\ndemo_empty: ""\n'
        "# Home.\ndemo_dir: \"{{ lookup('env', 'HOME') }}/x\"\n"
        "# A list.\ndemo_list: [a, b c]\n"
        "# On.\ndemo_on: true\n"
    )
