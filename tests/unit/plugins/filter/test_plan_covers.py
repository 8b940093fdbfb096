"""The filter plan_covers, as the role llamafactory's first task calls it: whether the plan made
earlier in the run serves the purpose asked for, on the same nodes."""

import pytest
import yaml
from ansible_collections.hostnet.llamafactory.plugins.filter.plan_covers import (
    FilterModule,
    plan_covers,
)
from conftest import ROOT

NODES = ["vm0", "vm1"]


@pytest.mark.parametrize(
    ("made_for", "asked", "serves"),
    [
        ("train", "train", True),
        ("train", "admin", True),
        ("train", "doctor", True),
        ("admin", "doctor", True),
        ("admin", "train", False),
        ("doctor", "admin", False),
        ("doctor", "train", False),
    ],
)
def test_a_plan_serves_its_purpose_and_the_narrower_ones(made_for, asked, serves):
    plan = {"purpose": made_for, "nodes": NODES}
    assert plan_covers(plan, purpose=asked, nodes=list(reversed(NODES))) is serves


def test_no_plan_yet_or_other_nodes_serve_nothing():
    assert plan_covers(None, purpose="doctor", nodes=NODES) is False
    assert plan_covers({}, purpose="doctor", nodes=NODES) is False
    plan = {"purpose": "train", "nodes": NODES}
    assert plan_covers(plan, purpose="doctor", nodes=["vm0"]) is False  # a --limit


def test_the_role_ends_on_it_before_it_plans():
    tasks = yaml.safe_load((ROOT / "roles/llamafactory/tasks/main.yml").read_text())
    first = tasks[0]
    assert first["ansible.builtin.meta"] == "end_role"
    assert (
        "hostnet.llamafactory.plan_covers(purpose=llamafactory_purpose,"
        " nodes=ansible_play_hosts_all)" in (" ".join(first["when"].split()))
    )
    assert FilterModule().filters() == {"plan_covers": plan_covers}
