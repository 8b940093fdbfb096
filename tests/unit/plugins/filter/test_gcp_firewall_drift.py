"""The filter gcp_firewall_drift as roles/gcp_firewall/tasks/firewall.yml calls it: the plan
against the rules that the list call (gcp_compute_firewall_info with the plan's list_filter)
returns, here from the fake Compute Engine API - as the API stores what the role wrote, and as
someone changed it behind the role's back."""

import pytest
from ansible_collections.hostnet.llamafactory.plugins.filter.gcp_firewall_drift import (
    FilterModule,
    gcp_firewall_drift,
)
from ansible_collections.hostnet.llamafactory.plugins.filter.gcp_firewall_plan import (
    gcp_firewall_plan,
)

NODES_RANGES = ["10.128.0.5/32", "10.128.0.6/32"]


def read(compute, plan):
    """gcp_compute_firewall_info's `resources`: the list call with the plan's filter."""
    url = f"{compute.base}/global/firewalls"
    answer = compute.api.get(url, params={"filter": plan["list_filter"]})
    answer.raise_for_status()
    return answer.json().get("items", [])


def apply(compute, drift):
    """What firewall.yml's loops write for create (the rule's `want`, as the module sends it)."""
    for rule in drift["rules"]:
        assert rule["action"] in ("create", "none"), rule
        if rule["action"] == "create":
            answer = compute.api.post(f"{compute.base}/global/firewalls", json=rule["want"])
            answer.raise_for_status()


def edit(compute, resource, **fields):
    """A rule changed in the console, behind the role's back."""
    url = f"{compute.control}/firewalls/hlf-test/{resource['name']}"
    compute.session.put(url, json=dict(resource, **fields)).raise_for_status()


@pytest.fixture
def plan(firewall_settings):
    return gcp_firewall_plan(firewall_settings(ssh_source_ranges=["203.0.113.0/24"]))


def test_a_fresh_project_gets_the_rules_and_a_second_run_changes_nothing(compute, plan):
    drift = gcp_firewall_drift(plan, read(compute, plan))
    assert drift["changed"] is True and drift["foreign"] == []
    assert drift["summary"] == [
        "llamafactory-nodes: create (allow icmp:all, tcp:0-65535, udp:0-65535 from "
        "10.128.0.5/32, 10.128.0.6/32 on network default)",
        "llamafactory-ssh: create (allow tcp:22 from 203.0.113.0/24 on network default)",
    ]
    apply(compute, drift)
    # As the API stores them (kind, id, selfLink, logConfig...), the rules are the plan's.
    again = gcp_firewall_drift(plan, read(compute, plan))
    assert [r["action"] for r in again["rules"]] == ["none", "none"]
    assert again["changed"] is False
    assert again["summary"] == ["llamafactory-nodes: no change", "llamafactory-ssh: no change"]


def test_a_rule_changed_behind_the_roles_back_is_put_back(compute, plan):
    apply(compute, gcp_firewall_drift(plan, read(compute, plan)))
    nodes = next(r for r in read(compute, plan) if r["name"] == "llamafactory-nodes")
    edit(compute, nodes, priority=900)
    drift = gcp_firewall_drift(plan, read(compute, plan))
    assert drift["summary"][0] == "llamafactory-nodes: update (priority: 900, wanted 1000)"
    # A source added by hand: the module would not notice it (it checks only the wanted ones).
    edit(compute, nodes, sourceRanges=[*NODES_RANGES, "10.128.0.9/32"])
    drift = gcp_firewall_drift(plan, read(compute, plan))
    assert drift["rules"][0]["action"] == "narrow" and drift["changed"] is True
    assert "10.128.0.9/32" in drift["summary"][0]


def test_a_rule_of_that_name_without_the_clusters_mark_is_left_alone(compute, plan):
    apply(compute, gcp_firewall_drift(plan, read(compute, plan)))
    nodes = next(r for r in read(compute, plan) if r["name"] == "llamafactory-nodes")
    edit(compute, nodes, description="made by hand", priority=500)
    drift = gcp_firewall_drift(plan, read(compute, plan))
    assert drift["foreign"] == ["llamafactory-nodes"]
    assert drift["rules"][0]["action"] == "foreign" and drift["changed"] is False


def test_cleanup_deletes_the_clusters_rules(compute, plan, firewall_settings):
    apply(compute, gcp_firewall_drift(plan, read(compute, plan)))
    # cleanup.yml: state absent, no addresses (no discovery ran).
    absent = gcp_firewall_plan(firewall_settings(state="absent", nodes={}))
    drift = gcp_firewall_drift(absent, read(compute, absent))
    assert [(r["name"], r["action"]) for r in drift["rules"]] == [
        ("llamafactory-nodes", "delete"),
        ("llamafactory-ssh", "delete"),
    ]
    assert drift["changed"] is True


def test_no_resources_is_an_empty_project(plan):
    assert gcp_firewall_drift(plan, None) == gcp_firewall_drift(plan, [])


def test_the_call_site_binds(call_sites):
    assert FilterModule().filters()["gcp_firewall_drift"] is gcp_firewall_drift
    assert call_sites("gcp_firewall_drift", gcp_firewall_drift) == [
        ("roles/gcp_firewall/tasks/firewall.yml", 1, [])
    ]
