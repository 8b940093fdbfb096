"""./dev gpu-check's parts that need no GPU: it runs with the standard library only (no
ansible-core: Python started with -S, no site-packages), finds this machine's NIC with
primary_nic's code, reports the NCCL steps as skipped where PyTorch cannot run them, and judges
GPU health from nvidia-smi's and the kernel's output. nvidia-smi and dmesg are stand-ins here
(no GPU on this machine): shell scripts that print real captures
(tests/unit/fixtures/gpu_health, sources in its SOURCES.md)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "gpu_health"


def fake_tools(folder: Path, xml: str, dmesg: str | None) -> dict:
    folder.mkdir()
    smi = folder / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  -q) cat {FIXTURES / xml} ;;\n"
        f"  --query-gpu=*) cat {FIXTURES / 'h100-80gb-hbm3-590.48.01.query-gpu.csv'} ;;\n"
        "  *) exit 2 ;;\n"
        "esac\n"
    )
    kernel = folder / "dmesg"
    if dmesg is None:  # as for a user without the right to read it
        kernel.write_text(
            "#!/bin/sh\n"
            "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2\n"
            "exit 1\n"
        )
    else:
        kernel.write_text(f"#!/bin/sh\ncat {FIXTURES / dmesg}\n")
    for tool in (smi, kernel):
        tool.chmod(0o755)
    # journalctl is the fallback when dmesg fails: keep it out of PATH.
    return {**os.environ, "PATH": f"{folder}:/usr/sbin:/sbin:/usr/bin:/bin"}


def gpu_check(tmp_path: Path, env: dict) -> tuple[int, dict, str]:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-S", str(ROOT / "tools" / "gpu_check.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    summary = json.loads((out / "summary.json").read_text())
    return done.returncode, {s["name"]: s for s in summary["steps"]}, done.stdout + done.stderr


def test_a_healthy_gpu_without_pytorch(tmp_path):
    env = fake_tools(tmp_path / "bin", "a10g-515.105.01.xml", dmesg="kernel-xid.log")
    rc, steps, output = gpu_check(tmp_path, env)
    nic = json.loads((tmp_path / "out" / "primary_nic.json").read_text())
    assert steps["primary_nic"]["status"] == "passed", output
    assert steps["primary_nic"]["detail"].startswith(f"{nic['interface']} {nic['address']}/")
    assert nic["network_profile"]["profile"] == "socket"
    for name in ("nccl-good-nic", "nccl-missing-nic", "smoke-test-nccl"):
        assert steps[name]["status"] == "skipped"
        assert "PyTorch is not importable" in steps[name]["detail"]  # -S: no site-packages
    # The capture is healthy; the kernel log holds Xid 79/94/95: errors, so the step fails.
    health = steps["gpu-health"]
    assert health["status"] == "failed" and rc == 1
    ids = [f["id"] for f in health["findings"]]
    assert ids == ["persistence-off", *(["xid-13"] * 3), "xid-109", "xid-79", "xid-94", "xid-95"]
    assert "driver 515.105.01 (CUDA 11.7)" in health["detail"]
    assert "kernel log read" in health["detail"]
    out = tmp_path / "out"
    assert (out / "nvidia-smi-q-x.xml").read_text() == (
        FIXTURES / "a10g-515.105.01.xml"
    ).read_text()
    assert len((out / "kernel-xid.log").read_text().splitlines()) == 7


def test_an_unreadable_kernel_log_is_reported_unread(tmp_path):
    env = fake_tools(tmp_path / "bin", "tesla-t4-515.105.01.xml", dmesg=None)
    rc, steps, _output = gpu_check(tmp_path, env)
    health = steps["gpu-health"]
    assert "kernel log unread" in health["detail"]
    assert [f["id"] for f in health["findings"]] == ["persistence-off", "kernel-log-unread"]
    assert health["status"] == "passed" and rc == 0  # warnings only; no step failed


def test_a_gpu_with_ecc_errors_fails(tmp_path):
    env = fake_tools(tmp_path / "bin", "v100-sxm3-32gb-410.104.xml", dmesg=None)
    rc, steps, output = gpu_check(tmp_path, env)
    assert rc == 1
    assert "ecc-uncorrected (error)" in steps["gpu-health"]["detail"]
    assert "gpu-health        failed" in output
