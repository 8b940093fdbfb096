# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A GPU node's health from `nvidia-smi -q -x` (or `--query-gpu` CSV) and its kernel log.

Pure functions over captured output (tests/unit/fixtures/gpu_health, each with its source): what
each GPU reports (count, driver and CUDA version, persistence mode, uncorrected ECC errors,
pending row remaps or page retirements) and the Xid errors the driver logged. `check()` turns
them into findings, each with its fix.

The XML's layout changed across drivers: ECC counts are per location with single_bit/double_bit
totals before Ampere, sram_/dram_(un)correctable after; Volta and Turing retire pages, Ampere and
later remap rows (`remapped_rows` N/A where unsupported or under MIG).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import csv
import io
import re
import xml.etree.ElementTree as ET

# The query `--query-gpu` form reads; also the names in the CSV header.
QUERY_FIELDS = [
    "index",
    "pci.bus_id",
    "name",
    "driver_version",
    "persistence_mode",
    "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.pending",
    "remapped_rows.pending",
    "remapped_rows.failure",
]

# Xid codes that mean the GPU, its memory or its links need attention (NVIDIA's Xid catalogue and
# "GPU Memory Error Management"); others (13, 31, 43, 45: an application's fault) are reported
# as notes.
XID_CRITICAL = {
    48: "double-bit (uncorrectable) ECC error",
    63: "row remapping recorded: reset the GPU to apply it",
    64: "row remapping failed",
    74: "NVLink error",
    79: "the GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained uncorrectable ECC error",
    95: "uncontained uncorrectable ECC error: reset the GPU",
    119: "GSP firmware timeout",
    120: "GSP firmware error",
}
XID_NOTE = {
    13: "graphics engine exception (often the application)",
    31: "GPU memory page fault (often the application)",
    43: "GPU stopped processing (often the application)",
    45: "preemptive cleanup after an earlier error",
}
# Critical Xids whose condition nvidia-smi reports now: the uncorrected ECC count since the driver
# loaded, a pending or failed row remap, a pending page retirement, the GPU answering at all (79).
# The kernel log keeps every Xid since boot; after a GPU reset (or a driver reload) cleared the
# condition, the GPU's state says so, and such an Xid is a warning, not a reason to stop. The
# others (NVLink, GSP) leave no state to read: they stay errors until the VM restarts.
XID_CLEARED_BY_STATE = (48, 63, 64, 79, 92, 94, 95)
# The first CUDA release that builds for a GPU architecture (NVIDIA's CUDA release notes: Hopper's
# sm_90 in 11.8, Blackwell's sm_100 in 12.8): an image built for an older CUDA has no kernels for
# the GPU and cannot run on it (LLaMA-Factory's own image is built on CUDA 12.4: not on A4's B200).
# By the product name nvidia-smi reports.
GPU_MIN_CUDA = (
    ("B200", "Blackwell", "12.8"),
    ("B100", "Blackwell", "12.8"),
    ("H200", "Hopper", "11.8"),
    ("H100", "Hopper", "11.8"),
)
_XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)[^)]*\): (\d+),?(.*)")
_NA = ("N/A", "[N/A]", "", None)


def _text(node, path):
    found = node.find(path) if node is not None else None
    if found is None or found.text is None:
        return None
    value = found.text.strip()
    return None if value in _NA or value.startswith("[") else value


def _int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _yes(value):
    if value is None:
        return None
    return value.strip().lower() in ("yes", "enabled", "true")


def _sum(values):
    numbers = [v for v in (_int(x) for x in values) if v is not None]
    return sum(numbers) if numbers else None


def _ecc_uncorrected(ecc, scope):
    """Uncorrected ECC errors of one scope (volatile or aggregate), either layout."""
    node = ecc.find(scope) if ecc is not None else None
    if node is None:
        return None
    double_bit = _text(node, "double_bit/total")
    if double_bit is not None:  # pre-Ampere: single_bit / double_bit per location
        return _int(double_bit)
    # Newer drivers split SRAM's uncorrectable count into parity and SEC-DED.
    if node.find("sram_uncorrectable_parity") is not None:
        names = ("sram_uncorrectable_parity", "sram_uncorrectable_secded", "dram_uncorrectable")
    else:
        names = ("sram_uncorrectable", "dram_uncorrectable")
    return _sum(_text(node, name) for name in names)


def parse_smi_xml(text):
    """`nvidia-smi -q -x` -> {driver_version, cuda_version, attached_gpus, gpus: [...]}."""
    root = ET.fromstring(text)  # noqa: S314 - nvidia-smi's own output on the node
    gpus = []
    for index, gpu in enumerate(root.findall("gpu")):
        ecc = gpu.find("ecc_errors")
        retired = gpu.find("retired_pages")
        remapped = gpu.find("remapped_rows")
        has_remap = remapped is not None and remapped.find("remapped_row_pending") is not None
        retired_pending = _text(retired, "pending_retirement")
        retired_counts = [
            _text(retired, "multiple_single_bit_retirement/retired_count"),
            _text(retired, "double_bit_retirement/retired_count"),
        ]
        gpus.append(
            {
                "index": index,  # nvidia-smi lists the GPUs in index order
                "pci_bus_id": gpu.get("id") or _text(gpu, "pci/pci_bus_id"),
                "name": _text(gpu, "product_name"),
                "persistence_mode": _yes(_text(gpu, "persistence_mode")),
                "ecc_enabled": _yes(_text(gpu, "ecc_mode/current_ecc")),
                "ecc_uncorrected_volatile": _ecc_uncorrected(ecc, "volatile"),
                "ecc_uncorrected_aggregate": _ecc_uncorrected(ecc, "aggregate"),
                "retired_pages": _sum(retired_counts),
                "retired_pages_pending": _yes(retired_pending),
                "remap_pending": _yes(_text(remapped, "remapped_row_pending"))
                if has_remap
                else None,
                "remap_failure": _yes(_text(remapped, "remapped_row_failure"))
                if has_remap
                else None,
            }
        )
    return {
        "driver_version": _text(root, "driver_version"),
        "cuda_version": _text(root, "cuda_version"),
        "attached_gpus": _int(_text(root, "attached_gpus")),
        "gpus": gpus,
    }


def parse_query_csv(text):
    """`nvidia-smi --query-gpu=<QUERY_FIELDS or more> --format=csv` -> parse_smi_xml's shape
    (cuda_version None: the query has no such field)."""
    rows = list(csv.reader(io.StringIO(text), skipinitialspace=True))
    if not rows:
        return {"driver_version": None, "cuda_version": None, "attached_gpus": 0, "gpus": []}
    header = [re.sub(r"\s*\[.*\]$", "", name.strip()) for name in rows[0]]
    gpus = []
    driver = None
    for row in rows[1:]:
        if not row:
            continue
        cells = [None if v.strip() in _NA or v.startswith("[") else v.strip() for v in row]
        # zip(strict=) is Python 3.10+; the nodes' Python may be older.
        values = dict(zip(header, cells))  # noqa: B905
        driver = driver or values.get("driver_version")
        gpus.append(
            {
                "index": _int(values.get("index")),
                "pci_bus_id": values.get("pci.bus_id"),
                "name": values.get("name"),
                "persistence_mode": _yes(values.get("persistence_mode")),
                "ecc_enabled": _yes(values.get("ecc.mode.current")),
                "ecc_uncorrected_volatile": _int(
                    values.get("ecc.errors.uncorrected.volatile.total")
                ),
                "ecc_uncorrected_aggregate": _int(
                    values.get("ecc.errors.uncorrected.aggregate.total")
                ),
                "retired_pages": _sum(
                    [
                        values.get("retired_pages.single_bit_ecc.count"),
                        values.get("retired_pages.double_bit.count"),
                    ]
                ),
                "retired_pages_pending": _yes(values.get("retired_pages.pending")),
                "remap_pending": _yes(values.get("remapped_rows.pending")),
                "remap_failure": _yes(values.get("remapped_rows.failure")),
            }
        )
    return {
        "driver_version": driver,
        "cuda_version": None,
        "attached_gpus": len(gpus),
        "gpus": gpus,
    }


def xid_events(kernel_log):
    """[{xid, pci, detail, line}]: the `NVRM: Xid` lines of a kernel log (dmesg, journalctl -k)."""
    events = []
    for line in (kernel_log or "").splitlines():
        match = _XID_LINE.search(line)
        if match:
            events.append(
                {
                    "xid": int(match.group(2)),
                    "pci": match.group(1).lower(),
                    "detail": match.group(3).strip(),
                    "line": line.strip(),
                }
            )
    return events


def _bus_device(pci):
    """`00000000:CB:00.0` or `0000:cb:00` -> `cb:00`."""
    match = re.search(r"([0-9a-f]{2}):([0-9a-f]{2})(?:\.[0-7])?$", str(pci or "").lower())
    return "%s:%s" % match.groups() if match else None


def _version(text):
    parts = re.findall(r"\d+", text or "")
    return tuple(int(p) for p in parts[:2]) if parts else None


def _finding(level, finding_id, detail, fix, gpu=None):
    return {"level": level, "id": finding_id, "gpu": gpu, "detail": detail, "fix": fix}


HARDWARE_FIX = (
    "stop and start the VM so that it moves to another host (on GCE), or drain the node and "
    "report it; do not train on it"
)


def _architecture_findings(gpus, image_cuda):
    """An error when the image's CUDA is older than the first that builds for the GPUs' kind."""
    wanted = _version(image_cuda)
    names = sorted(set(g.get("name") or "" for g in gpus))
    for marker, family, first in GPU_MIN_CUDA:
        matching = [name for name in names if marker in name.upper()]
        if wanted and matching and wanted < _version(first):
            return [
                _finding(
                    "error",
                    "image-cuda-older-than-gpu",
                    "the GPUs are %s (%s), which CUDA %s or later builds for; the image is built "
                    "for CUDA %s and cannot run on them"
                    % (", ".join(matching), family, first, image_cuda),
                    "use an image built for CUDA %s or later (llamafactory_image; on A4, see "
                    "docs/gpu-families.md)" % first,
                )
            ]
    return []


def _state_clean(gpu):
    """Whether nvidia-smi reports none of the conditions of XID_CLEARED_BY_STATE for `gpu` now
    (an unknown value - an older driver, MIG - is not clean)."""
    return (
        gpu.get("ecc_uncorrected_volatile") == 0
        and gpu.get("remap_pending") is not True
        and gpu.get("remap_failure") is not True
        and gpu.get("retired_pages_pending") is not True
    )


def check(smi, kernel_log=None, expected_gpus=None, image_cuda=None):
    """Findings for one node: smi is parse_smi_xml's (or parse_query_csv's) result; kernel_log
    the text read, or None when it could not be read (reported as unread, never as clean);
    image_cuda the job image's CUDA version (its CUDA_VERSION), None when unknown."""
    findings = []
    gpus = smi.get("gpus") or []
    if expected_gpus is not None and len(gpus) != expected_gpus:
        findings.append(
            _finding(
                "error",
                "gpu-count",
                "nvidia-smi lists %d GPU(s), the job expects %d per node"
                % (len(gpus), expected_gpus),
                "set llamafactory_gpus_per_node to %d, or fix the VM (a GPU missing from "
                "nvidia-smi is a hardware or driver fault: %s)" % (len(gpus), HARDWARE_FIX),
            )
        )
    driver_cuda = _version(smi.get("cuda_version"))
    wanted = _version(image_cuda)
    if driver_cuda and wanted and wanted > driver_cuda:
        level = "error" if wanted[0] > driver_cuda[0] else "warning"
        findings.append(
            _finding(
                level,
                "driver-older-than-image-cuda",
                "driver %s supports CUDA up to %s, the image is built for CUDA %s%s"
                % (
                    smi.get("driver_version"),
                    smi.get("cuda_version"),
                    image_cuda,
                    ""
                    if level == "error"
                    else " (same major version: minor version compatibility may cover it)",
                ),
                "install a newer NVIDIA driver on the VMs (nvidia_container_toolkit's driver "
                "settings), or use an image built for CUDA %s" % smi.get("cuda_version"),
            )
        )
    findings += _architecture_findings(gpus, image_cuda)
    for gpu in gpus:
        where = "GPU %s (%s, %s)" % (gpu["index"], gpu.get("name"), gpu.get("pci_bus_id"))
        if gpu.get("ecc_uncorrected_volatile"):
            findings.append(
                _finding(
                    "error",
                    "ecc-uncorrected",
                    "%s: %d uncorrected ECC error(s) since the driver loaded"
                    % (where, gpu["ecc_uncorrected_volatile"]),
                    HARDWARE_FIX,
                    gpu["index"],
                )
            )
        elif gpu.get("ecc_uncorrected_aggregate"):
            findings.append(
                _finding(
                    "warning",
                    "ecc-uncorrected-lifetime",
                    "%s: %d uncorrected ECC error(s) over its lifetime, none since the driver "
                    "loaded" % (where, gpu["ecc_uncorrected_aggregate"]),
                    "watch it: more errors mean a failing memory",
                    gpu["index"],
                )
            )
        if gpu.get("remap_failure"):
            findings.append(
                _finding(
                    "error",
                    "row-remap-failure",
                    "%s: a row remapping failed" % where,
                    HARDWARE_FIX,
                    gpu["index"],
                )
            )
        if gpu.get("remap_pending"):
            findings.append(
                _finding(
                    "error",
                    "row-remap-pending",
                    "%s: a row remapping is pending; the memory is not repaired until the GPU "
                    "is reset" % where,
                    "reset the GPU (nvidia-smi -r with nothing running on it) or reboot the VM",
                    gpu["index"],
                )
            )
        if gpu.get("retired_pages_pending"):
            findings.append(
                _finding(
                    "error",
                    "page-retirement-pending",
                    "%s: a page retirement is pending (%s page(s) retired)"
                    % (where, gpu.get("retired_pages")),
                    "reset the GPU (nvidia-smi -r with nothing running on it) or reboot the VM",
                    gpu["index"],
                )
            )
        if gpu.get("persistence_mode") is False:
            findings.append(
                _finding(
                    "warning",
                    "persistence-off",
                    "%s: persistence mode is off (the driver unloads between jobs; slower start)"
                    % where,
                    "nvidia-smi -pm 1 (or enable nvidia-persistenced)",
                    gpu["index"],
                )
            )
    if kernel_log is None:
        findings.append(
            _finding(
                "warning",
                "kernel-log-unread",
                "the kernel log could not be read: Xid errors are unknown, not absent",
                "run the check as root (become), or allow dmesg (kernel.dmesg_restrict=0)",
            )
        )
    else:
        by_pci = dict((_bus_device(g.get("pci_bus_id")), g["index"]) for g in gpus)
        for event in xid_events(kernel_log):
            gpu = by_pci.get(_bus_device(event["pci"]))
            meaning = (
                XID_CRITICAL.get(event["xid"])
                or XID_NOTE.get(event["xid"])
                or "see NVIDIA's Xid catalogue"
            )
            level = "error" if event["xid"] in XID_CRITICAL else "note"
            cleared = (
                level == "error"
                and event["xid"] in XID_CLEARED_BY_STATE
                and gpu is not None
                and _state_clean(gpus[[g["index"] for g in gpus].index(gpu)])
            )
            if cleared:
                level = "warning"
            findings.append(
                _finding(
                    level,
                    "xid-%d" % event["xid"],
                    "Xid %d on %s%s: %s%s"
                    % (
                        event["xid"],
                        event["pci"],
                        "" if gpu is None else " (GPU %s)" % gpu,
                        meaning,
                        " - logged earlier since boot; the GPU now reports no uncorrected ECC "
                        "error since the driver loaded, no pending or failed row remap and no "
                        "pending page retirement (a reset cleared it)"
                        if cleared
                        else "",
                    ),
                    "watch it: another Xid %d means a failing GPU (%s)"
                    % (event["xid"], HARDWARE_FIX)
                    if cleared
                    else HARDWARE_FIX
                    if level == "error"
                    else "look at the job that ran then",
                    gpu,
                )
            )
    return findings
