"""The node_ranks filter: group order, explicit ranks, and refusals that name the fix."""

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.hostnet.llamafactory.plugins.filter.node_ranks import node_ranks


def hv(**ranks):
    return {
        host: ({} if rank is None else {"llamafactory_node_rank": rank})
        for host, rank in ranks.items()
    }


def test_group_order_when_no_rank_is_set():
    assert node_ranks(["b", "a", "c"], hv(a=None, b=None, c=None)) == {"b": 0, "a": 1, "c": 2}


def test_explicit_ranks_win_over_order():
    assert node_ranks(["a", "b"], hv(a=1, b="0")) == {"a": 1, "b": 0}


@pytest.mark.parametrize(
    ("hosts", "hostvars", "message"),
    [
        ([], {}, "no training hosts"),
        (["a", "b"], hv(a=0, b=None), "set on a but not on b"),
        (["a", "b"], hv(a=0, b=0), r"unique; shared: 0 \(a, b\)"),
        (["a", "b"], hv(a=0, b=2), "from 0 to 1 without gaps"),
        (["a", "b"], hv(a=1, b=2), "from 0 to 1 without gaps"),
        (["a", "b"], hv(a=0, b="one"), "llamafactory_node_rank of b is 'one'"),
        (["a", "b"], hv(a=0, b=1.5), "must be an integer"),
    ],
)
def test_bad_ranks(hosts, hostvars, message):
    with pytest.raises(AnsibleFilterError, match=message):
        node_ranks(hosts, hostvars)
