# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Network profiles of GCP's GPU machine families: which NCCL transport a node uses, which of its
NICs carry it, and the environment, mounts and devices its ranks need.

Pure functions and data: the layout (netdevs, their PCI addresses, the machine type from GCE
metadata) is gathered on the node by the caller. Every value set here comes from Google's public
recipes; `SOURCES` names them (repository@commit:path) and each table says which it follows.

Profiles:
- socket: NCCL's socket transport over the one training NIC (N1/G2/A2 and anything unknown).
- tcpxo: GPUDirect-TCPXO ("FasTrak"): a control NIC plus 4 (A3 High) or 8 (A3 Mega) GPU NICs,
  Google's NCCL plugin in /var/lib/tcpxo/lib64 and its RxDM daemon on the host.
- gib: RDMA over RoCE with Google's gIB NCCL plugin: two gVNIC control NICs plus 8 CX-7 NICs
  (A3 Ultra, A4).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

PROFILES = ("socket", "tcpxo", "gib")
CHOICES = ("auto", *PROFILES)

_CT = "GoogleCloudPlatform/cluster-toolkit"
_CHS = "GoogleCloudPlatform/cluster-health-scanner@81c525d897f4e85a4f69dd1e389379de6f1e07c2:"
_CEA = "GoogleCloudPlatform/container-engine-accelerators@992db81257553607f1477945f1b3219632991829:"
_TCPXO = "google/nccl-plugin-gpudirect-tcpxo@04815d1bb89971577c7330f9873b70644b3a5934:"
_SLURM = "GoogleCloudPlatform/slurm-gcp@13fd92b615c030b9ba62e4a87d610bcc7af72b75:"
# repository@commit:path[:lines]. The fixture tests/unit/fixtures/network_profile/recipes.json
# quotes the lines each value comes from.
SOURCES = {
    "ct-a3high-tcpxo": _CT + "@146b72d8212e4831d30df5cfe4516d9d435fbeec:"
    "examples/machine-learning/a3-highgpu-8g/nccl-tests/run-nccl-tests.sh",
    "ct-a3mega": _CT + "@1047080375afbb44da4b596be314634e7486af4a:"
    "examples/machine-learning/a3-megagpu-8g/nccl-tests/run-nccl-tests.sh",
    # Sourced in the container: it sets the tuned NCCL_* values, NCCL_NVLSTREE_MAX_CHUNKSIZE=131072
    # among them (line 53; the guest config checker enforces it), so none is repeated here.
    "tcpxo-profile": _TCPXO + "tcpxo_scripts/nccl-env-profile.sh",
    "ct-a3ultra": _CT + "@1047080375afbb44da4b596be314634e7486af4a:"
    "examples/machine-learning/a3-ultragpu-8g/nccl-tests/run-nccl-tests.sh",
    # The older recipe (December 2024) that mounted /var/lib/gib as itself and had to override
    # the two config paths set_nccl_env.sh hard-codes under /usr/local/gib.
    "ct-a3ultra-gib-var": _CT + "@2123ba50d7a0ed5d82f7fbf95a818aaf92860b67:"
    "examples/machine-learning/a3-ultragpu-8g/nccl-tests/run-nccl-tests.sh",
    # GKE: the installer image writes /var/lib/gib (copied to the host), the workload mounts the
    # host's copy at /usr/local/gib and sources /usr/local/gib/scripts/set_nccl_env.sh.
    "cea-gib-installer": _CEA + "gpudirect-rdma/nccl-rdma-installer.yaml:58-76",
    "cea-gib-test": _CEA + "gpudirect-rdma/nccl-test.yaml:74-88",
    "ct-a4": _CT + "@0532a8f49829b6eb3647ca54e1db1c5722485ec0:"
    "examples/machine-learning/a4-highgpu-8g/system_benchmarks/run-nccl-tests-via-ramble.sh",
    "ct-a3ultra-blueprint": _CT + "@0072d1c01cf5ee90fe707b60a414d7c49947a145:"
    "examples/machine-learning/a3-ultragpu-8g/a3ultra-slurm-blueprint.yaml",
    "ct-a3mega-blueprint": _CT + "@0092a791557aaf605bf63b1d73a51af4d0b0c0b0:"
    "examples/machine-learning/a3-megagpu-8g/a3mega-slurm-blueprint.yaml",
    "ct-gpu-rdma-vpc": _CT + "@08a7a7daff4e1f46e57ab22eba3a2b0c3308e4ff:"
    "modules/network/gpu-rdma-vpc/variables.tf",
    # RxDM's host setup and the plugin/RxDM pair (role nccl_plugin): modprobe import-helper
    # (line 29), the images v1.0.17 / v1.0.23 (31-32), gcloud auth configure-docker
    # us-docker.pkg.dev before the pulls (38).
    "slurm-rxdm-prolog": _SLURM + "tools/prologs-epilogs/receive-data-path-manager-mega",
    # The pass marks: BANDWIDTH_THRESHOLD per machine family (a3: TCPX, USE_TCPX true at line
    # 39; a3plus: A3 Mega; a3ultra; a4), START/END_MESSAGE_SIZE 2G/8G (lines 31-32), compared
    # with nccl-tests' "# Avg bus bandwidth" of the default BENCHMARK all_gather_perf.
    "chs-nccl": _CHS + "deploy/helm/health_checks/nccl_healthcheck/{a3,a3plus,a3ultra,a4}.yaml:"
    "31-38",
    "chs-rule": _CHS + "src/nccl_healthcheck/nccl_startup.py:36,301,421",
    "chs-nofile": _CHS + "src/nccl_healthcheck/run-nccl-combined-plugins.sh:45-46",
    "gcp-nccl-vms": "https://docs.cloud.google.com/ai-hypercomputer/docs/nccl/test-vms "
    "(Enable NCCL/gIB: the INFO line 'Using network gIB')",
    "dstack-gcp": "dstackai/dstack@1dc61213578c80204db94d60f36ebdd9ae90ca77:"
    "examples/clusters/gcp/README.md",
}

# The machine types with GPU NICs. control_nics: NCCL_SOCKET_IFNAME of the recipe; gpu_nic_slots:
# the GPU NICs' PCI addresses (how Google's scripts find them); gpu_nic_names: their names when
# found by name (both naming schemes: enp6s0 and enp6s0f0 on A3 High).
MACHINE_TYPES = {
    "a3-highgpu-8g": {
        "profile": "tcpxo",
        "gpus": 8,
        "control_nics": ["enp0s12"],
        "gpu_nic_slots": ["0000:06:00.0", "0000:0c:00.0", "0000:86:00.0", "0000:8c:00.0"],
        "gpu_nic_names": [
            ["enp6s0", "enp6s0f0"],
            ["enp12s0", "enp12s0f0"],
            ["enp134s0", "enp134s0f0"],
            ["enp140s0", "enp140s0f0"],
        ],
        "gpu_nic_mtu": None,  # not set by the recipe (its VPCs take the module's default)
        "source": "ct-a3high-tcpxo",
    },
    "a3-megagpu-8g": {
        "profile": "tcpxo",
        "gpus": 8,
        "control_nics": ["enp0s12"],
        "gpu_nic_slots": [
            "0000:06:00.0",
            "0000:07:00.0",
            "0000:0d:00.0",
            "0000:0e:00.0",
            "0000:86:00.0",
            "0000:87:00.0",
            "0000:8d:00.0",
            "0000:8e:00.0",
        ],
        "gpu_nic_names": [
            [name]
            for name in (
                "enp6s0",
                "enp7s0",
                "enp13s0",
                "enp14s0",
                "enp134s0",
                "enp135s0",
                "enp141s0",
                "enp142s0",
            )
        ],
        "gpu_nic_mtu": None,
        "source": "ct-a3mega",
    },
    "a3-ultragpu-8g": {
        "profile": "gib",
        "gpus": 8,
        "control_nics": ["enp0s19", "enp192s20"],
        "gpu_nic_slots": [],  # not published: found by their RDMA device or their names
        "gpu_nic_names": [["gpu%drdma0" % i] for i in range(8)],
        "gpu_nic_mtu": 8896,  # gpu-rdma-vpc's default MTU (ct-gpu-rdma-vpc)
        "source": "ct-a3ultra",
    },
    "a4-highgpu-8g": {
        "profile": "gib",
        "gpus": 8,
        "control_nics": ["enp0s19", "enp192s20"],
        "gpu_nic_slots": [],
        "gpu_nic_names": [["gpu%drdma0" % i] for i in range(8)],
        "gpu_nic_mtu": 8896,
        "source": "ct-a4",
    },
}

# Where each profile's plugin lives on the host (what its installer image writes, role
# nccl_plugin), and where the rank containers see it. gib: Google's set_nccl_env.sh hard-codes
# /usr/local/gib/configs/... (the tuner and guest config checker files; a wrong
# NCCL_TUNER_CONFIG_PATH crashes NCCL), so the host's /var/lib/gib is mounted at /usr/local/gib,
# as GKE's recipe does (cea-gib-installer, cea-gib-test) and cluster-toolkit's since it dropped
# its two overrides (ct-a3ultra against ct-a3ultra-gib-var). tcpxo: the same path on both sides
# (ct-a3mega, ct-a3high-tcpxo).
PLUGIN_DIRS = {"tcpxo": "/var/lib/tcpxo/lib64", "gib": "/var/lib/gib"}
CONTAINER_DIRS = {"tcpxo": "/var/lib/tcpxo/lib64", "gib": "/usr/local/gib"}
ENV_SCRIPTS = {"tcpxo": "nccl-env-profile.sh", "gib": "scripts/set_nccl_env.sh"}
LIBRARY_DIRS = {"tcpxo": "", "gib": "lib64"}
APERTURE_DEVICES = "/dev/aperture_devices"  # TCPXO's LLCM devices (ct-a3high-tcpxo)
RDMA_DEVICES = "/dev/infiniband"  # the RDMA verbs devices a gIB rank opens
# A3 High over TCPXO: Google's script points the guest config checker at a file of its own that
# disables its env-var, attention-keyword and CPU-affinity checks (ct-a3high-tcpxo, lines
# 93-98 and 112). Role nccl_plugin writes the same three lines into the plugin folder (after
# each install) under this name; the checker reads it in the container.
GUEST_CONFIG_CHECKS_DISABLED = {
    "a3-highgpu-8g": {
        "file": "hostnet-a3high-guest-config.textproto",
        "lines": [
            "env_var_check_level: CHECK_DISABLED",
            "attention_keyword_check_level: CHECK_DISABLED",
            "cpu_affinity_check_level: CHECK_DISABLED",
        ],
        "source": "ct-a3high-tcpxo",
    }
}

GIB = 1 << 30
# The pass marks, as data: two nodes of 8 GPUs, the collective, the message sizes and the rule
# (the average bus bandwidth over those sizes, nccl-tests' "# Avg bus bandwidth" of a 2G..8G
# sweep doubling: 2, 4 and 8 GiB), the mark in GB/s and its source; published: a measured
# figure (peak busbw at 8 GiB, same collective) for the report, or None. A mark of None: no
# source for this machine type over this transport (cluster-health-scanner's a3-highgpu-8g mark,
# 60, is for TCPX, not the TCPXO the collection runs there).
PASS_MARKS = {
    "a3-highgpu-8g": {
        "collective": "all_gather",
        "sizes": [2 * GIB, 4 * GIB, 8 * GIB],
        "rule": "average",
        "threshold": None,
        "source": "chs-nccl (a3.yaml: 60 GB/s, for TCPX; no TCPXO mark published)",
        "published": None,  # dstack's 50.2 GB/s is TCPX too
    },
    "a3-megagpu-8g": {
        "collective": "all_gather",
        "sizes": [2 * GIB, 4 * GIB, 8 * GIB],
        "rule": "average",
        "threshold": 150,
        "source": "chs-nccl (a3plus.yaml:38), chs-rule",
        "published": 188.5,  # dstack-gcp
    },
    "a3-ultragpu-8g": {
        "collective": "all_gather",
        "sizes": [2 * GIB, 4 * GIB, 8 * GIB],
        "rule": "average",
        "threshold": 250,
        "source": "chs-nccl (a3ultra.yaml:38), chs-rule",
        "published": None,
    },
    "a4-highgpu-8g": {
        "collective": "all_gather",
        "sizes": [2 * GIB, 4 * GIB, 8 * GIB],
        "rule": "average",
        "threshold": 250,
        "source": "chs-nccl (a4.yaml:38), chs-rule",
        "published": None,  # dstack's 683.5 GB/s is all_reduce, above the NICs' line rate
    },
}

# The network NCCL names in its INFO log ("NCCL INFO Using network X") when the profile's
# plugin is in use: gIB as Google's "Run NCCL on Compute Engine instances" shows it (gcp-nccl-vms);
# FasTrak, the TCPXO plugin's network (its NCCL_FASTRAK_* variables); Socket, NCCL's own TCP.
NCCL_NETWORKS = {"socket": "Socket", "tcpxo": "FasTrak", "gib": "gIB"}

_PCI_SLOT = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# A host (gVNIC) NIC's slot on bus 0, as nccl-env-profile.sh tells it from the GPU NICs.
_HOST_SLOT = re.compile(r"^[0-9a-f]{4}:00:[0-9a-f]{2}\.0$")


class ProfileError(Exception):
    """A profile that cannot be used on this node; the message names the fix."""


def machine_type_name(value):
    """`projects/123/machineTypes/a3-megagpu-8g` (GCE metadata's answer) -> `a3-megagpu-8g`."""
    if not value:
        return None
    return str(value).rstrip("/").rsplit("/", 1)[-1]


def choose_profile(requested, machine_type):
    """(profile, why) for a node: `requested` is llamafactory_network_profile."""
    if requested not in CHOICES:
        raise ProfileError("network profile %r is not one of %s" % (requested, ", ".join(CHOICES)))
    known = MACHINE_TYPES.get(machine_type or "")
    if requested != "auto":
        if requested != "socket" and known and known["profile"] != requested:
            raise ProfileError(
                "network profile %s was asked for, but %s uses %s (%s): set it to %s or auto"
                % (
                    requested,
                    machine_type,
                    known["profile"],
                    SOURCES[known["source"]],
                    known["profile"],
                )
            )
        return requested, "set"
    if known:
        return known["profile"], "machine type %s" % machine_type
    if machine_type:
        return "socket", "machine type %s has no GPU NICs" % machine_type
    return "socket", "no machine type known (not on GCE, or its metadata did not answer)"


def _slot_of(nic):
    slot = (nic.get("pci_slot") or "").lower()
    return slot if _PCI_SLOT.match(slot) else None


def find_nics(profile, machine_type, nics, rdma_netdevs=(), primary=None):
    """The control and GPU NICs of a node of `profile`, found as Google's scripts find them.

    nics: [{name, up, mtu, ipv4: [(address, prefix)], pci_slot, driver}] (the node's netdevs);
    rdma_netdevs: names of netdevs that have an RDMA device (/sys/class/net/X/device/infiniband);
    primary: the training NIC found by route or metadata, the control NIC of last resort.
    Returns {control, gpu: [names], candidates: [{name, pci_slot, role, reason}], problems}.
    Problems are findings for the preflight (count, MTU, state); errors that make the profile
    unusable raise ProfileError.
    """
    layout = MACHINE_TYPES.get(machine_type or "")
    by_name = dict((nic["name"], nic) for nic in nics)
    roles = {}
    problems = []
    if profile == "socket":
        return {"control": [], "gpu": [], "candidates": [], "problems": []}
    if profile == "tcpxo" and layout is None:
        raise ProfileError(
            "the tcpxo profile needs the GPU NICs' PCI addresses of the machine type, and %s is "
            "not one of %s: use the socket profile, or auto"
            % (
                machine_type or "this node's machine type (unknown)",
                ", ".join(t for t, v in sorted(MACHINE_TYPES.items()) if v["profile"] == "tcpxo"),
            )
        )

    gpu = []
    if profile == "tcpxo":
        slot_index = dict((_slot_of(nic), nic["name"]) for nic in nics if _slot_of(nic))
        for i, slot in enumerate(layout["gpu_nic_slots"]):
            if slot in slot_index:
                gpu.append(slot_index[slot])
                roles[slot_index[slot]] = ("gpu", "PCI address %s" % slot)
                continue
            named = next((n for n in layout["gpu_nic_names"][i] if n in by_name), None)
            if named:
                gpu.append(named)
                roles[named] = ("gpu", "name %s (PCI address %s not seen)" % (named, slot))
    else:  # gib
        rdma = set(rdma_netdevs)
        names = [n for group in (layout or {}).get("gpu_nic_names", []) for n in group]
        for nic in nics:
            if nic["name"] in rdma:
                roles[nic["name"]] = ("gpu", "has an RDMA device")
            elif nic["name"] in names:
                roles[nic["name"]] = ("gpu", "name %s (no RDMA device seen)" % nic["name"])
        gpu = sorted((n for n, r in roles.items() if r[0] == "gpu"), key=_natural)

    if not gpu:
        raise ProfileError(
            "no GPU NIC found for the %s profile on this node (%s): the VM was created without its "
            "GPU networks, or the profile does not fit its machine type; use the socket profile "
            "or create the VM with its GPU NICs" % (profile, _listing(nics))
        )
    control = []
    wanted = (layout or {}).get("control_nics") or []
    for name in wanted:
        if name in by_name and name not in roles:
            control.append(name)
            roles[name] = ("control", "the recipe's control NIC %s" % name)
    if not control:
        # Other image, other names: the gVNIC NICs on PCI bus 0, as nccl-env-profile.sh finds
        # the host NIC.
        for nic in nics:
            slot = _slot_of(nic)
            if nic["name"] not in roles and slot and _HOST_SLOT.match(slot):
                control.append(nic["name"])
                roles[nic["name"]] = ("control", "a host NIC on PCI bus 0 (%s)" % slot)
        control = control[: len(wanted) or 1]
    if not control and primary in by_name and primary not in roles:
        control = [primary]
        roles[primary] = ("control", "the training NIC (the route to the peers, or nic0)")
    if not control:
        raise ProfileError(
            "no control NIC found for the %s profile (expected %s, or a NIC on PCI bus 0): set "
            "llamafactory_interface to the NIC that holds the VM's internal address"
            % (profile, ", ".join(wanted) or "one")
        )

    expected = len((layout or {}).get("gpu_nic_names") or []) or None
    if expected and len(gpu) != expected:
        problems.append(
            {
                "id": "gpu-nic-count",
                "detail": "%d GPU NICs found (%s), %s has %d"
                % (len(gpu), ", ".join(gpu), machine_type, expected),
            }
        )
    mtu = (layout or {}).get("gpu_nic_mtu")
    for name in gpu:
        nic = by_name[name]
        if not nic.get("up"):
            problems.append({"id": "gpu-nic-down", "detail": "%s is down" % name})
        elif not nic.get("ipv4"):
            problems.append({"id": "gpu-nic-no-address", "detail": "%s has no IPv4 address" % name})
        if mtu and nic.get("mtu") != mtu:
            problems.append(
                {
                    "id": "gpu-nic-mtu",
                    "detail": "%s has MTU %s, %s's GPU networks %s"
                    % (name, nic.get("mtu"), machine_type, mtu),
                }
            )

    candidates = []
    for nic in nics:
        role, reason = roles.get(nic["name"], (None, "not a control or GPU NIC of %s" % profile))
        candidates.append(
            {"name": nic["name"], "pci_slot": _slot_of(nic), "role": role, "reason": reason}
        )
    return {"control": control, "gpu": gpu, "candidates": candidates, "problems": problems}


def _natural(name):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _listing(nics):
    return (
        ", ".join("%s%s" % (n["name"], " (%s)" % _slot_of(n) if _slot_of(n) else "") for n in nics)
        or "no NICs"
    )


def socket_env(nic):
    """NCCL's and Gloo's NIC for the socket transport over `nic`. Exact name ("="): a prefix like
    enp0s1 would also match enp0s12."""
    return {"NCCL_SOCKET_IFNAME": "=%s" % nic, "GLOO_SOCKET_IFNAME": nic}


def rank_setup(profile, primary, control=(), gpu=(), plugin_dir=None, machine_type=None):
    """What a rank's container needs for `profile`: env (explicit values), env_script (sourced
    before them, in the container), library_path (prepended to LD_LIBRARY_PATH), volumes and
    devices; paths: what the node must have for them ([{path, kind}], kind env_script, device
    or volume: host paths, the preflight looks for them). primary: the training NIC
    (MASTER_ADDR's side, Gloo's); plugin_dir: the plugin's folder on the host when not the
    installer's (PLUGIN_DIRS); machine_type: for its own settings (A3 High's guest config
    checker). NCCL_IB_DISABLE is the job's (llamafactory_nccl_ib_disable, socket profile only):
    RDMA is gIB's point."""
    if profile == "socket":
        return {
            "env": socket_env(primary),
            "env_script": None,
            "library_path": [],
            "volumes": [],
            "devices": [],
            "paths": [],
        }
    if profile not in PLUGIN_DIRS:
        raise ProfileError("network profile %r is not one of %s" % (profile, ", ".join(PROFILES)))
    host = (plugin_dir or PLUGIN_DIRS[profile]).rstrip("/")
    inside = CONTAINER_DIRS[profile]
    control = list(control) or [primary]
    script = "%s/%s" % (inside, ENV_SCRIPTS[profile])
    library = ("%s/%s" % (inside, LIBRARY_DIRS[profile])).rstrip("/")
    # Exact names ("="): a prefix like enp0s1 would also match enp0s12.
    socket_ifname = "=" + ",".join(control)
    extra_paths = []
    if profile == "tcpxo":
        env = {
            "NCCL_LIB_DIR": inside,
            "NCCL_FASTRAK_CTRL_DEV": control[0],
            "NCCL_FASTRAK_IFNAME": ",".join(gpu),
            "NCCL_SOCKET_IFNAME": socket_ifname,
            "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY": APERTURE_DEVICES,
            "GLOO_SOCKET_IFNAME": primary,
        }
        checker = GUEST_CONFIG_CHECKS_DISABLED.get(machine_type or "")
        if checker:
            env["NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE"] = "%s/%s" % (
                inside,
                checker["file"],
            )
            extra_paths.append({"path": "%s/%s" % (host, checker["file"]), "kind": "volume"})
        volumes = ["%s:%s:ro" % (host, inside), "%s:%s" % (APERTURE_DEVICES, APERTURE_DEVICES)]
        devices = []
    else:
        env = {
            "NCCL_NET": "gIB",
            "NCCL_SOCKET_IFNAME": socket_ifname,
            "GLOO_SOCKET_IFNAME": primary,
        }
        volumes = ["%s:%s:ro" % (host, inside)]
        devices = [RDMA_DEVICES]
    paths = [{"path": "%s/%s" % (host, ENV_SCRIPTS[profile]), "kind": "env_script"}]
    paths += [{"path": device, "kind": "device"} for device in devices]
    for volume in volumes:
        source = volume.split(":")[0]
        paths.append({"path": source, "kind": "device" if source.startswith("/dev/") else "volume"})
    return {
        "env": env,
        "env_script": script,
        "library_path": [library, "/usr/lib/x86_64-linux-gnu"],
        "volumes": volumes,
        "devices": devices,
        "paths": paths + extra_paths,
    }


def expected_bandwidth(machine_type, profile):
    """What the smoke test measures against on `machine_type` with `profile`: its pass mark
    (PASS_MARKS: collective, sizes, rule, threshold - None where unknown -, source, published)
    with sweep_bytes (the sizes the smoke test runs: the mark's own), size (the largest) and the
    GPUs per node it applies to; None for the socket profile or an unknown type."""
    mark = PASS_MARKS.get(machine_type or "")
    if profile == "socket" or not mark:
        return None
    return dict(
        mark,
        sweep_bytes=list(mark["sizes"]),
        size=max(mark["sizes"]),
        gpus=MACHINE_TYPES[machine_type]["gpus"],
    )
