"""tools/matrix.py's pure parts: the version list, the requirements, output parsing, summaries."""

import json
from pathlib import Path

import matrix
import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_minimum_core_from_runtime_yml():
    assert matrix.minimum_core('requires_ansible: ">=2.19.0"\n') == (2, 19)
    assert matrix.minimum_core((ROOT / "meta/runtime.yml").read_text()) >= (2, 19)
    with pytest.raises(matrix.MatrixError, match="requires_ansible"):
        matrix.minimum_core("plugin_routing: {}\n")


def test_cores_default_series_and_releases():
    default = matrix.parse_cores(None, (2, 19))
    assert [c.label for c in default] == list(matrix.DEFAULT_CORES)
    cores = matrix.parse_cores(["2.20", "2.19.3,2.21", "2.20", "ansible-core==2.20.1"], (2, 19))
    assert cores == [
        matrix.Core("2.20", "ansible-core>=2.20,<2.21"),
        matrix.Core("2.19.3", "ansible-core==2.19.3"),
        matrix.Core("2.21", "ansible-core>=2.21,<2.22"),
        matrix.Core("2.20.1", "ansible-core==2.20.1"),
    ]


@pytest.mark.parametrize(("value", "message"), [("2.18", ">= 2.19"), ("latest", "a series")])
def test_cores_refused_with_the_fix(value, message):
    with pytest.raises(matrix.MatrixError, match=message):
        matrix.parse_cores([value], (2, 19))


def test_unit_requirements_drop_core_and_development_tools():
    pyproject = """
[project]
dependencies = ["ansible-core>=2.19.0,<2.20", "ansible-lint>=26", "molecule>=26",
    "molecule-plugins[docker]>=26", "pytest>=9.0", "Ruff>=0.17", "pytest-testinfra>=10",
    "pyyaml>=6.0"]
"""
    assert matrix.unit_requirements(pyproject) == ["pytest>=9.0", "pyyaml>=6.0"]
    ours = matrix.unit_requirements((ROOT / "pyproject.toml").read_text())
    assert any(r.startswith("pytest>") for r in ours)
    assert not any(r.startswith(("ansible-core", "ansible-lint", "molecule")) for r in ours)


def test_pytest_counts():
    output = "....F.s\nFAILED tests/unit/x.py::t - boom\n2 failed, 430 passed, 1 skipped in 9.1s\n"
    assert matrix.pytest_counts(output) == {"failed": 2, "passed": 430, "skipped": 1}
    assert matrix.pytest_counts("1 passed, 1 error, 1 warning in 3s") == {
        "passed": 1,
        "errors": 1,
        "warnings": 1,
    }
    summary = "430 passed, 35 warnings in 125.10s (0:02:05)"
    assert matrix.pytest_counts(f"..\n{summary}") == {"passed": 430, "warnings": 35}
    assert matrix.pytest_counts("bash: python: command not found") == {}


def test_sanity_counts():
    output = "\n".join(
        [
            'Running sanity test "action-plugin-docs"',
            'Running sanity test "compile" on Python 3.13',
            "ERROR: Found 1 pylint issue(s) which need to be resolved:",
            'WARNING: Skipping sanity test "import" on Python 3.13 due to missing libyaml.',
            "Running sanity test 'yamllint'",
            "FATAL: The 1 sanity test(s) listed below (out of 3) failed. See error output above.",
        ]
    )
    assert matrix.sanity_counts(output) == {"run": 3, "failed": 1, "skipped": 1}
    assert matrix.sanity_counts('Running sanity test "pep8"\n') == {
        "run": 1,
        "failed": 0,
        "skipped": 0,
    }


def test_release_of_a_wheel_sorts_by_number():
    versions = ("2.20.9", "2.20.10", "2.20.0rc1")
    wheels = [Path(f"ansible_core-{v}-py3-none-any.whl") for v in versions]
    assert max(wheels, key=matrix.release).name == "ansible_core-2.20.10-py3-none-any.whl"
    assert matrix.release(wheels[2]) == (2, 20, 0)


def result(unit="pass", sanity="pass", error=""):
    checks = [
        matrix.Check("venv", "pass", 16),
        matrix.Check("unit", unit, 120, {"passed": 430} if unit != "skipped" else {}),
        matrix.Check("packaging", "pass", 20, {"passed": 1}),
        matrix.Check("sanity", sanity, 200, {"run": 23, "failed": sanity == "fail"}),
    ]
    versions = {"ansible-core": "2.20.10", "python": "3.13.5"}
    core = matrix.Core("2.20", "ansible-core>=2.20,<2.21")
    return matrix.Result(core, versions, checks, 360.4, error)


def test_summary_line_and_json():
    ok = result()
    assert ok.passed
    line = matrix.summary_line(ok)
    assert line == (
        "PASS ansible-core 2.20.10 on Python 3.13.5: unit 430 passed, packaging 1 passed, "
        "sanity 23/23 (360 s)"
    )
    bad = result(sanity="fail")
    assert not bad.passed
    assert matrix.summary_line(bad).startswith("FAIL ")
    assert "sanity 22/23 FAILED" in matrix.summary_line(bad)
    assert matrix.summary_line(bad).endswith("; failed: sanity")
    stopped = result(sanity="fail")
    stopped.checks[-1].counts = {"run": 2, "failed": 0, "skipped": 0}
    assert "sanity FAILED in test 2 (360 s)" in matrix.summary_line(stopped)
    made = matrix.summary([ok, bad], "img", 721.0, "PyPI from the container")
    assert made["passed"] is False
    assert [r["status"] for r in made["results"]] == ["PASS", "FAIL"]
    assert made["results"][0]["checks"]["unit"]["counts"] == {"passed": 430}
    json.dumps(made)  # serialisable as written to last.json


def test_an_error_fails_the_version():
    broken = matrix.Result(matrix.Core("2.21", "ansible-core>=2.21,<2.22"), error="no network")
    assert not broken.passed
    line = matrix.summary_line(broken)
    assert line.startswith("FAIL ansible-core 2.21 (not installed)")
    assert line.endswith("; no network")
