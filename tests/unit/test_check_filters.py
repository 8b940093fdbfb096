"""Filters behind the up-front checks: address_kind (MASTER_ADDR) and unknown_vars (typos)."""

from pathlib import Path

import pytest
import yaml
from ansible_collections.hostnet.llamafactory.plugins.filter.address_kind import address_kind
from ansible_collections.hostnet.llamafactory.plugins.filter.unknown_vars import unknown_vars

ROOT = Path(__file__).resolve().parents[2]


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
    ]
    known = ["llamafactory_gpus_per_node", "launch_wait_timeout", "llamafactory_job"]
    assert unknown_vars(names, known, ignore=["launch_plan", "launch_wait_result"]) == {
        "llamafactory_gpu_per_node": "llamafactory_gpus_per_node",
        "launch_wait_timout": "launch_wait_timeout",
        "launch_zzz": "",
    }


def test_the_typo_check_reads_every_roles_argument_specs():
    roles = yaml.safe_load((ROOT / "roles/launch/vars/main.yml").read_text())
    listed = sorted(roles["launch_collection_roles"])
    on_disk = sorted(p.parent.parent.name for p in ROOT.glob("roles/*/meta/argument_specs.yml"))
    assert listed == on_disk, "add the new role to launch_collection_roles (roles/launch/vars)"
