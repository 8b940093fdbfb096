# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gpu_health module's reads on a node: `nvidia-smi -q -x` (the `--query-gpu` CSV when the
XML does not parse), the kernel log (`dmesg`, else `journalctl -k`) and, when asked and
installed, `dcgmi diag -r 1`; each command killed at its deadline, all of them within the
module's `timeout`. The findings come from _gpu_health.check() (parsers and rules there) and the
DCGM result lines here; nothing on the node is changed.

A node whose nvidia-smi is missing, fails or hangs gets a finding with its fix, not a module
failure; a kernel log that cannot be read is reported as unread, never as clean.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import os
import re
import signal
import subprocess
import time

from ansible_collections.hostnet.llamafactory.plugins.module_utils import _gpu_health as health

OPTIONS = dict(
    expected_gpus=dict(type="int"),
    image_cuda=dict(type="str"),
    dcgm=dict(type="str", default="auto", choices=["auto", "always", "never"]),
    timeout=dict(type="int", default=120),
)

# Each command's own cap, in seconds (less when less of the module's timeout is left).
SMI_SECONDS = 60
KERNEL_LOG_SECONDS = 30
# dcgmi diag -r 1 (the deployment checks) takes seconds to tens of seconds; it is not started
# with less than this left.
DCGM_MIN_SECONDS = 10

DRIVER_FIX = (
    "install the NVIDIA driver - on GCP, use a Deep Learning VM image, or GCP's installer: "
    "curl -L https://storage.googleapis.com/compute-gpu-installation-us/installer/latest/"
    "cuda_installer.pyz --output cuda_installer.pyz && sudo python3 cuda_installer.pyz "
    'install_driver (see "Install GPU drivers" in the Compute Engine docs); or set '
    "llamafactory_gpus_per_node to 0 for a node without GPUs"
)
NOT_LOADED_FIX = (
    "the driver is installed but not loaded or has no GPU: after a kernel upgrade reinstall it "
    "for the running kernel (GCP's installer: sudo python3 cuda_installer.pyz install_driver) or "
    "reboot the VM; if it persists, %s" % health.HARDWARE_FIX
)
# Rows of a dcgmi diag table that carry messages, not a test's result.
_DCGM_MESSAGES = ("error", "warning", "info")
_DCGM_ROW = re.compile(r"^\|([^|]*)\|(.*)\|$")
_DCGM_SECTION = re.compile(r"^[|+]-{3,}\s+(\w[\w ]*?)\s+-+")
_FAIL = re.compile(r"\bFail\b")


def _finding(level, finding_id, detail, fix, gpu=None):
    return {"level": level, "id": finding_id, "gpu": gpu, "detail": detail, "fix": fix}


def run(args, seconds):
    """(rc, stdout, stderr): args run for at most `seconds` (its process group killed then; rc
    None). A command that cannot start: rc 127 and why in stderr."""
    env = dict(os.environ, LC_ALL="C", LANG="C")
    # Not run_command: it has no deadline, and a hung nvidia-smi or dcgmi must be killed with
    # its process group.
    try:
        proc = subprocess.Popen(  # pylint: disable=ansible-bad-function
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        return 127, "", str(exc)
    try:
        out, err = proc.communicate(timeout=max(seconds, 1))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):  # ended meanwhile
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, _decode(out), _decode(err)
    return proc.returncode, _decode(out), _decode(err)


def _decode(data):
    return (data or b"").decode("utf-8", "replace")


def _last(text, limit=300):
    return " ".join((text or "").split())[-limit:]


def parse_dcgm(text):
    """`dcgmi diag` table -> [{test, result, messages}] for the tests that failed (a `Fail` in
    a test's result lines, also per GPU: `Fail - GPU: 0`, `GPU0: Fail`); the Error/Warning/Info
    rows after a failed test are its messages (an Error row after no failed test is a failure of
    its section). None when the text holds no result table."""
    failed = []
    seen_table = False
    section = test = current = None  # current: the failure the next message rows belong to
    for line in (text or "").splitlines():
        line = line.strip()
        heading = _DCGM_SECTION.match(line)
        if heading:
            section, test, current = heading.group(1), None, None
            continue
        match = _DCGM_ROW.match(line)
        if not match:
            current = None if line.startswith("+") else current
            continue
        name = match.group(1).strip()
        raw = match.group(2)[1:] if match.group(2).startswith(" ") else match.group(2)
        raw = raw.rstrip()
        result = raw.strip()
        if (name, result) == ("Diagnostic", "Result"):
            seen_table = True
        elif name.lower() in _DCGM_MESSAGES:
            if current is not None:
                current["messages"].append(result)
            elif name.lower() == "error" and result:
                current = {"test": test or section or "dcgmi", "result": "Error", "messages": []}
                current["messages"].append(result)
                failed.append(current)
        elif not name:  # a continuation: of the last test's result or of the last message
            if current is not None and current["messages"]:
                current["messages"][-1] += raw
            elif _FAIL.search(result) and test and current is None:
                current = {"test": test, "result": result, "messages": []}
                failed.append(current)
        else:
            test, current = name, None
            if _FAIL.search(result):
                current = {"test": test, "result": result, "messages": []}
                failed.append(current)
    return failed if seen_table else None


def _dcgm(dcgmi, mode, seconds):
    """(state, findings): dcgmi diag -r 1 run (ran), absent, skipped or failed."""
    if mode == "never":
        return "skipped", []
    if dcgmi is None:
        if mode == "always":
            return "absent", [
                _finding(
                    "error",
                    "dcgm-missing",
                    "dcgm is always but dcgmi is not installed",
                    "install NVIDIA DCGM (package datacenter-gpu-manager, service nvidia-dcgm), "
                    "or set dcgm to auto",
                )
            ]
        return "absent", []
    if seconds < DCGM_MIN_SECONDS:
        return "skipped", [
            _finding(
                "note",
                "dcgm-skipped",
                "dcgmi diag -r 1 was not started: %d s of the timeout left" % max(seconds, 0),
                "raise the timeout",
            )
        ]
    rc, out, err = run([dcgmi, "diag", "-r", "1"], seconds)
    if rc is None:
        return "failed", [
            _finding(
                "warning",
                "dcgm-timeout",
                "dcgmi diag -r 1 did not finish within %d s" % seconds,
                "run `dcgmi diag -r 1` on the node by hand; raise the timeout",
            )
        ]
    failed = parse_dcgm(out)
    if failed is None:
        return "failed", [
            _finding(
                "warning",
                "dcgm-failed",
                "dcgmi diag -r 1 gave no result (exit %s): %s" % (rc, _last(out + " " + err)),
                "start DCGM's host engine (systemctl start nvidia-dcgm, or nv-hostengine), or "
                "set dcgm to never",
            )
        ]
    findings = []
    for item in failed:
        findings.append(
            _finding(
                "error",
                "dcgm-diag",
                "dcgmi diag -r 1: %s %s%s"
                % (
                    item["test"],
                    item["result"],
                    (": " + " ".join(" ".join(item["messages"]).split())[:500])
                    if item["messages"]
                    else "",
                ),
                "follow DCGM's message; a hardware fault: %s" % health.HARDWARE_FIX,
            )
        )
    return "ran", findings


def _kernel_log(which, seconds):
    """The kernel log's text (dmesg, else journalctl -k), None when neither can be read."""
    started = time.monotonic()
    for args in (["dmesg"], ["journalctl", "-k", "--no-pager", "-q"]):
        path = which(args[0])
        left = seconds - (time.monotonic() - started)
        if path is None or left < 1:
            continue
        rc, out, _err = run([path, *args[1:]], left)
        # A kernel log is never empty: no output is a log that could not be read.
        if rc == 0 and out.strip():
            return out
    return None


def read(which, params):
    """The module's result: which(name) -> a command's path or None (AnsibleModule's
    get_bin_path); params: OPTIONS' values."""
    deadline = time.monotonic() + max(int(params.get("timeout") or 120), 1)

    def left(cap=None):
        remaining = deadline - time.monotonic()
        return remaining if cap is None else min(cap, remaining)

    smi = {"driver_version": None, "cuda_version": None, "attached_gpus": None, "gpus": []}
    findings = []
    smi_ok = False
    nvidia_smi = which("nvidia-smi")
    if nvidia_smi is None:
        findings.append(
            _finding(
                "error",
                "nvidia-smi-missing",
                "nvidia-smi is not installed: this node has no NVIDIA driver",
                DRIVER_FIX,
            )
        )
    else:
        seconds = round(left(SMI_SECONDS))
        rc, out, err = run([nvidia_smi, "-q", "-x"], seconds)
        if rc is None:
            findings.append(
                _finding(
                    "error",
                    "nvidia-smi-timeout",
                    "nvidia-smi -q -x did not answer within %d s: a GPU or the driver hangs"
                    % seconds,
                    "reboot the VM; if it persists, %s" % health.HARDWARE_FIX,
                )
            )
        elif rc != 0:
            findings.append(
                _finding(
                    "error",
                    "driver-not-loaded",
                    "nvidia-smi failed (exit %s): %s" % (rc, _last(out + " " + err)),
                    NOT_LOADED_FIX,
                )
            )
        else:
            try:
                smi = health.parse_smi_xml(out)
                smi_ok = True
            except Exception:  # noqa: BLE001 - any unparsable XML: the CSV query next
                query = "--query-gpu=" + ",".join(health.QUERY_FIELDS)
                rc, out, err = run([nvidia_smi, query, "--format=csv"], round(left(SMI_SECONDS)))
                if rc == 0:
                    smi = health.parse_query_csv(out)
                    smi_ok = True
                else:
                    findings.append(
                        _finding(
                            "error",
                            "driver-not-loaded",
                            "nvidia-smi's XML does not parse and its query failed (exit %s): %s"
                            % (rc, _last(out + " " + err)),
                            NOT_LOADED_FIX,
                        )
                    )
    kernel_log = _kernel_log(which, left(KERNEL_LOG_SECONDS))
    findings += health.check(
        smi,
        kernel_log,
        expected_gpus=params.get("expected_gpus") if smi_ok else None,
        image_cuda=params.get("image_cuda"),
    )
    if smi_ok:
        dcgm, dcgm_findings = _dcgm(which("dcgmi"), params.get("dcgm") or "auto", int(left()) - 2)
    else:  # DCGM cannot run without a working driver; the finding above says why
        dcgm, dcgm_findings = "skipped", []
    findings += dcgm_findings
    return {
        "changed": False,
        "driver_version": smi.get("driver_version"),
        "cuda_version": smi.get("cuda_version"),
        "gpus": smi.get("gpus") or [],
        "findings": findings,
        "errors": len([f for f in findings if f["level"] == "error"]),
        "kernel_log": "unread" if kernel_log is None else "read",
        "dcgm": dcgm,
    }
