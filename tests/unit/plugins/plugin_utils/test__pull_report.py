"""How the controller words a pull (plugins/plugin_utils/_pull_report.py): progress lines from
the progress of the pulls captured on the local cluster (tests/unit/fixtures/image_pull, see its
README), and the cause and fix of each error the daemon gave there."""

import json
from pathlib import Path

import pytest
from ansible_collections.hostnet.llamafactory.plugins.module_utils._image_pull import PullProgress
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _pull_report as pull

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "image_pull"
REGISTRY = "198.18.96.5:5000"


def events(name):
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]


def test_lines_of_a_two_layer_pull():
    progress = PullProgress()
    lines = set()
    for event in events("pulled-two-layers.jsonl"):
        progress.feed(event)
        lines.add(pull.describe(progress.snapshot()))
    assert pull.describe(progress.snapshot(), elapsed=55) == "761.0 MB, 2 of 2 layers, 55 s"
    assert any("(" in line and "%)" in line and "of 2 layers" in line for line in lines)
    assert any("extracted" in line for line in lines)


def test_lines_midway_show_bytes_rate_and_extraction():
    stream = events("pulled-two-layers.jsonl")
    progress = PullProgress()
    first_download = next(i for i, e in enumerate(stream) if e.get("status") == "Downloading")
    for event in stream[: first_download + 40]:
        progress.feed(event)
    line = pull.describe(progress.snapshot(), elapsed=3, rate=98.4e6)
    assert " of " in line and "%)" in line and "98.4 MB/s" in line and line.endswith("3 s")
    last_extract = max(i for i, e in enumerate(stream) if e.get("status") == "Extracting")
    progress = PullProgress()
    for event in stream[:last_extract]:
        progress.feed(event)
    line = pull.describe(progress.snapshot(), rate=1e6)
    assert "extracted" in line and "MB/s" not in line  # no download rate once downloaded


def test_lines_before_anything_is_known():
    assert pull.describe({}) == "contacting the registry"
    assert pull.describe({"layers": 2}, elapsed=1) == "starting, 0 of 2 layers, 1 s"


@pytest.mark.parametrize(
    ("fixture", "cause", "fix"),
    [
        ("wrong-password.jsonl", "refused the credentials", "llamafactory_registry_password"),
        ("no-credentials.jsonl", "refused the credentials", "llamafactory_registry_username"),
        ("unknown-tag.jsonl", "does not exist in 198.18.96.5:5000", "llamafactory_image"),
        ("unknown-repository.jsonl", "does not exist", "llamafactory_image"),
        ("untrusted-certificate.jsonl", "does not trust", "certs.d/198.18.96.5:5000/ca.crt"),
        ("connection-refused.jsonl", "cannot reach 198.18.96.5:5001", "firewall"),
    ],
)
def test_errors_are_explained(fixture, cause, fix):
    (event,) = events(fixture)
    image = "198.18.96.5:5001/team/blank:v1" if "refused" in fixture else f"{REGISTRY}/team/x:v"
    found_cause, found_fix = pull.explain(event["error"], image)
    assert cause in found_cause
    assert fix in found_fix


def test_unknown_error_is_not_explained():
    assert pull.explain("something new", "img") == (None, None)


@pytest.mark.parametrize(
    ("count", "text"), [(0, "0 B"), (999, "999 B"), (1500, "2 kB"), (2.5e9, "2.5 GB")]
)
def test_human_bytes(count, text):
    assert pull.human_bytes(count) == text
