"""The module gpu_health run as Ansible runs it on a node, with stand-ins for nvidia-smi, dmesg,
journalctl and dcgmi on PATH: shell scripts that print real captures
(tests/unit/fixtures/gpu_health, sources in its SOURCES.md) or fail as the real tools do. The
parsers and rules: tests/unit/plugins/module_utils/test__gpu_health.py."""

import time
from pathlib import Path

import ansible_run
import pytest
from ansible_collections.hostnet.llamafactory.plugins.module_utils import (
    _gpu_health_host as host,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gpu_health"
XID_LOG = FIXTURES / "kernel-xid.log"
# A kernel log without an Xid line: the capture's first line (nvidia-peermem, not the GPU).
CLEAN_LOG = XID_LOG.read_text().splitlines()[0] + "\n"
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
    "that the latest NVIDIA driver is installed and running."
)
DMESG_DENIED = "dmesg: read kernel buffer failed: Operation not permitted"
# dcgmi diag -r 1 in DCGM 3.3's layout (the rows as DCGM prints them; the messages wrapped at
# its column width): persistence mode failed on GPU 1, with its Error row.
DCGM_FAILED = """Successfully ran diagnostic for group.
+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Metadata  ----------+------------------------------------------------|
| DCGM Version              | 3.3.9                                          |
| Driver Version Detected   | 550.127.08                                     |
| GPU Device IDs Detected   | 2335,2335                                      |
|-----  Deployment  --------+------------------------------------------------|
| Denylist                  | Pass                                           |
| NVML Library              | Pass                                           |
| CUDA Main Library         | Pass                                           |
| Permissions and OS Blocks | Pass                                           |
| Persistence Mode          | Fail                                           |
| Error                     | Persistence mode for GPU 1 is currently disab  |
|                           | led. The DCGM diagnostic requires peristence   |
|                           |  mode to be enabled.                           |
| Environment Variables     | Pass                                           |
| Page Retirement/Row Remap | Pass                                           |
| Graphics Processes        | Pass                                           |
| Inforom                   | Pass                                           |
+---------------------------+------------------------------------------------+
"""
DCGM_PASSED = DCGM_FAILED.replace("| Fail   ", "| Pass   ").replace(
    DCGM_FAILED[DCGM_FAILED.index("| Error") : DCGM_FAILED.index("| Environment")], ""
)
DCGM_NO_ENGINE = (
    "Error: unable to establish a connection to the specified host: localhost\n"
    "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n"
)


def script(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def prints(folder: Path, name: str, text: str, rc: int = 0, stderr: bool = False) -> None:
    """A stand-in `name` that prints `text` (to stderr if asked) and exits with `rc`."""
    (folder / f"{name}.out").write_text(text)
    redirect = " >&2" if stderr else ""
    script(folder, name, f"/bin/cat {folder / f'{name}.out'}{redirect}\nexit {rc}\n")


def smi(folder: Path, xml, csv=None) -> None:
    """nvidia-smi answering -q -x with `xml` (empty output without one) and --query-gpu with
    `csv`."""
    script(
        folder,
        "nvidia-smi",
        'case "$1" in\n'
        f"  -q) {'/bin/cat ' + str(xml) if xml else 'true'} ;;\n"
        f"  --query-gpu=*) {'/bin/cat ' + str(csv) if csv else 'exit 6'} ;;\n"
        "  *) exit 2 ;;\n"
        "esac\n",
    )


@pytest.fixture
def bin_dir(tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    return folder


def run_module(tmp_path, bin_dir, **args):
    """The module as Ansible runs it, with only the stand-ins on PATH (no real dmesg or
    journalctl: /usr/bin is not searched)."""
    return ansible_run.module("gpu_health", tmp_path, str(bin_dir), **args)


def ids(result, level=None):
    return [f["id"] for f in result["findings"] if level is None or f["level"] == level]


def test_a_healthy_h100_has_no_error_findings(tmp_path, bin_dir):
    # The H100 capture is the --query-gpu CSV: -q -x gives nothing parsable, the CSV is read.
    smi(bin_dir, None, FIXTURES / "h100-80gb-hbm3-590.48.01.query-gpu.csv")
    prints(bin_dir, "dmesg", CLEAN_LOG)
    result = run_module(tmp_path, bin_dir, expected_gpus=1)
    assert not result.get("failed") and result["changed"] is False, result
    assert result["findings"] == [] and result["errors"] == 0
    assert result["kernel_log"] == "read" and result["dcgm"] == "absent"
    assert result["driver_version"] == "590.48.01"
    [gpu] = result["gpus"]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["persistence_mode"] is True
    assert gpu["remap_pending"] is False and gpu["ecc_uncorrected_volatile"] == 0


def test_the_gpu_count_and_an_old_driver_for_the_image(tmp_path, bin_dir):
    smi(bin_dir, FIXTURES / "a10g-515.105.01.xml")  # CUDA 11.7, persistence off
    prints(bin_dir, "dmesg", CLEAN_LOG)
    result = run_module(tmp_path, bin_dir, expected_gpus=8, image_cuda="12.4")
    assert ids(result, "error") == ["gpu-count", "driver-older-than-image-cuda"]
    assert ids(result, "warning") == ["persistence-off"]
    assert result["errors"] == 2 and result["cuda_version"] == "11.7"
    assert "nvidia-smi lists 1 GPU(s), the job expects 8" in result["findings"][0]["detail"]
    # Same major version: a warning (minor version compatibility may cover it).
    result = run_module(tmp_path, bin_dir, expected_gpus=1, image_cuda="11.8")
    assert ids(result, "error") == [] and "driver-older-than-image-cuda" in ids(result, "warning")


def test_uncorrected_ecc_and_a_pending_retirement_are_named(tmp_path, bin_dir):
    smi(bin_dir, FIXTURES / "v100-sxm3-32gb-410.104.xml")
    prints(bin_dir, "dmesg", CLEAN_LOG)
    result = run_module(tmp_path, bin_dir)
    assert ids(result, "error") == ["ecc-uncorrected", "page-retirement-pending"]
    assert "1 uncorrected ECC error(s) since the driver loaded" in result["findings"][0]["detail"]
    assert (
        result["findings"][0]["gpu"] == 0
        and "stop and start the VM" in result["findings"][0]["fix"]
    )


def test_a_pending_and_failed_row_remap_are_named(tmp_path, bin_dir):
    # The A10G capture with its remapped_rows edited: pending Yes, failure Yes.
    xml = (FIXTURES / "a10g-515.105.01.xml").read_text()
    for element in ("remapped_row_pending", "remapped_row_failure"):
        assert f"<{element}>No</{element}>" in xml
        xml = xml.replace(f"<{element}>No</{element}>", f"<{element}>Yes</{element}>")
    (tmp_path / "a10g-remap.xml").write_text(xml)
    smi(bin_dir, tmp_path / "a10g-remap.xml")
    prints(bin_dir, "dmesg", CLEAN_LOG)
    result = run_module(tmp_path, bin_dir)
    assert ids(result, "error") == ["row-remap-failure", "row-remap-pending"]
    assert "nvidia-smi -r" in result["findings"][1]["fix"]


def test_an_unreadable_kernel_log_is_unread_not_clean(tmp_path, bin_dir):
    smi(bin_dir, FIXTURES / "a10g-515.105.01.xml")
    prints(bin_dir, "dmesg", DMESG_DENIED + "\n", rc=1, stderr=True)
    result = run_module(tmp_path, bin_dir)
    assert result["kernel_log"] == "unread"
    assert ids(result, "warning") == ["persistence-off", "kernel-log-unread"]
    assert "become" in result["findings"][-1]["fix"]
    # journalctl -k is read when dmesg is not permitted.
    prints(bin_dir, "journalctl", XID_LOG.read_text())
    result = run_module(tmp_path, bin_dir)
    assert result["kernel_log"] == "read" and "kernel-log-unread" not in ids(result)
    assert "xid-79" in ids(result, "error")


def test_xid_79_in_the_kernel_log_is_an_error(tmp_path, bin_dir):
    smi(bin_dir, FIXTURES / "a10g-515.105.01.xml")
    prints(bin_dir, "dmesg", XID_LOG.read_text())
    result = run_module(tmp_path, bin_dir)
    assert ids(result, "error") == ["xid-79", "xid-94", "xid-95"]
    assert ids(result, "note") == ["xid-13"] * 3 + ["xid-109"]
    xid79 = result["findings"][ids(result).index("xid-79")]
    assert "Xid 79 on 0000:05:00: the GPU has fallen off the bus" in xid79["detail"]


def test_a_failed_dcgm_test_is_an_error_with_its_name(tmp_path, bin_dir):
    smi(bin_dir, FIXTURES / "a10g-515.105.01.xml")
    prints(bin_dir, "dmesg", CLEAN_LOG)
    prints(bin_dir, "dcgmi", DCGM_FAILED, rc=226)
    result = run_module(tmp_path, bin_dir)
    assert result["dcgm"] == "ran" and ids(result, "error") == ["dcgm-diag"]
    detail = result["findings"][-1]["detail"]
    assert detail.startswith("dcgmi diag -r 1: Persistence Mode Fail: Persistence mode for GPU 1")
    assert "is currently disabled. The DCGM diagnostic requires peristence mode" in detail
    # never: not run; a passing diag: no finding.
    assert run_module(tmp_path, bin_dir, dcgm="never")["dcgm"] == "skipped"
    prints(bin_dir, "dcgmi", DCGM_PASSED)
    result = run_module(tmp_path, bin_dir, dcgm="always")
    assert result["dcgm"] == "ran" and ids(result, "error") == []


def test_dcgm_without_its_host_engine_or_installed(tmp_path, bin_dir):
    smi(bin_dir, FIXTURES / "a10g-515.105.01.xml")
    prints(bin_dir, "dmesg", CLEAN_LOG)
    result = run_module(tmp_path, bin_dir, dcgm="always")
    assert result["dcgm"] == "absent" and ids(result, "error") == ["dcgm-missing"]
    prints(bin_dir, "dcgmi", DCGM_NO_ENGINE, rc=255)
    result = run_module(tmp_path, bin_dir)
    assert result["dcgm"] == "failed" and ids(result, "error") == []
    assert "dcgm-failed" in ids(result, "warning")
    assert "Unable to connect to host engine" in result["findings"][-1]["detail"]


def test_without_nvidia_smi_the_driver_is_missing(tmp_path, bin_dir):
    prints(bin_dir, "dmesg", CLEAN_LOG)
    prints(bin_dir, "dcgmi", DCGM_FAILED)  # not run without a driver
    result = run_module(tmp_path, bin_dir, expected_gpus=8)
    assert not result.get("failed"), result
    assert ids(result) == ["nvidia-smi-missing"] and result["errors"] == 1
    assert "cuda_installer.pyz install_driver" in result["findings"][0]["fix"]
    assert result["gpus"] == [] and result["dcgm"] == "skipped"
    assert result["kernel_log"] == "read"


def test_a_driver_that_is_not_loaded_and_its_xid_lines(tmp_path, bin_dir):
    prints(bin_dir, "nvidia-smi", NO_DRIVER + "\n", rc=9)
    prints(bin_dir, "dmesg", XID_LOG.read_text())
    result = run_module(tmp_path, bin_dir, expected_gpus=8)
    assert ids(result, "error") == ["driver-not-loaded", "xid-79", "xid-94", "xid-95"]
    assert "couldn't communicate with the NVIDIA driver" in result["findings"][0]["detail"]
    assert "exit 9" in result["findings"][0]["detail"]
    assert "reinstall it for the running kernel" in result["findings"][0]["fix"]


def test_a_hung_nvidia_smi_is_killed_at_the_deadline(tmp_path, bin_dir):
    script(bin_dir, "nvidia-smi", "exec /bin/sleep 60\n")
    prints(bin_dir, "dmesg", CLEAN_LOG)
    started = time.monotonic()
    result = run_module(tmp_path, bin_dir, timeout=3)
    assert time.monotonic() - started < 20
    assert ids(result, "error") == ["nvidia-smi-timeout"]
    assert "did not answer within 3 s" in result["findings"][0]["detail"]
    # No time was left for the kernel log: unread, not clean.
    assert result["kernel_log"] == "unread" and "kernel-log-unread" in ids(result)


def test_run_kills_a_command_at_its_deadline_and_reports_one_that_cannot_start(tmp_path):
    started = time.monotonic()
    rc, _out, _err = host.run(["/bin/sh", "-c", "/bin/sleep 30; echo late"], 1)
    assert rc is None and time.monotonic() - started < 10
    rc, _out, err = host.run([str(tmp_path / "absent")], 5)
    assert rc == 127 and err


def test_parse_dcgm_reads_failures_per_gpu_and_errors_of_a_section():
    assert host.parse_dcgm("Error: Unable to connect to host engine.") is None
    assert host.parse_dcgm(DCGM_PASSED) == []
    # dcgmi diag -r 2's memory test failing on one GPU; DCGM 4's per-GPU result lines.
    text = DCGM_PASSED.replace(
        "| Inforom                   | Pass                                           |\n",
        "| Inforom                   | Pass                                           |\n"
        "+-----  Hardware  ----------+------------------------------------------------+\n"
        "| GPU Memory                | Pass - GPUs: 1, 2, 3                           |\n"
        "|                           | Fail - GPU: 0                                  |\n"
        "| Warning                   | GPU 0 Thermal violations                       |\n"
        "| software                  | Pass                                           |\n"
        "|                           | GPU0: Fail                                     |\n",
    )
    assert host.parse_dcgm(text) == [
        {"test": "GPU Memory", "result": "Fail - GPU: 0", "messages": ["GPU 0 Thermal violations"]},
        {"test": "software", "result": "GPU0: Fail", "messages": []},
    ]
    # An Error row under a section with no failed test before it.
    text = (
        "| Diagnostic                | Result                                         |\n"
        "|-----  Deployment  --------+------------------------------------------------|\n"
        "| Error                     | GPU 3 has uncorrectable memory errors and row  |\n"
        "|                           |  remappings are pending                        |\n"
    )
    assert host.parse_dcgm(text) == [
        {
            "test": "Deployment",
            "result": "Error",
            "messages": ["GPU 3 has uncorrectable memory errors and row remappings are pending"],
        }
    ]
