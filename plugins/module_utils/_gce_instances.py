# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the gce_instances module decides for a job's group of VMs (private): each VM's
instances.insert body, the regional quotas the group needs and which of them fall short, the
state of the group as found, and whether an operation's error moves the group to the next zone.
Pure functions, unit-tested; the module makes the calls (google.cloud's GcpSession).

Contracts: https://cloud.google.com/compute/docs/reference/rest/v1/instances/insert,
.../regions/get (quotas), .../machineTypes/get (guestCpus, accelerators),
https://cloud.google.com/compute/resource-usage (the quota metrics).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.hostnet.llamafactory.plugins.module_utils import (
    _gce_instance,
    _network_profile,
)

API = _gce_instance.API

# The regional quota of each GPU (the accelerator type as machineTypes.get names it); a spot VM
# counts against PREEMPTIBLE_<metric> where the project has that quota (limit > 0), else against
# the standard one (https://cloud.google.com/compute/resource-usage#gpu_quota).
GPU_QUOTAS = {
    "nvidia-tesla-t4": "NVIDIA_T4_GPUS",
    "nvidia-tesla-v100": "NVIDIA_V100_GPUS",
    "nvidia-tesla-p100": "NVIDIA_P100_GPUS",
    "nvidia-l4": "NVIDIA_L4_GPUS",
    "nvidia-tesla-a100": "NVIDIA_A100_GPUS",
    "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
    "nvidia-h100-80gb": "NVIDIA_H100_GPUS",
    "nvidia-h100-mega-80gb": "NVIDIA_H100_MEGA_GPUS",
    "nvidia-h200-141gb": "NVIDIA_H200_GPUS",
    "nvidia-b200": "NVIDIA_B200_GPUS",
}
# A stock-out of the zone: the group moves on to the next zone.
CAPACITY_ERRORS = (*_gce_instance.CAPACITY_ERRORS, "RESOURCE_POOL_EXHAUSTED")
QUOTA_ERRORS = ("QUOTA_EXCEEDED",)
GROUP_LABEL = "llamafactory-group"  # marks a VM this collection created (value: the group)
SCOPE_CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"


# The last part of a resource link ('us-central1-a' of .../zones/us-central1-a).
short = _gce_instance.short_zone


def region_of(zone):
    return short(zone).rsplit("-", 1)[0]


def vm_names(prefix, count):
    return ["%s-%d" % (prefix, rank) for rank in range(count)]


def rank_of(prefix, name):
    """The rank in a group VM's name (prefix-RANK), or None."""
    head, _dash, tail = name.rpartition("-")
    return int(tail) if head == prefix and tail.isdigit() else None


def cpu_metric(machine_type, listed):
    """The regional CPU quota a machine type counts against: its family's (N2_CPUS, G2_CPUS...)
    where the region lists one, else CPUS (N1 and the families without their own quota)."""
    family = machine_type.split("-", 1)[0].upper()
    metric = "%s_CPUS" % family
    return metric if family != "N1" and metric in listed else "CPUS"


def quota_needs(machine, count, spot, accelerators, listed, external_ip=True):
    """{metric: amount} the group needs in its region. `machine`: machineTypes.get's answer;
    `accelerators`: [{type, count}] attached (N1); `listed`: {metric: limit} of the region."""
    needs = {}

    def add(metric, amount):
        needs[metric] = needs.get(metric, 0) + amount

    add(cpu_metric(machine["name"], listed), int(machine.get("guestCpus", 0)) * count)
    gpus = [
        (a.get("guestAcceleratorType"), int(a.get("guestAcceleratorCount", 0)))
        for a in machine.get("accelerators") or []
    ]
    gpus += [(a["type"], int(a["count"])) for a in accelerators or []]
    for kind, per_vm in gpus:
        metric = GPU_QUOTAS.get(kind)
        if metric is None or per_vm <= 0:
            continue
        if spot and listed.get("PREEMPTIBLE_" + metric, 0) > 0:
            metric = "PREEMPTIBLE_" + metric
        add(metric, per_vm * count)
    if external_ip:
        add("IN_USE_ADDRESSES", count)
    return needs


def shortfalls(quotas, needs):
    """[{metric, need, free, limit, usage}] of the needs the region's quotas cannot hold. A
    metric the region does not list is not checked here (the insert's own check names it)."""
    found = dict((q.get("metric"), q) for q in quotas or [])
    short_of = []
    for metric, need in sorted(needs.items()):
        quota = found.get(metric)
        if quota is None:
            continue
        limit, usage = float(quota.get("limit", 0)), float(quota.get("usage", 0))
        if need > limit - usage:
            short_of.append(
                {
                    "metric": metric,
                    "need": need,
                    "free": max(0, int(limit - usage)),
                    "limit": int(limit),
                    "usage": int(usage),
                }
            )
    return short_of


def quota_message(project, region, short_of):
    parts = [
        "%s: the group needs %d, %d free (limit %d, %d in use)"
        % (s["metric"], s["need"], s["free"], s["limit"], s["usage"])
        for s in short_of
    ]
    return (
        "region %s lacks quota - %s. Raise it: https://console.cloud.google.com/iam-admin/quotas"
        "?project=%s (filter on the metric and region), or list zones of another region in "
        "gcp_instances_zones" % (region, "; ".join(parts), project)
    )


def zone_failure(errors):
    """'capacity' or 'quota' when an operation's errors [(code, message)] move the group to the
    next zone, else None."""
    codes = [code for code, _message in errors]
    if any(code in CAPACITY_ERRORS for code in codes):
        return "capacity"
    if any(code in QUOTA_ERRORS for code in codes):
        return "quota"
    return None


def gpu_networks_problem(machine_type, gpu_networks):
    """Why `gpu_networks` cannot serve `machine_type`, or None: a machine type with GPU NICs
    (the network profiles' table) needs one network per NIC besides nic0 - its second gVNIC
    where it has one, then every GPU NIC - and no other type takes any."""
    types = _network_profile.MACHINE_TYPES
    given = len(gpu_networks or [])
    if machine_type not in types:
        if not given:
            return None
        return (
            "gpu_networks lists %d networks but %s has no GPU NICs (only %s have them): leave it "
            "empty" % (given, machine_type, ", ".join(sorted(types)))
        )
    gvnics = len(types[machine_type]["control_nics"]) - 1
    gpu_nics = len(types[machine_type]["gpu_nic_names"])
    if given == gvnics + gpu_nics:
        return None
    nics = ("its second gVNIC, then " if gvnics else "") + "%d GPU NICs" % gpu_nics
    return (
        "gpu_networks lists %d networks but %s has %d NICs besides nic0 (%s): list the network "
        "of each, in that order" % (given, machine_type, gvnics + gpu_nics, nics)
    )


def scheduling(provisioning_model, termination_action, has_gpus):
    """The instance's scheduling: GPUs cannot live-migrate (onHostMaintenance TERMINATE); a spot
    VM is not restarted by GCE (its termination action says what preemption does)."""
    if provisioning_model == "spot":
        return {
            "provisioningModel": "SPOT",
            "instanceTerminationAction": termination_action.upper(),
            "onHostMaintenance": "TERMINATE",
            "automaticRestart": False,
        }
    return {
        "provisioningModel": "STANDARD",
        "onHostMaintenance": "TERMINATE" if has_gpus else "MIGRATE",
        "automaticRestart": True,
    }


def network_link(project, network):
    if "/" in network:
        return network
    return "projects/%s/global/networks/%s" % (project, network)


def subnetwork_link(project, region, subnetwork):
    if "/" in subnetwork:
        return subnetwork
    return "projects/%s/regions/%s/subnetworks/%s" % (project, region, subnetwork)


def instance_body(spec, name, rank, zone, has_gpus, policy_link=None):
    """The instances.insert body of one VM of the group. `spec`: the module's parameters."""
    project, region = spec["project"], region_of(zone)
    labels = dict((k, str(v)) for k, v in (spec.get("labels") or {}).items())
    labels.update({"llamafactory": "training", "llamafactory-rank": str(rank)})
    labels[GROUP_LABEL] = spec["prefix"]
    nic0 = {"network": network_link(project, spec["network"])}
    if spec.get("subnetwork"):
        nic0["subnetwork"] = subnetwork_link(project, region, spec["subnetwork"])
    if spec.get("external_ip", True):
        nic0["accessConfigs"] = [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]
    nics = [nic0]
    for extra in spec.get("gpu_networks") or []:
        nic = {"network": network_link(project, extra["network"])}
        if extra.get("subnetwork"):
            nic["subnetwork"] = subnetwork_link(project, region, extra["subnetwork"])
        if extra.get("nic_type"):
            nic["nicType"] = extra["nic_type"]
        nics.append(nic)
    disk = {
        "boot": True,
        "autoDelete": True,
        "type": "PERSISTENT",
        "initializeParams": {
            "sourceImage": spec["image"],
            "diskSizeGb": str(spec["boot_disk_size_gb"]),
            "diskType": "zones/%s/diskTypes/%s" % (zone, spec["boot_disk_type"]),
        },
    }
    body = {
        "name": name,
        "machineType": "zones/%s/machineTypes/%s" % (zone, spec["machine_type"]),
        "labels": labels,
        "disks": [disk],
        "networkInterfaces": nics,
        "scheduling": scheduling(spec["provisioning_model"], spec["termination_action"], has_gpus),
        "serviceAccounts": [
            {"email": spec.get("vm_service_account") or "default", "scopes": spec["vm_scopes"]}
        ],
    }
    metadata = dict((k, str(v)) for k, v in (spec.get("metadata") or {}).items())
    if metadata:
        body["metadata"] = {"items": [{"key": k, "value": metadata[k]} for k in sorted(metadata)]}
    if spec.get("accelerators"):
        body["guestAccelerators"] = [
            {
                "acceleratorType": "zones/%s/acceleratorTypes/%s" % (zone, a["type"]),
                "acceleratorCount": int(a["count"]),
            }
            for a in spec["accelerators"]
        ]
    if policy_link:
        body["resourcePolicies"] = [policy_link]
    if spec.get("reservation"):
        body["reservationAffinity"] = {
            "consumeReservationType": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": [spec["reservation"]],
        }
    return body


def placement_policy_body(name, count):
    """A compact placement policy for the group (resourcePolicies.insert)."""
    return {
        "name": name,
        "description": "hostnet.llamafactory: the group's VMs close together",
        "groupPlacementPolicy": {"collocation": "COLLOCATED", "vmCount": count},
    }


def group_as_found(instances, prefix, count, machine_type, provisioning_model=None):
    """How the group stands, from the instances labelled as its own (aggregated list):
    {zone (None when none exists), present: {name: instance}, missing: [names], extra: [names of
    ranks >= count], mismatched: ['NAME is TYPE' or 'NAME is SPOT'], zones: [every zone holding
    one]}. `provisioning_model` (standard or spot), when given, must match too."""
    wanted = vm_names(prefix, count)
    present = dict((i["name"], i) for i in instances if i["name"] in wanted)
    extra = sorted(
        i["name"]
        for i in instances
        if i["name"] not in wanted and rank_of(prefix, i["name"]) is not None
    )
    zones = sorted(set(short(i.get("zone")) for i in present.values()))
    mismatched = [
        "%s is %s" % (name, short(i.get("machineType")))
        for name, i in sorted(present.items())
        if short(i.get("machineType")) != machine_type
    ]
    if provisioning_model:
        mismatched += [
            "%s is %s" % (name, model)
            for name, model in sorted(
                (n, (i.get("scheduling") or {}).get("provisioningModel", "STANDARD"))
                for n, i in present.items()
            )
            if model != provisioning_model.upper()
        ]
    return {
        "zone": zones[0] if len(zones) == 1 else None,
        "zones": zones,
        "present": present,
        "missing": [n for n in wanted if n not in present],
        "extra": extra,
        "mismatched": mismatched,
    }


def summary(instance):
    """What the module returns of one VM."""
    nic0 = (instance.get("networkInterfaces") or [{}])[0]
    access = (nic0.get("accessConfigs") or [{}])[0]
    labels = instance.get("labels") or {}
    rank = labels.get("llamafactory-rank", "")
    return {
        "name": instance.get("name"),
        "zone": short(instance.get("zone")),
        "status": instance.get("status"),
        "rank": int(rank) if rank.isdigit() else None,
        "machine_type": short(instance.get("machineType")),
        "internal_ip": nic0.get("networkIP"),
        "external_ip": access.get("natIP"),
        "provisioning_model": (instance.get("scheduling") or {}).get(
            "provisioningModel", "STANDARD"
        ),
    }
