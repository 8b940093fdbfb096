"""The filter doctor_report: options by name only, and its call in the launch role."""

import pytest
from ansible_collections.hostnet.llamafactory.plugins.filter.doctor_report import doctor_report

FINDING = {"id": "peer-unreachable", "cause": "vm1 cannot reach vm0", "fix": "open the port"}
LOG = {"id": "gloo-loopback", "host": "vm1", "cause": "c", "fix": "f", "line": "l"}


def test_options_by_name_reach_the_report():
    report = doctor_report(
        [FINDING], log_findings=[LOG], smoke_failure="rank 1 died", container="llamafactory-x"
    )
    assert report["problems"] == 3
    assert report["lines"][0] == "doctor: 3 problem(s) found"
    assert "- smoke-test-failed: rank 1 died" in report["lines"]
    assert any("in the logs of llamafactory-x" in line for line in report["lines"])
    busy = doctor_report([], running=True, container="llamafactory-x")
    assert busy["problems"] == 0 and "llamafactory-x is running" in busy["lines"][1]


def test_positional_options_are_refused():
    with pytest.raises(TypeError):
        doctor_report([FINDING], [LOG], "rank 1 died")


def test_the_call_site_binds(call_sites):
    for _where, positional, keywords in call_sites("doctor_report", doctor_report):
        assert positional == 0 and "log_findings" in keywords
