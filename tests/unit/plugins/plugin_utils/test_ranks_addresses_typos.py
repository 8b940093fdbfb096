"""The helpers behind validate_job's checks: node ranks, MASTER_ADDR kinds, typo detection
(moved from the filters node_ranks, address_kind and unknown_vars)."""

import pytest
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._address_kind import (
    address_kind,
)
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._node_ranks import node_ranks
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._unknown_vars import (
    unknown_vars,
)


def test_group_order_when_no_rank_is_set():
    assert node_ranks(["b", "a", "c"], {}) == ({"b": 0, "a": 1, "c": 2}, [])


def test_explicit_ranks_win_over_order():
    assert node_ranks(["a", "b"], {"a": 1, "b": "0"}) == ({"a": 1, "b": 0}, [])


@pytest.mark.parametrize(
    ("hosts", "given", "message"),
    [
        ([], {}, "no training hosts"),
        (["a", "b"], {"a": 0}, "set on a but not on b"),
        (["a", "b"], {"a": 0, "b": 0}, "unique; shared: 0 (a, b)"),
        (["a", "b"], {"a": 0, "b": 2}, "from 0 to 1 without gaps"),
        (["a", "b"], {"a": 1, "b": 2}, "from 0 to 1 without gaps"),
        (["a", "b"], {"a": 0, "b": "one"}, "llamafactory_node_rank of b is 'one'"),
        (["a", "b"], {"a": 0, "b": 1.5}, "must be an integer"),
        (["a", "b"], {"a": 0, "b": True}, "must be an integer"),
    ],
)
def test_bad_ranks(hosts, given, message):
    ranks, problems = node_ranks(hosts, given)
    assert ranks == {}
    assert any(message in p for p in problems), problems


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("10.128.0.5", "private"),  # a GCP VPC address
        ("192.168.1.4", "private"),
        ("172.16.0.9", "private"),  # 172.16/16 is not one of Docker's default pools
        ("198.18.0.10", "private"),  # the local cluster's VPC
        ("100.64.3.1", "private"),
        ("fd00::5", "private"),
        ("172.17.0.2", "bridge"),  # the classic failure
        ("172.31.255.1", "bridge"),
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("34.120.0.5", "public"),  # an external IP
        ("2001:4860::1", "public"),
        ("203.0.113.10", "other"),  # documentation range: neither routed nor private
        ("eth0", "invalid"),
        ("", "invalid"),
    ],
)
def test_address_kind(address, kind):
    assert address_kind(address) == kind


def test_unknown_vars_suggests_only_settings():
    names = [
        "llamafactory_gpu_per_node",
        "launch_wait_timout",
        "launch_plan",
        "ansible_host",
        "llamafactory_job",
        "launch_zzz",
        "preflight_timout",
        "docker_engine_sourc",
    ]
    known = [
        "llamafactory_gpus_per_node",
        "launch_wait_timeout",
        "llamafactory_job",
        "preflight_timeout",
        "docker_engine_source",
    ]
    assert unknown_vars(names, known, ignore=["launch_plan", "launch_wait_result"]) == {
        "llamafactory_gpu_per_node": "llamafactory_gpus_per_node",
        "launch_wait_timout": "launch_wait_timeout",
        "launch_zzz": "",
        "preflight_timout": "preflight_timeout",
        "docker_engine_sourc": "docker_engine_source",
    }
