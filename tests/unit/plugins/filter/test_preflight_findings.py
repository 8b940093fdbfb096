"""The filter preflight_findings: options by name only, the message and versions it adds to the
findings, and its call in the launch role."""

import json
from pathlib import Path

import pytest
from ansible_collections.hostnet.llamafactory.plugins.filter.preflight_findings import (
    preflight_findings,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "preflight"


def captured(name):
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    reports = {host: {"report": report, "error": ""} for host, report in data["reports"].items()}
    options = {
        "nodes": data["nodes"],
        "master_addr": data["nodes"]["vm0"]["address"],
        "master_port": data["master_port"],
        "probe_port": data["probe_port"],
        "network_mode": data["network_mode"],
    }
    return reports, options


def test_a_blocked_port_gives_findings_and_a_message():
    reports, options = captured("blocked-port")
    verdict = preflight_findings(reports, job="demo", **options)
    count = len(verdict["findings"])
    assert count > 0
    assert verdict["msg"].startswith(f"preflight of job demo found {count} problem(s)")
    reports, options = captured("healthy")
    clean = preflight_findings(reports, job="demo", **options)
    assert clean["findings"] == [] and clean["msg"] == ""


def test_positional_options_are_refused():
    reports, options = captured("healthy")
    with pytest.raises(TypeError):
        preflight_findings(  # pylint: disable=missing-kwoa
            reports,
            options["nodes"],
            options["master_addr"],
            options["master_port"],
            options["probe_port"],
        )


def test_the_call_site_binds(call_sites):
    for _where, positional, _keywords in call_sites("preflight_findings", preflight_findings):
        assert positional == 0
