"""The machine types the box's Compute Engine API knows (machineTypes.get), with Google's
published figures (https://cloud.google.com/compute/docs/gpus, the general-purpose and
accelerator-optimized machine family pages): vCPUs, memory, built-in GPUs, and the regional CPU
quota each family counts against (https://cloud.google.com/compute/resource-usage: N1 counts
against CPUS; E2, N2 and A2 against their own E2_CPUS, N2_CPUS, A2_CPUS, metrics of
compute.v1.json's Quota enum). G2, A3 and A4 count against CPUS here: the enum has no G2_CPUS,
A3_CPUS or A4_CPUS, so regions.get could not list them. Not confirmed from Google's pages here:
whether those families have a CPU quota of their own in Cloud Quotas, and whether CPUS also
counts the families with their own metric (not here: only CPUS_ALL_REGIONS, a global quota the
fake leaves out, counts every vCPU).

Also the quota metric of each GPU, as the Compute Engine quota page names them. regions.get
lists only the metrics of compute.v1.json's Quota enum (the JSON is printed from that enum, so
GCE cannot list another); the others (NVIDIA_H100_GPUS, NVIDIA_H200_GPUS...: Cloud
Quotas' own) are UNLISTED: still enforced at insert, whose QUOTA_EXCEEDED names them.
"""

from __future__ import annotations

# name -> (guestCpus, memoryMb, accelerator type or None, GPUs per VM)
TYPES = {
    "e2-standard-2": (2, 8192, None, 0),
    "e2-standard-4": (4, 16384, None, 0),
    "e2-standard-8": (8, 32768, None, 0),
    "n1-standard-4": (4, 15360, None, 0),
    "n1-standard-8": (8, 30720, None, 0),
    "n1-standard-16": (16, 61440, None, 0),
    "n2-standard-2": (2, 8192, None, 0),
    "n2-standard-4": (4, 16384, None, 0),
    "n2-standard-8": (8, 32768, None, 0),
    "n2-standard-16": (16, 65536, None, 0),
    "g2-standard-4": (4, 16384, "nvidia-l4", 1),
    "g2-standard-8": (8, 32768, "nvidia-l4", 1),
    "g2-standard-12": (12, 49152, "nvidia-l4", 1),
    "g2-standard-16": (16, 65536, "nvidia-l4", 1),
    "g2-standard-24": (24, 98304, "nvidia-l4", 2),
    "g2-standard-32": (32, 131072, "nvidia-l4", 1),
    "g2-standard-48": (48, 196608, "nvidia-l4", 4),
    "g2-standard-96": (96, 393216, "nvidia-l4", 8),
    "a2-highgpu-1g": (12, 87040, "nvidia-tesla-a100", 1),
    "a2-highgpu-2g": (24, 174080, "nvidia-tesla-a100", 2),
    "a2-highgpu-4g": (48, 348160, "nvidia-tesla-a100", 4),
    "a2-highgpu-8g": (96, 696320, "nvidia-tesla-a100", 8),
    "a2-ultragpu-1g": (12, 174080, "nvidia-a100-80gb", 1),
    "a2-ultragpu-8g": (96, 1392640, "nvidia-a100-80gb", 8),
    "a3-highgpu-8g": (208, 1916928, "nvidia-h100-80gb", 8),
    "a3-megagpu-8g": (208, 1916928, "nvidia-h100-mega-80gb", 8),
    "a3-ultragpu-8g": (224, 3022848, "nvidia-h200-141gb", 8),
    "a4-highgpu-8g": (224, 4063232, "nvidia-b200", 8),
}
CPU_QUOTAS = {"n2": "N2_CPUS", "e2": "E2_CPUS", "a2": "A2_CPUS"}  # else CPUS
GPU_QUOTAS = {
    "nvidia-tesla-t4": "NVIDIA_T4_GPUS",
    "nvidia-l4": "NVIDIA_L4_GPUS",
    "nvidia-tesla-a100": "NVIDIA_A100_GPUS",
    "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
    "nvidia-h100-80gb": "NVIDIA_H100_GPUS",
    "nvidia-h100-mega-80gb": "NVIDIA_H100_MEGA_GPUS",
    "nvidia-h200-141gb": "NVIDIA_H200_GPUS",
    "nvidia-b200": "NVIDIA_B200_GPUS",
}
# Enforced at insert, but not in compute.v1.json's Quota enum, so regions.get leaves them out
# (PREEMPTIBLE_NVIDIA_H100_GPUS is in the enum, and listed).
UNLISTED = {
    "NVIDIA_H100_GPUS",
    "NVIDIA_H100_MEGA_GPUS",
    "NVIDIA_H200_GPUS",
    "NVIDIA_B200_GPUS",
    "PREEMPTIBLE_NVIDIA_H100_MEGA_GPUS",
    "PREEMPTIBLE_NVIDIA_H200_GPUS",
    "PREEMPTIBLE_NVIDIA_B200_GPUS",
}
# The regional quotas a project starts with here (regions.get), each overridable by the fake's
# config {"quotas": {REGION: {METRIC: LIMIT}}}.
DEFAULT_LIMITS = {
    "CPUS": 1000.0,
    "N2_CPUS": 1000.0,
    "E2_CPUS": 1000.0,
    "A2_CPUS": 1000.0,
    "PREEMPTIBLE_CPUS": 0.0,
    "IN_USE_ADDRESSES": 100.0,
    "INSTANCES": 1000.0,
    "NVIDIA_T4_GPUS": 64.0,
    "NVIDIA_L4_GPUS": 64.0,
    "NVIDIA_A100_GPUS": 64.0,
    "NVIDIA_A100_80GB_GPUS": 64.0,
    "PREEMPTIBLE_NVIDIA_T4_GPUS": 64.0,
    "PREEMPTIBLE_NVIDIA_L4_GPUS": 64.0,
    "PREEMPTIBLE_NVIDIA_A100_GPUS": 64.0,
    "PREEMPTIBLE_NVIDIA_A100_80GB_GPUS": 64.0,
    **{
        f"{prefix}{gpu}": 64.0
        for prefix in ("", "PREEMPTIBLE_")
        for gpu in (
            "NVIDIA_H100_GPUS",
            "NVIDIA_H100_MEGA_GPUS",
            "NVIDIA_H200_GPUS",
            "NVIDIA_B200_GPUS",
        )
    },
}


def cpu_quota(name: str) -> str:
    return CPU_QUOTAS.get(name.split("-", 1)[0], "CPUS")


def resource(project: str, zone: str, name: str, link: str) -> dict | None:
    """machineTypes.get's answer, or None for a type the box does not know."""
    if name not in TYPES:
        return None
    cpus, memory, gpu, count = TYPES[name]
    zone_link = f"{link}projects/{project}/zones/{zone}"
    answer = {
        "kind": "compute#machineType",
        "id": str(abs(hash(name)) % 10**15),
        "creationTimestamp": "2015-01-01T00:00:00.000-07:00",
        "name": name,
        "description": f"{cpus} vCPUs, {memory // 1024} GB RAM",
        "guestCpus": cpus,
        "memoryMb": memory,
        "maximumPersistentDisks": 128,
        "maximumPersistentDisksSizeGb": "263168",
        "zone": zone,
        "selfLink": f"{zone_link}/machineTypes/{name}",
        "isSharedCpu": False,
    }
    if gpu:
        answer["accelerators"] = [{"guestAcceleratorType": gpu, "guestAcceleratorCount": count}]
    return answer


def usage(instance: dict, limits: dict[str, float]) -> dict[str, float]:
    """{metric: amount} one instance takes from its region's quotas (`limits`: the region's); a
    spot VM's GPUs count against the preemptible quota where its limit is above 0, as on GCE."""
    name = instance.get("machineType", "").rsplit("/", 1)[-1]
    cpus, _memory, gpu, count = TYPES.get(name, (0, 0, None, 0))
    taken = {cpu_quota(name): float(cpus), "INSTANCES": 1.0}
    spot = (instance.get("scheduling") or {}).get("provisioningModel") == "SPOT"
    gpus = [(gpu, count)] if gpu else []
    for attached in instance.get("guestAccelerators") or []:
        gpus.append((attached["acceleratorType"].rsplit("/", 1)[-1], attached["acceleratorCount"]))
    for kind, amount in gpus:
        metric = GPU_QUOTAS.get(kind)
        if metric:
            if spot and limits.get(f"PREEMPTIBLE_{metric}", 0) > 0:
                metric = f"PREEMPTIBLE_{metric}"
            taken[metric] = taken.get(metric, 0.0) + float(amount)
    external = sum(
        1
        for nic in instance.get("networkInterfaces") or []
        for config in nic.get("accessConfigs") or []
    )
    if external:
        taken["IN_USE_ADDRESSES"] = float(external)
    return taken
