"""The kind of a MASTER_ADDR (plugins/plugin_utils/_address_kind.py), behind validate_job's
check of it (moved from the filter address_kind)."""

import pytest
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._address_kind import (
    address_kind,
)


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
