"""The Hub model's progress line and failures (plugins/plugin_utils/_hub_report.py)."""

import pytest
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _hub_report as report

REPO = {"repo_id": "meta-llama/Meta-Llama-3-8B-Instruct", "revision": "main"}


def test_progress_reads_like_the_pull():
    state = {"received": 1_200_000_000, "total": 16_000_000_000, "before": 200_000_000}
    assert report.describe(state, elapsed=10) == "1.2 GB of 16.0 GB (7%), 100.0 MB/s, 10 s"
    assert report.describe({"received": 0}) == "0 B"


@pytest.mark.parametrize(
    "kind, fragments",
    [
        ("not-found", ["is not a model on the Hub at https://huggingface.co", "check the id"]),
        ("gated", ["is gated", "accept the licence", "llamafactory_hf_token"]),
        ("revision", ["has no revision 'main'", "model_revision"]),
        ("token", ["refused the token (llamafactory_hf_token)"]),
        ("unreachable", ["cannot reach the Hub", "llamafactory_hf_endpoint"]),
        ("source", ["preflight_port", "doctor.yml"]),
        ("odd", ["a run again resumes"]),
    ],
)
def test_each_failure_names_its_fix(kind, fragments):
    message = report.failure("download", REPO, "", {"kind": kind, "error": "E"}, "vm0")
    assert message.startswith(f"downloading {REPO['repo_id']} failed (hub-{kind}): E\nCause: ")
    for fragment in fragments:
        assert fragment in message


def test_a_mirror_is_named():
    message = report.failure("download", REPO, "http://mirror:8080", {"kind": "unreachable"}, "vm0")
    assert "at http://mirror:8080" in message
