"""The filter diagnose as playbooks/doctor.yml calls it: every play host's job_status log lines,
joined, by host (a host without a report gives ''), on logs recorded in real failures
(tests/unit/fixtures/logs); its findings go on to doctor_report."""

from pathlib import Path

from ansible_collections.hostnet.llamafactory.plugins.filter.diagnose import FilterModule
from ansible_collections.hostnet.llamafactory.plugins.filter.doctor_report import doctor_report

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
diagnose = FilterModule().filters()["diagnose"]


def job_status(log):
    """job_status's result (tail 2000) for a rank whose output is fixtures/logs/LOG.log."""
    lines = (LOGS / f"{log}.log").read_text().splitlines()
    return {"changed": False, "container": {"state": "exited", "exit_code": 1}, "log_lines": lines}


def doctor_input(results):
    """doctor.yml's `dict(ansible_play_hosts | zip(... log_lines | default([], true) | join))`: a
    skipped or missing report (no preflight_doctor_target) counts as no lines."""
    return {host: "\n".join((r or {}).get("log_lines") or []) for host, r in results.items()}


def test_each_finding_names_the_host_whose_log_shows_it():
    results = {
        "vm0": job_status("bridge-nccl"),
        "vm1": job_status("gloo-loopback"),
        "vm2": {"skipped": True},
    }
    findings = diagnose(doctor_input(results))
    assert [(f["id"], f["host"]) for f in findings] == [
        ("bridge-address", "vm0"),
        ("gloo-loopback", "vm1"),
    ]
    assert findings[0]["line"] in results["vm0"]["log_lines"]
    assert "172.17.0.2" in findings[0]["cause"] and "host networking" in findings[0]["fix"]


def test_two_hosts_logging_one_node_rank_are_found_together():
    findings = diagnose(doctor_input({"vm0": job_status("rank0-a"), "vm1": job_status("rank0-b")}))
    assert [(f["id"], f["host"]) for f in findings] == [("duplicate-node-rank", "vm0, vm1")]
    assert "NODE_RANK" in findings[0]["fix"]
    # One host alone at rank 0 is no finding.
    assert diagnose(doctor_input({"vm0": job_status("rank0-a"), "vm1": None})) == []


def test_no_report_and_clean_logs_find_nothing():
    assert diagnose(doctor_input({"vm0": None, "vm1": {"skipped": True}})) == []
    clean = {"log_lines": ["[INFO] training step 5/5, loss 2.31"]}
    assert diagnose(doctor_input({"vm0": clean})) == []


def test_the_findings_make_the_doctors_report():
    findings = diagnose(
        doctor_input({"vm0": job_status("no-route"), "vm1": job_status("peer-lost")})
    )
    report = doctor_report([], log_findings=findings, container="llamafactory-demo")
    assert report["problems"] == 2 == len(findings)
    assert report["lines"][0] == "doctor: 2 problem(s) found"
    assert report["lines"][1].startswith("- no-route (vm0, in the logs of llamafactory-demo): ")
    assert report["lines"][2].startswith("- peer-lost (vm1, in the logs of llamafactory-demo): ")


def test_the_call_site_binds(call_sites):
    assert call_sites("diagnose", diagnose) == [("roles/preflight/tasks/doctor.yml", 0, [])]
