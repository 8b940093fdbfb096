"""GPU health over real nvidia-smi output and kernel logs (tests/unit/fixtures/gpu_health, sources
in its SOURCES.md)."""

from pathlib import Path

import pytest
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _gpu_health as health

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gpu_health"


def smi(name):
    return health.parse_smi_xml((FIXTURES / name).read_text())


def ids(findings):
    return [f["id"] for f in findings]


def test_a100_is_read_across_the_ampere_layout():
    parsed = smi("a100-sxm4-80gb-535.54.03.xml")
    assert parsed["driver_version"] == "535.54.03"
    assert parsed["cuda_version"] == "12.2"
    assert parsed["attached_gpus"] == 4
    (gpu,) = parsed["gpus"]
    assert gpu == {
        "index": 0,
        "pci_bus_id": "00000000:01:00.0",
        "name": "NVIDIA A100-SXM4-80GB",
        "persistence_mode": False,
        "ecc_enabled": True,
        "ecc_uncorrected_volatile": 0,
        "ecc_uncorrected_aggregate": 0,
        "retired_pages": None,  # N/A on Ampere
        "retired_pages_pending": None,
        "remap_pending": None,  # N/A under MIG: unknown, not "no"
        "remap_failure": None,
    }


def test_a10g_reads_the_row_remapper():
    (gpu,) = smi("a10g-515.105.01.xml")["gpus"]
    assert (gpu["remap_pending"], gpu["remap_failure"]) == (False, False)


def test_t4_reads_retired_pages():
    (gpu,) = smi("tesla-t4-515.105.01.xml")["gpus"]
    assert (gpu["retired_pages"], gpu["retired_pages_pending"]) == (0, False)
    assert gpu["remap_pending"] is None


def test_v100_with_real_ecc_errors_and_a_pending_retirement():
    parsed = smi("v100-sxm3-32gb-410.104.xml")
    (gpu,) = parsed["gpus"]
    assert gpu["ecc_uncorrected_volatile"] == 1
    assert gpu["ecc_uncorrected_aggregate"] == 7627
    assert gpu["retired_pages"] == 2
    findings = health.check(parsed, kernel_log="")
    assert ids(findings) == ["ecc-uncorrected", "page-retirement-pending"]
    assert findings[0]["detail"] == (
        "GPU 0 (Tesla V100-SXM3-32GB, 00000000:34:00.0): 1 uncorrected ECC error(s) since the "
        "driver loaded"
    )
    assert findings[0]["level"] == "error"


def test_a_healthy_gpu_has_only_the_persistence_warning():
    parsed = smi("a10g-515.105.01.xml")
    assert ids(health.check(parsed, kernel_log="", expected_gpus=1)) == ["persistence-off"]


def test_pending_and_failed_row_remaps():
    # The A10G capture with its remapper's answers changed to Yes (no public capture has them).
    text = (FIXTURES / "a10g-515.105.01.xml").read_text()
    text = text.replace(
        "<remapped_row_pending>No</remapped_row_pending>",
        "<remapped_row_pending>Yes</remapped_row_pending>",
    ).replace(
        "<remapped_row_failure>No</remapped_row_failure>",
        "<remapped_row_failure>Yes</remapped_row_failure>",
    )
    findings = health.check(health.parse_smi_xml(text), kernel_log="")
    assert ids(findings) == ["row-remap-failure", "row-remap-pending", "persistence-off"]
    assert "reset the GPU" in findings[1]["fix"]


def test_gpu_count_against_the_job():
    findings = health.check(smi("a100-sxm4-80gb-535.54.03.xml"), kernel_log="", expected_gpus=8)
    assert findings[0]["id"] == "gpu-count"
    assert findings[0]["detail"] == "nvidia-smi lists 1 GPU(s), the job expects 8 per node"
    assert "llamafactory_gpus_per_node" in findings[0]["fix"]


@pytest.mark.parametrize(
    ("image_cuda", "expected"),
    [("12.1", []), ("12.2", []), ("12.4", ["warning"]), ("13.0", ["error"]), (None, [])],
)
def test_driver_against_the_images_cuda(image_cuda, expected):
    findings = health.check(
        smi("a100-sxm4-80gb-535.54.03.xml"), kernel_log="", image_cuda=image_cuda
    )
    levels = [f["level"] for f in findings if f["id"] == "driver-older-than-image-cuda"]
    assert levels == expected


def test_an_unread_kernel_log_is_reported_not_clean():
    findings = health.check(smi("a10g-515.105.01.xml"), kernel_log=None)
    assert "kernel-log-unread" in ids(findings)
    assert "unknown, not absent" in findings[-1]["detail"]


def test_xid_lines_of_a_real_kernel_log():
    log = (FIXTURES / "kernel-xid.log").read_text()
    events = health.xid_events(log)
    assert [e["xid"] for e in events] == [13, 13, 13, 109, 79, 94, 95]
    assert events[5]["pci"] == "0000:01:00"  # the MIG form "(PCI:0000:01:00 GPU-I:05)"
    findings = health.check(smi("a100-sxm4-80gb-535.54.03.xml"), kernel_log=log)
    xids = [f for f in findings if f["id"].startswith("xid-")]
    assert [(f["id"], f["level"]) for f in xids] == [
        ("xid-13", "note"),
        ("xid-13", "note"),
        ("xid-13", "note"),
        ("xid-109", "note"),
        ("xid-79", "error"),
        # The A100 now reports no uncorrected ECC error since the driver loaded, nothing
        # pending: a reset cleared what the Xids since boot said - warnings, not a stop.
        ("xid-94", "warning"),
        ("xid-95", "warning"),
    ]
    # Xid 94 names PCI 0000:01:00, the A100's bus: the finding names the GPU.
    assert xids[5]["gpu"] == 0
    assert xids[5]["detail"].startswith(
        "Xid 94 on 0000:01:00 (GPU 0): contained uncorrectable ECC error - logged earlier since "
        "boot; the GPU now reports no uncorrected ECC error"
    )
    assert xids[4]["gpu"] is None  # 0000:05:00 is no GPU of this node


def test_an_xid_whose_condition_the_gpu_still_reports_stops_the_launch():
    log = (FIXTURES / "kernel-xid.log").read_text()
    for state in (
        {"ecc_uncorrected_volatile": 2},
        {"remap_pending": True},
        {"ecc_uncorrected_volatile": None},  # not known: not clean
    ):
        parsed = smi("a100-sxm4-80gb-535.54.03.xml")
        parsed["gpus"][0].update(state)
        found = health.check(parsed, kernel_log=log)
        levels = {f["id"]: f["level"] for f in found if f["id"] in ("xid-94", "xid-95")}
        assert levels == {"xid-94": "error", "xid-95": "error"}, state


def test_query_gpu_csv_of_an_h100():
    parsed = health.parse_query_csv(
        (FIXTURES / "h100-80gb-hbm3-590.48.01.query-gpu.csv").read_text()
    )
    assert parsed["driver_version"] == "590.48.01"
    (gpu,) = parsed["gpus"]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3"
    assert gpu["pci_bus_id"] == "00000000:00:09.0"
    assert gpu["persistence_mode"] is True
    assert (gpu["ecc_uncorrected_volatile"], gpu["ecc_uncorrected_aggregate"]) == (0, 0)
    assert (gpu["remap_pending"], gpu["remap_failure"]) == (False, False)
    assert gpu["retired_pages"] is None
    assert health.check(parsed, kernel_log="", expected_gpus=1) == []


def test_the_query_fields_are_all_in_a_real_header():
    header = (FIXTURES / "h100-80gb-hbm3-590.48.01.query-gpu.csv").read_text().splitlines()[0]
    names = {name.strip().split(" [")[0] for name in header.split(",")}
    assert set(health.QUERY_FIELDS) <= names


@pytest.mark.parametrize(
    ("name", "image_cuda", "stopped"),
    [
        ("NVIDIA B200", "12.4", True),
        ("NVIDIA B200", "12.8", False),
        ("NVIDIA H100 80GB HBM3", "11.7", True),
        ("NVIDIA H200", "12.4", False),
        ("NVIDIA A100-SXM4-80GB", "11.0", False),
        ("NVIDIA B200", None, False),  # unknown: not judged
    ],
)
def test_the_images_cuda_against_the_gpus_kind(name, image_cuda, stopped):
    parsed = smi("a100-sxm4-80gb-535.54.03.xml")
    parsed["gpus"][0]["name"] = name  # no public B200/H200 capture: the product name changed
    parsed["cuda_version"] = "13.0"  # the driver is not what stops it
    found = health.check(parsed, "", image_cuda=image_cuda)
    assert ("image-cuda-older-than-gpu" in ids(found)) is stopped
