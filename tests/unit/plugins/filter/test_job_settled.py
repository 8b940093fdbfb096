"""The filter job_settled: options by name only, and its one call (the launch's settled.yml).
What it decides is tested on plugin_utils/_job_state.settled (test__job_state.py)."""

import pytest
from ansible_collections.hostnet.llamafactory.plugins.filter.job_settled import job_settled
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _job_state
from job_captures import DIGEST_DEMO_RANK0, report

RANKS = {"vm0": 0, "vm1": 1}


def test_rank_0s_recorded_finish_gives_every_ranks_report_and_address():
    read = report("exited-0", 0)
    read["record"] = {
        "job": "demo",
        "container": _job_state.record_of(read),
        "ranks": RANKS,
        "addresses": {"vm0": "10.0.0.2", "vm1": "10.0.0.3"},
    }
    found = job_settled(read, digest=DIGEST_DEMO_RANK0, job="demo", ranks=RANKS, host="vm0")
    assert found["addresses"] == {"vm0": "10.0.0.2", "vm1": "10.0.0.3"}
    assert found["reports"]["vm1"]["container"] == {"state": "exited", "exit_code": 0}
    assert job_settled(read, digest="other", job="demo", ranks=RANKS, host="vm0") == {}


def test_positional_options_are_refused():
    with pytest.raises(TypeError):
        job_settled({}, "digest", "demo", RANKS, "vm0")  # pylint: disable=missing-kwoa


def test_the_call_site_binds(call_sites):
    assert [where for where, _positional, _keywords in call_sites("job_settled", job_settled)] == [
        "roles/launch/tasks/settled.yml"
    ]
