"""The filter preflight_reports: every node's report and facts read from what the preflight
registered on each node (hostvars, a mapping of host to its variables, as Ansible gives it)."""

import pytest
from ansible_collections.hostnet.llamafactory.plugins.filter.preflight_reports import (
    FilterModule,
    preflight_reports,
)

REPORT = {"targets": [], "source": "10.0.0.3"}


def _nic(address, profile="socket"):
    return {
        "address": address,
        "interface": "ens4",
        "mtu": 1460,
        "method": "route",
        "network_profile": {"profile": profile, "machine_type": "g2-standard-8", "problems": []},
    }


def _gathered_read():
    return {
        "report": REPORT,
        "error": "",
        "listener": {"state": "exited", "exit_code": 0},
        "container": {"state": "gathered"},
        "log_lines": [],
    }


def _cluster():
    """Rank 0 gathered vm1's report; vm2's did not reach it and vm2 was read by itself."""
    skipped = {"skipped": True, "changed": False}
    gathered = {
        "changed": True,
        "report": {"source": "10.0.0.2"},
        "error": "",
        "listener": {"state": "exited", "exit_code": 0},
        "gathered": {"vm1": _gathered_read()},
    }
    common = {"preflight_gathered": gathered, "preflight_probe_start": {"changed": True}}
    return {
        "vm0": dict(
            common, preflight_probe=skipped, discover_network_rank="0", primary_nic=_nic("10.0.0.2")
        ),
        "vm1": dict(
            common, preflight_probe=skipped, discover_network_rank="1", primary_nic=_nic("10.0.0.3")
        ),
        "vm2": dict(
            common,
            discover_network_rank="2",
            primary_nic=_nic("10.0.0.4"),
            preflight_probe={
                "changed": True,
                "report": None,
                "error": "no report",
                "listener": {"state": "exited", "exit_code": 1},
            },
        ),
    }


def test_each_node_is_read_from_rank_0_or_by_itself():
    read = preflight_reports(
        ["vm0", "vm1", "vm2"], hostvars=_cluster(), master="vm0", host_network=True
    )
    assert read["reports"]["vm0"]["report"] == {"source": "10.0.0.2"}
    assert read["reports"]["vm1"]["report"] == REPORT
    assert read["reports"]["vm2"]["error"] == "no report"
    assert read["reports"]["vm2"]["listener"] == {"state": "exited", "exit_code": 1, "error": ""}
    assert [read["nodes"][host]["rank"] for host in ("vm0", "vm1", "vm2")] == [0, 1, 2]
    assert read["nodes"]["vm1"] == {
        "rank": 1,
        "address": "10.0.0.3",
        "interface": "ens4",
        "mtu": 1460,
        "method": "route",
        "profile": "socket",
        "machine_type": "g2-standard-8",
        "profile_problems": [],
        "placement": None,
    }
    for report in read["reports"].values():
        assert (
            report["gpu_health"],
            report["rxdm"],
            report["missing_mounts"],
            report["missing_network"],
        ) == (None, None, [], [])


def test_a_probe_that_did_not_start_is_named_with_the_start_error():
    hostvars = _cluster()
    hostvars["vm1"]["preflight_probe_start"] = {"failed": True, "msg": "port 29500 is taken"}
    read = preflight_reports(["vm0", "vm1"], hostvars=hostvars, master="vm0", host_network=True)
    assert read["reports"]["vm1"]["error"] == "port 29500 is taken"
    assert read["reports"]["vm1"]["listener"]["error"] == "port 29500 is taken"
    hostvars["vm1"]["preflight_probe_start"] = {"failed": True}
    read = preflight_reports(["vm1"], hostvars=hostvars, master="vm0", host_network=True)
    assert read["reports"]["vm1"]["error"] == "the probe did not start"


def test_host_checks_gpu_health_and_tcpxo_are_carried():
    hostvars = _cluster()
    hostvars["vm1"].update(
        primary_nic=_nic("10.0.0.3", profile="tcpxo"),
        preflight_gpu_health_result={"findings": []},
        preflight_probe_start={
            "changed": True,
            "host_checks": {
                "rxdm": {"container": {"state": "running"}, "log_lines": ["up"]},
                "missing_paths": [
                    {"path": "/mnt/data"},
                    {"path": "/dev/aperture_devices", "kind": "device"},
                ],
            },
        },
        gcp_name="vm1",
    )
    read = preflight_reports(["vm1"], hostvars=hostvars, master="vm0", host_network=True)
    report = read["reports"]["vm1"]
    assert report["gpu_health"] == {"findings": []}
    assert report["rxdm"] == {"state": "running", "log_lines": ["up"]}
    assert report["missing_mounts"] == ["/mnt/data"]
    assert report["missing_network"] == [{"path": "/dev/aperture_devices", "kind": "device"}]
    assert read["nodes"]["vm1"]["profile"] == "tcpxo"
    assert read["nodes"]["vm1"]["placement"] == []  # a GCP VM in no placement policy
    hostvars["vm1"]["gcp_resourcePolicies"] = ["projects/p/regions/r/resourcePolicies/compact"]
    assert preflight_reports(["vm1"], hostvars=hostvars, master="vm0", host_network=True)["nodes"][
        "vm1"
    ]["placement"] == ["projects/p/regions/r/resourcePolicies/compact"]


def test_the_gpu_health_is_read_from_its_wait_or_from_a_start_that_failed():
    """The check runs in the background (async): its wait (async_status) carries the module's
    result; one that could not start gives its start's result, one past its time a failure."""
    hostvars = _cluster()
    done = {"started": 1, "finished": 1, "findings": [], "ansible_job_id": "j1"}
    hostvars["vm1"].update(
        preflight_gpu_health_job={"started": 1}, preflight_gpu_health_result=done
    )

    def health():
        read = preflight_reports(["vm1"], hostvars=hostvars, master="vm0", host_network=True)
        return read["reports"]["vm1"]["gpu_health"]

    assert health() == done
    hostvars["vm1"]["preflight_gpu_health_result"] = {"started": 1, "finished": 0, "failed": True}
    assert health()["msg"] == "it did not end within its time" and health()["failed"]
    hostvars["vm1"].update(
        preflight_gpu_health_job={"failed": True, "msg": "async_wrapper: no python"},
        preflight_gpu_health_result={"skipped": True, "changed": False},
    )
    assert health() == {"failed": True, "msg": "async_wrapper: no python"}


def test_a_failed_start_still_gives_its_host_checks():
    hostvars = _cluster()
    hostvars["vm1"]["preflight_probe_start"] = {
        "failed": True,
        "msg": "port 29500 is taken",
        "host_checks": {"missing_paths": [{"path": "/mnt/data"}], "rxdm": None},
    }
    report = preflight_reports(["vm1"], hostvars=hostvars, master="vm0", host_network=True)[
        "reports"
    ]["vm1"]
    assert (report["error"], report["missing_mounts"]) == ("port 29500 is taken", ["/mnt/data"])


def test_bridge_networking_is_the_socket_profile_and_rxdm_is_not_looked_at():
    hostvars = _cluster()
    hostvars["vm1"]["primary_nic"] = _nic("10.0.0.3", profile="tcpxo")
    read = preflight_reports(["vm1"], hostvars=hostvars, master="vm0", host_network=False)
    assert read["nodes"]["vm1"]["profile"] == "socket"
    assert read["reports"]["vm1"]["rxdm"] is None


def test_the_registered_results_are_not_changed():
    hostvars = _cluster()
    preflight_reports(["vm0", "vm1", "vm2"], hostvars=hostvars, master="vm0", host_network=True)
    assert hostvars == _cluster()


def test_options_are_by_name_and_the_call_site_binds(call_sites):
    with pytest.raises(TypeError):
        preflight_reports(["vm0"], _cluster(), "vm0", True)  # pylint: disable=missing-kwoa
    assert FilterModule().filters() == {"preflight_reports": preflight_reports}
    assert [
        where
        for where, _positional, _keywords in call_sites("preflight_reports", preflight_reports)
    ] == ["roles/preflight/tasks/probe.yml"]
