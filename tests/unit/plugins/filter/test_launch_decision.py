"""The filter launch_decision: options by name only, and its call in the launch role."""

import pytest
from ansible_collections.hostnet.llamafactory.plugins.filter.launch_decision import (
    launch_decision,
)


def report(rank, state, digest, code=None):
    container = {"state": state, "exit_code": code, "labels": {}}
    if digest:
        container["labels"]["hostnet.llamafactory.digest"] = digest
    return {"rank": rank, "container": container, "checkpoints": []}


def test_a_different_job_is_refused_unless_a_restart_is_allowed():
    reports = {"vm0": report(0, "running", "old"), "vm1": report(1, "running", "old")}
    refused = launch_decision(reports, digest="new", job="demo")
    assert refused["action"] == "refuse" and "launch_restart_on_change=true" in refused["why"]
    allowed = launch_decision(reports, digest="new", restart_allowed=True, job="demo")
    assert allowed["action"] == "launch" and allowed["stop_first"] == ["vm0", "vm1"]
    kept = launch_decision(reports, digest="old", job="demo")
    assert kept["action"] == "keep" and kept["why"] == "job demo is already running"


def test_positional_options_are_refused():
    with pytest.raises(TypeError):
        launch_decision({}, "digest", True, "demo")


def test_the_call_site_binds(call_sites):
    for _where, positional, keywords in call_sites("launch_decision", launch_decision):
        assert positional == 0 and "restart_allowed" in keywords
