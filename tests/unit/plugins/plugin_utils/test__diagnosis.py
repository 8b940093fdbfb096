"""The diagnosis table applied to recorded failure logs (tests/unit/fixtures/logs)."""

from pathlib import Path

import pytest
from ansible_collections.hostnet.llamafactory.plugins.filter.diagnose import FilterModule
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._diagnosis import (
    SIGNATURES,
    diagnose,
)

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def log(name: str) -> str:
    return (LOGS / f"{name}.log").read_text()


@pytest.mark.parametrize(
    ("name", "signature", "in_cause", "in_fix"),
    [
        (
            "bridge-nccl",
            "bridge-address",
            "NCCL dials 172.17.0.2, a Docker bridge address",
            "host networking",
        ),
        ("gloo-no-interface", "gloo-interface-missing", "names eth0", "llamafactory_interface"),
        ("nccl-no-interface", "nccl-interface-missing", "names no interface", "primary_nic"),
        ("gloo-loopback", "gloo-loopback", "127.0.0.1", "GLOO_SOCKET_IFNAME"),
        ("wrong-nic", "network-unreachable", "cannot reach its peers", "primary_nic"),
        ("master-unreachable", "master-unreachable", "198.19.0.10:29555", "internal address"),
        ("bridge-gloo", "gloo-bridge-address", "Gloo dials 172.17.0.2", "host networking"),
        ("peer-crashed", "peer-crashed", "198.18.0.11 went away", "first rank that failed"),
        ("peer-lost", "peer-lost", "rank 1 (198.18.32.11:39573) has not answered for 37 s", "VM"),
        ("nccl-ib-wrong-type", "nccl-ib-wrong-type", "issue #3641", "NCCL_IB_DISABLE=1"),
        ("collective-timeout", "collective-timeout", "waited past its timeout", "ddp_timeout"),
        ("no-route", "no-route", "no route to a peer", "gcp_firewall"),
    ],
)
def test_each_recorded_failure_is_named_with_its_fix(name, signature, in_cause, in_fix):
    findings = diagnose(log(name))
    assert [f["id"] for f in findings] == [signature]
    assert in_cause in findings[0]["cause"] and in_fix in findings[0]["fix"]
    assert findings[0]["line"] in log(name)


def test_two_hosts_at_node_rank_zero():
    findings = diagnose({"vm0": log("rank0-a"), "vm1": log("rank0-b")})
    assert [f["id"] for f in findings] == ["duplicate-node-rank"]
    assert "vm0, vm1 all run as node rank 0" in findings[0]["cause"]
    assert "NODE_RANK" in findings[0]["fix"]
    assert diagnose({"vm0": log("rank0-a"), "vm1": log("gloo-loopback")})[0]["id"] == (
        "gloo-loopback"
    )


def test_a_non_bridge_peer_is_a_port_problem_and_clean_logs_say_nothing():
    line = "NCCL WARN socketStartConnect: Connect to 10.128.0.6<41234> failed : Connection refused"
    (finding,) = diagnose({"vm1": line})
    assert (finding["id"], finding["host"]) == ("peer-port-blocked", "vm1")
    assert "10.128.0.6 port 41234" in finding["cause"] and "gcp_firewall" in finding["fix"]
    assert diagnose("[INFO] training step 5/5, loss 2.31") == []
    assert diagnose("") == [] and diagnose(None) == []


def test_one_finding_per_signature_and_host():
    text = log("wrong-nic") + log("wrong-nic")
    assert len(diagnose({"vm1": text})) == 1


def test_the_table_is_well_formed_and_the_filter_serves_it():
    ids = [s["id"] for s in SIGNATURES]
    assert len(ids) == len(set(ids))
    for signature in SIGNATURES:
        assert signature["cause"].strip() and signature["fix"].strip()
    assert FilterModule().filters()["diagnose"] is diagnose
