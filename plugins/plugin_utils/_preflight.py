# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The preflight's verdict: every node's probe report (roles/preflight/files/preflight_probe.py,
run in a container with the launch's network mode) and discovery facts in, findings out - each
a cause and its fix, naming the nodes and the variable to change."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import re

from ansible_collections.hostnet.llamafactory.plugins.module_utils import _gpu_health
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _diagnosis, _job_state

GB = 1000**3


def _finding(ident, cause, fix):
    return {"id": ident, "cause": cause, "fix": fix}


def _blocked_fix(error, what):
    lowered = (error or "").lower()
    if "timed out" in lowered:
        return (
            "packets to %s are dropped: open all TCP between the nodes (on GCP the gcp_firewall "
            "role's rule - check it exists and targets these VMs; on the nodes look at "
            "`iptables -S` / `nft list ruleset`)" % what
        )
    if "refused" in lowered:
        return (
            "nothing listens there from this node's point of view, or a firewall rejects the "
            "connection: check the address belongs to that node on the network the nodes share "
            "(llamafactory_interface / llamafactory_master_interface), and the firewall"
        )
    if "unreachable" in lowered or "no route" in lowered:
        return (
            "this node has no route to %s: the nodes must share a network (one VPC, subnets "
            "routed to each other); set llamafactory_interface to the NIC on it" % what
        )
    return "check the network between the nodes"


def parse(result):
    """The connect container's registered result -> {'report': the probe's JSON or None,
    'error': why there is none}."""
    if not isinstance(result, dict):
        return {"report": None, "error": "no result"}
    if "report" in result or ("error" in result and "container" not in result):
        return result  # parsed already
    if result.get("skipped"):
        return {"report": None, "error": "skipped"}
    output = ((result.get("container") or {}).get("Output") or "").strip()
    for line in reversed(output.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return {"report": json.loads(line), "error": ""}
            except ValueError:
                break
    error = result.get("msg") or output or "the probe printed no report"
    return {"report": None, "error": " ".join(str(error).split())[:500]}


def targets(me, hosts, addresses, master, master_addr, master_port, probe_port):
    """What node `me` probes: every other node's training address on the high port, and
    MASTER_ADDR:MASTER_PORT unless `me` is the master. addresses: host -> its training address."""
    found = [
        {"node": host, "address": addresses[host], "port": int(probe_port)}
        for host in hosts
        if host != me
    ]
    if me != master:
        found.append({"node": master, "address": master_addr, "port": int(master_port)})
    return found


def _listener_problem(host, node, listener, master_port, probe_port):
    """The probe's listener on `host` could not start or ended early: a port already taken."""
    text = " ".join([listener.get("error") or "", *(listener.get("log_lines") or [])])
    ended = listener.get("state") not in (None, "running", "unknown") and listener.get(
        "exit_code"
    ) not in (None, 0)
    if not (ended or listener.get("error")):
        return None
    ports = "%s (preflight_port)" % probe_port
    if int(node["rank"]) == 0:
        ports = "%s (MASTER_PORT) or %s" % (master_port, ports)
    if "address already in use" in text.lower() or "port is already allocated" in text.lower():
        return _finding(
            "port-in-use",
            "port %s is already taken on %s: another job, a hand launch or another service "
            "listens there" % (ports, host),
            "stop what holds it (playbooks/stop.yml -e llamafactory_job=NAME for a job of this "
            "collection; `ss -ltnp` on the node shows it) or choose another port with "
            "llamafactory_master_port / preflight_port",
        )
    return _finding(
        "probe-failed",
        "the preflight's listener on %s ended early: %s" % (host, " ".join(text.split())[:300]),
        "check that Docker runs llamafactory_image there with python3",
    )


# The network profile's problems found by discovery (primary_nic's network_profile.problems),
# with their fix.
PROFILE_FIXES = {
    "gpu-nics-missing": "create the VM with its GPU NICs (one per GPU network, as its machine "
    "type's recipe), or set llamafactory_network_profile=socket to train over one NIC at a "
    "fraction of the machine's network",
    "gpu-nic-count": "create the VM with every GPU NIC of its machine type (one per GPU VPC)",
    "gpu-nic-mtu": "create the GPU networks with the MTU of the machine type's recipe",
    "gpu-nic-down": "bring the GPU NIC up (its VPC attachment, or `ip link set NIC up`)",
    "gpu-nic-no-address": "check the GPU NIC's subnet and the guest's network configuration "
    "(DHCP on every GPU NIC)",
}
_FILE_FIXES = {
    "env_script": (
        "network-plugin-missing",
        "install the plugin (train.yml's host setup for the profile), or set "
        "llamafactory_network_profile=socket",
    ),
    "device": (
        "network-device-missing",
        "load the driver that provides it (TCPXO: the aperture devices' udev rule and "
        "dmabuf-import-helper; gIB: the RDMA drivers), or set llamafactory_network_profile=socket",
    ),
    "volume": (
        "network-plugin-missing",
        "install the plugin (train.yml's host setup for the profile), or set "
        "llamafactory_network_profile=socket",
    ),
}


def _profile_findings(host, node, report):
    """The node's network profile: discovery's problems, the plugin's files and devices
    missing on the node (report['missing_network']: [{path, kind}]) and, for tcpxo, RxDM not
    running (report['rxdm']: {state, log_lines})."""
    profile = node.get("profile") or "socket"
    found = []
    rxdm = report.get("rxdm")
    if profile == "tcpxo" and rxdm is not None and rxdm.get("state") != "running":
        last = "; ".join((rxdm.get("log_lines") or [])[-2:]) or "no log"
        found.append(
            _finding(
                "rxdm-not-running",
                "%s's receive-datapath-manager (TCPXO's RxDM) is %s (%s): the plugin cannot "
                "receive without it" % (host, rxdm.get("state"), last),
                "run train.yml's host setup (role nccl_plugin starts it and waits for its buffer "
                "manager), and read `docker logs receive-datapath-manager` on the node",
            )
        )
    for problem in node.get("profile_problems") or []:
        ident = problem.get("id", "network-profile")
        found.append(
            _finding(
                ident,
                "%s (%s profile): %s" % (host, profile, problem.get("detail")),
                PROFILE_FIXES.get(ident, "see docs/gpu-families.md"),
            )
        )
    for item in report.get("missing_network") or []:
        ident, fix = _FILE_FIXES.get(item.get("kind"), _FILE_FIXES["volume"])
        found.append(
            _finding(
                ident,
                "%s has no %s, which the %s profile's ranks need (%s)"
                % (host, item.get("path"), profile, item.get("kind")),
                fix,
            )
        )
    return found


def image_cuda(torch_version):
    """The CUDA version a PyTorch wheel is built for, from its local version: '2.6.0+cu124' ->
    '12.4', '2.1.0+cu118' -> '11.8'; None when it does not say (PyPI's default wheels, CPU)."""
    match = re.search(r"\+cu(\d+)(\d)$", str(torch_version or ""))
    return "%s.%s" % match.groups() if match else None


def _gpu_health_findings(host, entry):
    """The node's GPU health (the module hostnet.llamafactory.gpu_health's result in
    entry['gpu_health'], None where it did not run): its error findings, the cause prefixed with
    the host (warnings and notes are printed on the node and do not stop the launch); the driver
    and the GPUs' kind (a B200 needs CUDA 12.8) against the CUDA version of the image's PyTorch
    (from the probe's report) when the module was not told it."""
    result = (entry or {}).get("gpu_health")
    if not isinstance(result, dict) or result.get("skipped"):
        return []
    if result.get("failed") or "findings" not in result:
        return [
            _finding(
                "gpu-health-failed",
                "the GPU health check could not run on %s: %s"
                % (host, " ".join(str(result.get("msg") or "no result").split())[:300]),
                "run it by hand (ansible HOST -b -m hostnet.llamafactory.gpu_health) and fix what "
                "it says, or set preflight_gpu_health=false",
            )
        ]
    found = [
        _finding(item.get("id"), "%s: %s" % (host, item.get("detail")), item.get("fix"))
        for item in result.get("findings") or []
        if item.get("level") == "error"
    ]
    torch = ((parse(entry).get("report") or {}).get("packages") or {}).get("torch")
    known = set(item.get("id") for item in result.get("findings") or [])
    against = ("driver-older-than-image-cuda", "image-cuda-older-than-gpu")
    if image_cuda(torch) and not known & set(against):
        driver = {
            "driver_version": result.get("driver_version"),
            "cuda_version": result.get("cuda_version"),
            "gpus": result.get("gpus") or [],
        }
        for item in _gpu_health.check(driver, kernel_log="", image_cuda=image_cuda(torch)):
            if item["level"] == "error" and item["id"] in against:
                cause = "%s: %s (torch %s)" % (host, item["detail"], torch)
                found.append(_finding(item["id"], cause, item["fix"]))
    return found


def findings(
    reports,
    nodes,
    master_addr,
    master_port,
    probe_port,
    network_mode="host",
    min_free_gb=0,
    gpus_per_node=0,
):
    """reports: host -> {'report': probe report dict or None, 'error': why it is missing};
    nodes: host -> {'rank', 'address', 'interface', 'mtu'}. Returns a list of findings."""
    found = []
    for host in sorted(nodes, key=lambda h: int(nodes[h]["rank"])):
        for mount in (reports.get(host) or {}).get("missing_mounts") or []:
            found.append(
                _finding(
                    "shared-mount-missing",
                    "%s has no folder %s (llamafactory_shared_mounts): Docker would create it "
                    "empty and the ranks would not find their data or model there" % (host, mount),
                    "mount it on every node (Filestore, gcsfuse...) before the launch, or take it "
                    "out of llamafactory_shared_mounts",
                )
            )
        found += _profile_findings(host, nodes[host], (reports.get(host) or {}))
        found += _gpu_health_findings(host, reports.get(host))
        listener = (reports.get(host) or {}).get("listener") or {}
        problem = _listener_problem(host, nodes[host], listener, master_port, probe_port)
        if problem:
            found.append(problem)
        entry = parse(reports.get(host))
        report = entry.get("report")
        if not report:
            error = entry.get("error") or "no report"
            if "could not select device driver" in error or "nvidia" in error.lower():
                found.append(
                    _finding(
                        "gpu-runtime",
                        "%s cannot start a container with GPUs: %s" % (host, error),
                        "install the NVIDIA Container Toolkit (role nvidia_container_toolkit, "
                        "which train.yml runs when llamafactory_gpus_per_node > 0)",
                    )
                )
            else:
                found.append(
                    _finding(
                        "probe-failed",
                        "the preflight probe did not run on %s: %s" % (host, error),
                        "check that Docker runs llamafactory_image there (`docker run --rm IMAGE "
                        "python3 -V`); the image needs python3",
                    )
                )
            continue
        node = nodes[host]
        collect_error = report.get("collect_error") or ""
        if "address already in use" in collect_error.lower():
            found.append(
                _finding(
                    "port-in-use",
                    "%s (rank 0): %s - the ranks' agents listen on that port "
                    "(launch_agent_port), and rank 0's could not" % (host, collect_error),
                    "stop what holds it (`ss -ltnp` on the node shows it) or choose another "
                    "port with launch_agent_port",
                )
            )
        own = node["address"]
        bind_failed = [
            r
            for r in report.get("results", [])
            if not r.get("ok") and "EADDRNOTAVAIL" in (r.get("error") or "")
        ]
        source = report.get("source")
        if bind_failed or (source and source != own):
            found.append(
                _finding(
                    "container-not-on-host-network",
                    "a container on %s (network mode %s) does not have %s's address %s (%s): it "
                    "sends from %s, an address the other nodes cannot reach - ranks would "
                    "advertise it and the others' connections fail (the 172.17.0.2 error)"
                    % (host, network_mode, host, own, node.get("interface"), source or "elsewhere"),
                    "set llamafactory_network_mode=host (the default)",
                )
            )
            continue  # its other results follow from this
        for result in report.get("results", []):
            target = result.get("node")
            peer = nodes.get(target) or {}
            overridden = [
                "%s's %s" % (name, n.get("interface"))
                for name, n in ((host, node), (target, peer))
                if n.get("method") == "override"
            ]
            if result.get("ok"):
                answered = result.get("answer") or ""
                if target and answered and ('"%s"' % target) not in answered:
                    found.append(
                        _finding(
                            "wrong-peer",
                            "%s reached %s:%s expecting %s but %s answered"
                            % (host, result["address"], result["port"], target, answered),
                            "the address is another node's: check llamafactory_master_addr and "
                            "llamafactory_interface",
                        )
                    )
                continue
            what = "%s:%s" % (result["address"], result["port"])
            fix = _blocked_fix(result.get("error"), what)
            if overridden:
                fix += (
                    "; or the NIC set by llamafactory_interface / llamafactory_master_interface "
                    "(%s) is not on the network the nodes share: unset it or name that NIC"
                    % ", ".join(overridden)
                )
            if int(result["port"]) == int(master_port) and result["address"] == master_addr:
                found.append(
                    _finding(
                        "master-unreachable",
                        "%s (rank %s) cannot reach MASTER_ADDR:MASTER_PORT %s (rank 0, %s): %s"
                        % (host, node["rank"], what, target, result.get("error")),
                        fix,
                    )
                )
            else:
                found.append(
                    _finding(
                        "peer-unreachable",
                        "%s (rank %s) cannot reach %s at %s, a high port like those NCCL and Gloo "
                        "pick for every pair of nodes: %s"
                        % (host, node["rank"], target, what, result.get("error")),
                        fix,
                    )
                )
        packages = report.get("packages") or {}
        if packages and not packages.get("llamafactory"):
            found.append(
                _finding(
                    "image-without-llamafactory",
                    "llamafactory_image on %s has no llamafactory package (python3 there sees "
                    "torch %s): the ranks run llamafactory-cli"
                    % (host, packages.get("torch") or "absent"),
                    "set llamafactory_image to a LLaMA-Factory image (hiyouga/llamafactory:TAG, "
                    "or one built FROM it)",
                )
            )
        disk = report.get("disk")
        if disk and min_free_gb and disk["free"] < float(min_free_gb) * GB:
            found.append(
                _finding(
                    "disk-low",
                    "%s has %.1f GB free under %s, less than preflight_min_free_gb (%s GB)"
                    % (host, disk["free"] / float(GB), disk["path"], min_free_gb),
                    "free space there or use a larger disk (checkpoints of every rank land on "
                    "every node), or lower preflight_min_free_gb",
                )
            )
        if disk and disk.get("checkpoint_bytes") and disk["free"] < disk["checkpoint_bytes"]:
            found.append(
                _finding(
                    "disk-checkpoint",
                    "%s has %.2f GB free under %s, less than its newest checkpoint "
                    "(checkpoint-%d, %.2f GB): the next checkpoint would fill the disk and "
                    "stop the training when it saves"
                    % (
                        host,
                        disk["free"] / float(GB),
                        disk["path"],
                        disk["checkpoint"],
                        disk["checkpoint_bytes"] / float(GB),
                    ),
                    "free space there or use a larger disk; save_total_limit in the training "
                    "config keeps fewer checkpoints (with llamafactory_output_uri the bucket "
                    "keeps them all)",
                )
            )
        gpus = report.get("gpus")
        if int(gpus_per_node or 0) > 0 and gpus is not None and int(gpus) != int(gpus_per_node):
            found.append(
                _finding(
                    "gpu-count",
                    "%s's container sees %s GPUs, llamafactory_gpus_per_node is %s"
                    % (host, gpus, gpus_per_node),
                    "set llamafactory_gpus_per_node to the GPUs every node has, or fix the node's "
                    "driver (`nvidia-smi` on the host)",
                )
            )
    types = dict((h, n.get("machine_type")) for h, n in nodes.items() if n.get("machine_type"))
    if len(set(types.values())) > 1:
        found.append(
            _finding(
                "machine-types-differ",
                "the nodes are of different machine types: %s"
                % ", ".join("%s %s" % (h, types[h]) for h in sorted(types)),
                "use one machine type for every node of a job: NCCL's rings and the network "
                "plugin's tuning assume the same GPUs and NICs on each",
            )
        )
    mtus = dict((h, n.get("mtu")) for h, n in nodes.items() if n.get("mtu"))
    if len(set(mtus.values())) > 1:
        listed = ", ".join(
            "%s %s MTU %s" % (h, nodes[h].get("interface"), mtus[h]) for h in sorted(mtus)
        )
        found.append(
            _finding(
                "mtu-mismatch",
                "the nodes' training NICs have different MTUs: %s" % listed,
                "give every node's NIC the same MTU (a GCP VPC's MTU is 1460 unless it was created "
                "with another): large NCCL messages are dropped or stall across a mismatch",
            )
        )
    return found


def message(job, found, elapsed=None):
    lines = [
        "preflight of job %s found %d problem(s) before any rank started%s:"
        % (job, len(found), "" if elapsed is None else " (%.0f s)" % elapsed)
    ]
    for item in found:
        lines.append("- %s: %s\n  Fix: %s" % (item["id"], item["cause"], item["fix"]))
    lines.append("Nothing was launched (preflight_enabled=false skips these checks).")
    return "\n".join(lines)


def doctor_report(
    probe_findings, log_findings, smoke_failure=None, smoke=None, running=False, container=""
):
    """playbooks/doctor.yml's report: {'problems': n, 'lines': [...]}, one line per problem."""
    lines = []
    if running:
        lines.append(
            "probes and smoke test skipped: %s is running (its ranks hold MASTER_PORT); its logs "
            "are diagnosed below" % container
        )
    for item in probe_findings or []:
        lines.append("- %s: %s\n  Fix: %s" % (item["id"], item["cause"], item["fix"]))
    if smoke_failure:
        lines.append("- smoke-test-failed: %s" % smoke_failure)
    elif smoke:
        lines.append(
            "smoke test: all_reduce across %s ranks (%s), bus bandwidth %s GB/s"
            % (smoke.get("world_size"), smoke.get("backend"), smoke.get("busbw_GBps"))
        )
    for item in log_findings or []:
        lines.append(
            "- %s (%s, in the logs of %s): %s\n  Fix: %s\n  Line: %s"
            % (
                item["id"],
                item.get("host", "?"),
                container,
                item["cause"],
                item["fix"],
                item.get("line", ""),
            )
        )
    if not log_findings:
        lines.append("logs of %s: nothing known found (or no such container)" % container)
    problems = len(probe_findings or []) + len(log_findings or []) + (1 if smoke_failure else 0)
    lines.insert(0, "doctor: %d problem(s) found" % problems)
    return {"problems": problems, "lines": lines}


def rank_variable(version):
    """Which variable a LLaMA-Factory version reads for the node rank: NODE_RANK from 0.9.1 on,
    RANK before (the launch sets both)."""
    try:
        parts = tuple(int(p) for p in str(version).split(".")[:3] if p.isdigit())
    except ValueError:
        return "NODE_RANK"
    return "NODE_RANK" if parts >= (0, 9, 1) else "RANK"


def versions_line(reports):
    """'LLaMA-Factory 0.9.5 (reads NODE_RANK), torch 2.13.0, deepspeed 0.19.8' from the first
    report that names them; None without any."""
    for entry in reports.values():
        packages = (parse(entry).get("report") or {}).get("packages") or {}
        if packages.get("llamafactory"):
            version = packages["llamafactory"]
            parts = ["LLaMA-Factory %s (reads %s)" % (version, rank_variable(version))]
            for name in ("torch", "deepspeed", "transformers"):
                if packages.get(name):
                    parts.append("%s %s" % (name, packages[name]))
            return ", ".join(parts)
    return None


def _gib_list(sizes):
    return ", ".join("%g" % (size / (1 << 30)) for size in sizes)


def _measured_at(result, expected):
    """The busbw figures of the smoke result at each of the pass mark's sizes (within 1%: the
    buffer is rounded to whole elements per rank), in its collective; None when one is missing
    (the mark's rule needs all of them)."""
    if result.get("collective", "all_reduce") != expected.get("collective"):
        return None
    sizes = result.get("sizes") or [{"bytes": result["bytes"], "busbw_GBps": result["busbw_GBps"]}]
    measured = []
    for wanted in expected.get("sizes") or [expected["size"]]:
        match = [s for s in sizes if abs(s["bytes"] - wanted) <= wanted * 0.01]
        if not match:
            return None
        measured.append(float(match[-1]["busbw_GBps"]))
    return measured


_USING_NETWORK = re.compile(r"NCCL INFO Using network (\S+)")


def smoke_verdict(
    result, log_lines, network=None, expected=None, gpus_per_node=0, ranks=None, statuses=None
):
    """The smoke test's verdict on rank 0's output: findings (it failed: no result from rank 0;
    NCCL did not use the profile's network: the right environment on plain sockets is a
    failure), warnings (bus bandwidth under the machine type's pass mark), the report's line
    and whether it passed. result: the smoke JSON (None when rank 0 printed none); network: the
    NCCL network the profile needs (Socket, FasTrak, gIB); expected: primary_nic's
    network_profile.expected (None where nothing is known); ranks: {host: rank}; statuses:
    {host: job_status report of its smoke container}, read after a failure."""
    found, warnings = [], []
    if not result:
        found.append(_smoke_failed(log_lines, ranks or {}, statuses or {}))
    used = [m.group(1) for m in (_USING_NETWORK.search(line) for line in log_lines) if m]
    nccl = (result or {}).get("backend") == "nccl"
    if nccl and network and network != "Socket":
        if not used:
            found.append(
                _finding(
                    "nccl-network-unseen",
                    "NCCL's INFO log of the smoke test names no network (no 'Using network' "
                    "line): it cannot be told whether %s was used" % network,
                    "keep NCCL_DEBUG unset in llamafactory_env (the smoke test sets INFO), and "
                    "check the smoke container's log",
                )
            )
        elif any(name != network for name in used):
            others = sorted(set(name for name in used if name != network))
            found.append(
                _finding(
                    "network-plugin-not-used",
                    "NCCL used %s, not %s: the profile's plugin did not load and NCCL fell back "
                    "(the job would run at a fraction of the network)"
                    % (", ".join(others), network),
                    "read the NCCL INFO lines before 'Using network' in the smoke test's log: the "
                    "plugin's folder and LD_LIBRARY_PATH (host setup, role nccl_plugin), RxDM "
                    "running (tcpxo), the RDMA devices (gib)",
                )
            )
    if not result:
        return {"findings": found, "warnings": warnings, "line": "", "passed": False}
    line = "%s of %.1f MB across %s ranks (%s): bus bandwidth %s GB/s (algorithm %s GB/s)" % (
        result.get("collective", "all_reduce"),
        result["bytes"] / 1e6,
        result["world_size"],
        result["backend"],
        result["busbw_GBps"],
        result["algbw_GBps"],
    )
    if used:
        line += "; NCCL network %s" % used[-1]
    measured = _measured_at(result, expected) if nccl and expected else None
    if measured is not None and int(gpus_per_node or 0) == int(expected.get("gpus") or 0):
        busbw = round(sum(measured) / len(measured), 3)
        sizes = _gib_list(expected["sizes"])
        line += "; average busbw over %s GiB %s GB/s" % (sizes, busbw)
        if expected.get("threshold") is None:
            line += " (no pass mark known for this machine type over its transport: %s)" % (
                expected.get("source"),
            )
        else:
            line += ", %.0f%% of the pass mark %s GB/s" % (
                100 * busbw / expected["threshold"],
                expected["threshold"],
            )
        if expected.get("published"):
            line += "; %.0f%% of the published %s GB/s (peak, %d GiB)" % (
                100 * float(result["busbw_GBps"]) / expected["published"],
                expected["published"],
                expected["size"] >> 30,
            )
        if expected.get("threshold") is not None and busbw < expected["threshold"]:
            warnings.append(
                "average bus bandwidth %s GB/s is under the pass mark %s GB/s of Google's "
                "cluster-health-scanner for this machine type (%s, average over %s GiB): check "
                "the GPU NICs (MTU, count), compact placement, and the plugin's version"
                % (busbw, expected["threshold"], expected["collective"], sizes)
            )
    elif expected and nccl:
        line += (
            " (no fraction: the pass mark is for %s averaged over %s GiB on nodes of %s "
            "GPUs)"
            % (
                expected["collective"],
                _gib_list(expected["sizes"]),
                expected.get("gpus"),
            )
        )
    return {"findings": found, "warnings": warnings, "line": line, "passed": not found}


# The line a Python traceback ends with ("RuntimeError: ...", "torch...ChildFailedError:").
_EXCEPTION_LINE = re.compile(r"^(\[rank\d+\]:\s*)?[\w.]*(Error|Exception|Failure)\b.*:")


# torchrun's summary of the failure ("exitcode  : -14", "traceback : Signal 14 (SIGALRM) ...").
_ROOT_CAUSE = re.compile(r"^(exitcode|traceback)\s*:")
# smoke_allreduce.py's line once init_process_group returned.
_JOINED = re.compile(r"smoke test: rank \d+ of \d+ joined")


def _smoke_failed(log_lines, ranks, statuses):
    """The finding for a smoke test whose rank 0 printed no result: the ranks that exited
    non-zero, the first one first, with its errors (else its last lines) and the known causes
    found in them (rank 0's output alone where every node's was not read)."""
    failed = []
    for host, status in statuses.items():
        container = (status or {}).get("container") or {}
        if container.get("state") == "exited" and container.get("exit_code") not in (0, None):
            failed.append((container.get("finished_at") or 0, ranks.get(host, 0), host))
    failed.sort()
    hosts = sorted(ranks, key=ranks.get)
    first = failed[0][2] if failed else (hosts[0] if hosts else None)
    if first is not None and (statuses.get(first) or {}).get("container"):
        lines = statuses[first].get("log_lines") or []
        ended = _job_state.describe(statuses[first])
    else:
        lines, ended = list(log_lines), "printed no result"
    across = " (torchrun across %d node%s)" % (len(ranks), "s"[: len(ranks) > 1]) if ranks else ""
    cause = "the smoke test%s failed: rank %s%s %s%s" % (
        across,
        ranks.get(first, 0),
        " (%s)" % first if first else "",
        ended,
        " first" if len(failed) > 1 else "",
    )
    if len(failed) > 1:
        cause += "; then " + ", ".join(
            "rank %s (%s) %s" % (rank, host, _job_state.describe(statuses[host]))
            for _when, rank, host in failed[1:]
        )
    shown = [line.strip() for line in lines if line.strip()]
    errors = [line for line in shown if _EXCEPTION_LINE.match(line) or _ROOT_CAUSE.match(line)]
    if errors:
        cause += ". Its errors: " + " | ".join(list(dict.fromkeys(errors))[-3:])
    elif shown:
        cause += ". Its last lines: " + " | ".join(shown[-8:])
    known = _diagnosis.diagnose("\n".join(lines))
    if any("SIGALRM" in line for line in shown):
        joined = any(_JOINED.search(line) for line in shown)
        known.append(
            _finding(
                "smoke-test-deadline",
                "It reached the smoke test's deadline (SIGALRM, preflight_timeout) %s"
                % (
                    "in its collective"
                    if joined
                    else "before the ranks joined: their connections to each other hang"
                ),
                "open every TCP port between the nodes: Gloo and NCCL connect on ephemeral "
                "ports (32768-60999 on Linux), which the probes do not reach (they test "
                "MASTER_PORT, the preflight and agents' ports); a larger preflight_timeout "
                "where the collective is only slow",
            )
        )
    fix = "; ".join(f["fix"] for f in known) or (
        "the probes passed, so the nodes reach each other: read the rank's lines above (a "
        "rendezvous timeout, an import error of the image's torch, an NCCL or Gloo error naming "
        "the interface: NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME come from discovery, "
        "llamafactory_env may override them), or set preflight_smoke_test: false to launch "
        "without it"
    )
    if known:
        cause += ". " + "; ".join(f["cause"] for f in known)
    return _finding("smoke-test-failed", cause, fix)


def warnings(nodes):
    """What does not stop the launch but costs speed: GPU nodes of a plugin profile that are
    not all in one placement policy (GPU clusters use a compact one; the gcp_compute inventory
    says which each VM is in: nodes' `placement`, None where unknown)."""
    gpu = dict((h, n) for h, n in nodes.items() if (n.get("profile") or "socket") != "socket")
    known = dict((h, n.get("placement")) for h, n in gpu.items())
    # None: not known (a static inventory); []: in no policy.
    if len(gpu) < 2 or any(p is None for p in known.values()):
        return []
    policies = set(tuple(sorted(p)) for p in known.values())
    if len(policies) == 1 and () not in policies:
        return []
    return [
        "the GPU nodes are not all in one placement policy (%s): without a compact placement "
        "policy (COLLOCATED) their network may cross more hops than the machine type's "
        "figures assume; create the VMs with one (gcloud compute resource-policies create "
        "group-placement --collocation=collocated)"
        % ", ".join(
            "%s %s" % (h, ",".join(p.rsplit("/", 1)[-1] for p in (known[h] or [])) or "none")
            for h in sorted(known)
        )
    ]


def _gpu_health_read(facts):
    """The node's GPU health as the preflight read it (async_status of the check started in the
    background; None where none ran), or its start's result where the check could not start."""
    read = facts.get("preflight_gpu_health_result")
    started = facts.get("preflight_gpu_health_job") or {}
    if started.get("failed") and (not isinstance(read, dict) or read.get("skipped")):
        return started
    if isinstance(read, dict) and read.get("started") and not read.get("finished"):
        return dict(read, failed=True, msg="it did not end within its time")
    return read


def node_reports(hosts, hostvars, master, host_network):
    """Every node's report and discovery facts, read once on the controller from each node's
    registered results and facts (hostvars): {'reports': host -> the probe's read with the
    start's error, GPU health, TCPXO's receive-datapath-manager and the missing paths;
    'nodes': host -> rank, address, interface, MTU, profile, placement}."""
    gathered = dict(hostvars[master].get("preflight_gathered") or {})
    reports, nodes = {}, {}
    for host in hosts:
        facts = hostvars[host]
        probe = facts.get("preflight_probe") or {}
        if not probe.get("skipped"):
            read = dict(probe)  # read by itself
        elif host == master:
            read = dict(gathered)  # rank 0's own, read with the others it gathered
        else:
            read = dict((gathered.get("gathered") or {})[host])
        start = facts.get("preflight_probe_start") or {}
        start_failed = bool(start.get("failed"))  # Ansible's `failed` test
        start_error = (start.get("msg") or "") if start_failed else ""
        if start_failed:
            read["error"] = start_error or "the probe did not start"
        nic = facts.get("primary_nic") or {}
        network_profile = nic.get("network_profile") or {}
        profile = network_profile.get("profile") if host_network else "socket"
        # What the start looked at on the host (a failed start returns it too).
        checks = start.get("host_checks") or {}
        rxdm = None
        if profile == "tcpxo":
            found = checks.get("rxdm") or {}
            rxdm = {
                "state": (found.get("container") or {}).get("state", "missing"),
                "log_lines": found.get("log_lines", []),
            }
        missing = checks.get("missing_paths") or []
        read.update(
            listener=dict(read.get("listener") or {}, error=start_error),
            gpu_health=_gpu_health_read(facts),
            rxdm=rxdm,
            missing_mounts=[item["path"] for item in missing if "kind" not in item],
            missing_network=[item for item in missing if "kind" in item],
        )
        reports[host] = read
        placement = facts.get("gcp_resourcePolicies")
        if placement is None and "gcp_name" in facts:
            placement = []  # a GCP VM in no placement policy
        nodes[host] = {
            "rank": int(facts["discover_network_rank"]),
            "address": nic.get("address"),
            "interface": nic.get("interface"),
            "mtu": nic.get("mtu"),
            "method": nic.get("method", ""),
            "profile": profile,
            "machine_type": network_profile.get("machine_type"),
            "profile_problems": network_profile.get("problems", []),
            # The placement policies the VM is in, by the gcp_compute inventory (none: unknown).
            "placement": placement,
        }
    return {"reports": reports, "nodes": nodes}
