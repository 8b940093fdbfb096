"""The filter gcp_firewall_plan as roles/gcp_firewall/tasks/main.yml calls it: the role's settings
from its defaults (defaults/main.yml), the nodes' discovered addresses and MASTER_PORT; values as
Jinja hands them over (strings from extra vars); a refusal is an Ansible filter error that names
the variable and the fix."""

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.hostnet.llamafactory.plugins.filter.gcp_firewall_plan import (
    FilterModule,
    gcp_firewall_plan,
)

DESCRIPTION = (
    "hostnet.llamafactory cluster llamafactory: all TCP/UDP and ICMP between its training nodes "
    "(role gcp_firewall)"
)


def test_the_roles_defaults_open_the_nodes_to_each_other_only(firewall_settings):
    plan = gcp_firewall_plan(firewall_settings())
    assert (plan["project"], plan["cluster"], plan["state"]) == (
        "hlf-test",
        "llamafactory",
        "present",
    )
    nodes, ssh = plan["rules"]
    assert nodes["params"] == {
        "name": "llamafactory-nodes",
        "description": DESCRIPTION,
        "direction": "INGRESS",
        "priority": 1000,
        "network": {"selfLink": "global/networks/default"},
        "allowed": [
            {"ip_protocol": "tcp", "ports": ["0-65535"]},
            {"ip_protocol": "udp", "ports": ["0-65535"]},
            {"ip_protocol": "icmp"},
        ],
        "disabled": False,
        "source_ranges": ["10.128.0.5/32", "10.128.0.6/32"],
    }
    assert nodes["want"]["network"] == (
        "https://www.googleapis.com/compute/v1/projects/hlf-test/global/networks/default"
    )
    assert ssh == {"name": "llamafactory-ssh", "role": "ssh", "state": "absent"}
    # The list call finds every rule of the cluster; nothing is pruned while NICs are unknown.
    assert plan["list_filter"] == 'name eq "(?:llamafactory-ssh|llamafactory-nodes[-a-z0-9]*)"'
    assert plan["prune"] is False


def test_values_from_extra_vars_come_as_strings(firewall_settings):
    settings = firewall_settings(
        priority="900", master_port="29500", ssh_source_ranges=["203.0.113.0/24"]
    )
    nodes, ssh = gcp_firewall_plan(settings)["rules"]
    assert nodes["params"]["priority"] == ssh["params"]["priority"] == 900
    assert ssh["state"] == "present"
    assert ssh["params"]["allowed"] == [{"ip_protocol": "tcp", "ports": ["22"]}]
    assert ssh["params"]["source_ranges"] == ["203.0.113.0/24"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"source": "ranges", "ranges": ["0.0.0.0/0"]},
            "gcp_firewall_ranges contains 0.0.0.0/0: refused. That source is the whole internet",
        ),
        (
            {"ssh_source_ranges": ["0/0"]},
            "gcp_firewall_ssh_source_ranges contains '0/0', which is not an address range",
        ),
        (
            # A node whose discovery did not run (none in discover_network_addresses).
            {"nodes": {"trainer-0": None, "trainer-1": "10.128.0.6"}},
            "the internal address of trainer-0 is not known (discover_network_addresses): run the "
            "role "
            "discover_network",
        ),
        ({"cluster": "LlamaFactory"}, "gcp_firewall_cluster_name is 'LlamaFactory'"),
    ],
)
def test_a_refusal_is_a_filter_error_naming_the_variable(firewall_settings, changes, message):
    with pytest.raises(AnsibleFilterError) as error:
        gcp_firewall_plan(firewall_settings(**changes))
    assert str(error.value).startswith(message)
    assert error.value.__suppress_context__  # the message alone, not the plan's exception


def test_a_refusal_is_returned_for_a_task_of_its_own_to_fail_with(firewall_settings):
    refused = firewall_settings(source="ranges", ranges=["0.0.0.0/0"])
    returned = gcp_firewall_plan(refused, errors="return")
    assert list(returned) == ["error"]
    error = returned["error"]
    assert error.startswith("gcp_firewall_ranges contains 0.0.0.0/0: refused.")
    with pytest.raises(AnsibleFilterError) as raised:
        gcp_firewall_plan(refused)
    assert str(raised.value) == error
    # Settings the plan accepts: the plan, as without the option.
    assert gcp_firewall_plan(firewall_settings(), errors="return") == gcp_firewall_plan(
        firewall_settings()
    )
    with pytest.raises(AnsibleFilterError, match="errors must be raise or return, not 'ignore'"):
        gcp_firewall_plan(firewall_settings(), errors="ignore")


def test_no_settings_is_refused_by_name_not_by_a_crash():
    with pytest.raises(AnsibleFilterError, match="gcp_firewall_cluster_name is None"):
        gcp_firewall_plan(None)


def test_the_call_site_binds(call_sites):
    assert FilterModule().filters()["gcp_firewall_plan"] is gcp_firewall_plan
    assert call_sites("gcp_firewall_plan", gcp_firewall_plan) == [
        ("roles/gcp_firewall/tasks/main.yml", 0, ["errors"])
    ]
