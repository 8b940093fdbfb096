"""The node ranks behind validate_job's checks (plugins/plugin_utils/_node_ranks.py): group
order, explicit ranks, and every bad set of ranks named (moved from the filter node_ranks)."""

import pytest
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._node_ranks import node_ranks


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
