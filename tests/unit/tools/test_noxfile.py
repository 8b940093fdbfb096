"""noxfile.py's parts that decide what runs: the matrix's requirements and its ansible-core lines,
the session ./dev test runs for the newest line, the get-pip stand-in."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
noxfile = pytest.importorskip("noxfile")


def test_matrix_requirements_drop_core_and_development_tools():
    ours = noxfile.unit_requirements()
    names = {re.match(r"[A-Za-z0-9_.-]+", r)[0].lower() for r in ours}
    assert not names & {"ansible-core", "ansible-lint", "molecule", "molecule-plugins", "ruff"}
    # what the container runs: nox, antsibull-nox (sanity), pytest (units), ansible-runner
    assert {"nox", "antsibull-nox", "pytest", "ansible-runner", "pyyaml"} <= names


def test_core_requirement_is_the_whole_line():
    assert noxfile.core_requirement("2.21") == "ansible-core>=2.21,<2.22"
    assert noxfile.core_requirement("2.9") == "ansible-core>=2.9,<2.10"


def test_matrix_lines_start_at_the_supported_minimum_and_end_with_the_newest():
    cores = [Version(c) for c in noxfile.CORES]
    assert cores == sorted(cores)  # ./dev test runs the last one as "the newest"
    minimum = re.search(
        r"requires_ansible:\s*[\"']?>=\s*([\d.]+)", (ROOT / "meta/runtime.yml").read_text()
    )
    assert cores[0] >= Version(".".join(minimum[1].split(".")[:2]))
    assert noxfile.dev_core() in noxfile.CORES  # the venv's line is in the matrix


def test_newest_core_tag_selects_only_the_newest_line():
    listed = subprocess.run(
        [sys.executable, "-m", "nox", "-l", "--json", "-t", "newest-core"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    selected = [s["session"] for s in json.loads(listed.stdout)]
    assert selected == [f"matrix(core='{noxfile.CORES[-1]}')"]


def test_get_pip_stand_in_bootstraps_pip_and_installs_what_it_was_asked(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "ensurepip", type(sys)("ensurepip"))
    sys.modules["ensurepip"].bootstrap = lambda **kw: calls.append(("bootstrap", kw))
    monkeypatch.setattr(subprocess, "check_call", lambda args, env: calls.append(args))
    monkeypatch.setattr(sys, "argv", ["get-pip.py", "--no-setuptools", "--no-wheel", "pip==24.2"])
    exec(compile(noxfile.GET_PIP, "get_pip.py", "exec"), {"__name__": "__main__"})  # noqa: S102
    assert calls[0] == ("bootstrap", {"upgrade": True})
    install = calls[1]
    assert install[1:4] == ["-m", "pip", "install"] and install[-1] == "pip==24.2"
    assert "--no-setuptools" not in install and "--no-wheel" not in install


@pytest.mark.parametrize(
    ("unusable", "expected"),
    [
        ([], ["molecule", "test", "-s", "s"]),
        (["ubuntu"], ["molecule", "test", "-s", "s", "--platform-name", "debian"]),
        (["debian", "ubuntu"], None),  # nothing left: skipped, not passed
    ],
)
def test_molecule_leaves_out_platforms_or_skips(unusable, expected):
    assert noxfile.molecule_command("s", ["debian", "ubuntu"], unusable) == expected


def test_molecule_skips_a_scenario_left_with_part_of_several_platforms():
    assert noxfile.molecule_command("s", ["a", "b", "c"], ["c"]) is None
