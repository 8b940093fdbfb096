"""The filter preflight_targets: options by name only, and its call in the launch role."""

import pytest
from ansible_collections.hostnet.llamafactory.plugins.filter.preflight_targets import (
    FilterModule,
    preflight_targets,
)

ADDRESSES = {"vm0": "10.0.0.2", "vm1": "10.0.0.3"}
OPTIONS = {
    "hosts": ["vm0", "vm1"],
    "addresses": ADDRESSES,
    "master": "vm0",
    "master_addr": "10.0.0.2",
    "master_port": "29500",
    "probe_port": "49500",
}


def test_a_worker_probes_the_peers_high_port_and_the_master_port():
    assert preflight_targets("vm1", **OPTIONS) == [
        {"node": "vm0", "address": "10.0.0.2", "port": 49500},
        {"node": "vm0", "address": "10.0.0.2", "port": 29500},
    ]
    assert preflight_targets("vm0", **OPTIONS) == [
        {"node": "vm1", "address": "10.0.0.3", "port": 49500}
    ]


def test_positional_options_are_refused():
    with pytest.raises(TypeError):
        preflight_targets(  # pylint: disable=missing-kwoa
            "vm1", ["vm0", "vm1"], ADDRESSES, "vm0", "10.0.0.2", 29500, 49500
        )


def test_the_call_sites_name_every_option(call_sites):
    for _where, positional, keywords in call_sites("preflight_targets", preflight_targets):
        assert positional == 0
        assert sorted(keywords) == sorted(OPTIONS)
    assert FilterModule().filters()["preflight_targets"] is preflight_targets
