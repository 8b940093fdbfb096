# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The platform and the credentials (controller only, private; a step of _validation.validate()).

Rules across variables that a value alone cannot break: each node's platform, network mode,
network profile and MASTER_ADDR; the VMs' state in Compute Engine; the registry's and GCP's
credentials; deleting VMs that hold the only copy of a model; forks for a wait without agents.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._address_kind import (
    address_kind,
)


def problems(nodes, effective, values, purpose, forks, instances):
    """Every problem of this step, in the order the checks below run."""
    found = _node_network(nodes, effective, values)
    found += _instances_running(nodes, instances, purpose)
    found += _registry_credentials(values)
    found += _vm_deletion(values, purpose)
    found += _wait_forks(nodes, effective, values, purpose, forks)
    found += _max_duration(nodes, effective, values, purpose)
    found += _gcp_credentials(nodes, effective, values, purpose)
    return found


def _node_network(nodes, effective, values):
    """Each node's platform, network mode (host, or bridge when allowed), network profile (GPU
    profiles need host networking) and a public MASTER_ADDR (only when allowed)."""
    found = []
    for host in nodes:
        platform = effective[host]["llamafactory_platform"]
        if platform is not None and platform not in ("gcp", "local"):
            found.append(
                "llamafactory_platform is %r on %s; set it to 'gcp' (GCP VMs, the default) or "
                "'local' (the local cluster)." % (platform, host)
            )
        mode = effective[host]["llamafactory_network_mode"]
        allowed = mode == "bridge" and values["llamafactory_allow_bridge"]
        if mode is not None and mode != "host" and not allowed:
            found.append(
                "llamafactory_network_mode is %r: only 'host' trains across nodes (on Docker's "
                "bridge every rank advertises a 172.17.x address that the other VMs cannot reach: "
                '"socketStartConnect: Connect to 172.17.0.2<...> failed"). Set '
                "llamafactory_network_mode=host. ('bridge' with llamafactory_allow_bridge=true "
                "exists to reproduce that failure.)" % mode
            )
        profile = effective[host]["llamafactory_network_profile"]
        if mode is not None and mode != "host" and profile not in (None, "auto", "socket"):
            found.append(
                "llamafactory_network_profile is %r but llamafactory_network_mode is %r: GPU NICs "
                "are the host's, so the %s profile needs llamafactory_network_mode=host."
                % (profile, mode, profile)
            )
        addr = effective[host]["llamafactory_master_addr"]
        allow_public = values["llamafactory_allow_public_master_addr"]
        if addr is not None and address_kind(addr) == "public" and not allow_public:
            found.append(
                "llamafactory_master_addr %s is a public address (an external IP: the rendezvous "
                "would go over the internet and need its port open to it). Remove it to let "
                "discover_network use rank 0's internal address, or set it to that address "
                "(llamafactory_allow_public_master_addr=true accepts a public one)." % addr
            )
    return found


def _instances_running(nodes, instances, purpose):
    """A node the gcp_compute inventory lists as not RUNNING cannot train or be checked."""
    found = []
    for host in nodes if purpose in ("train", "doctor") else ():
        instance = (instances or {}).get(host) or {}
        status = instance.get("status")
        if status is not None and status != "RUNNING":
            zone = str(instance.get("zone") or "ZONE").rsplit("/", 1)[-1]
            found.append(
                "%s is %s in Compute Engine (gcp_status, from the dynamic inventory), not "
                "RUNNING: it cannot take part in the job. Start it (gcloud compute instances "
                "start %s --zone %s), or take it out of the job (remove its llamafactory=training "
                "label), then run again." % (host, status, host, zone)
            )
    return found


def _registry_credentials(values):
    if values["llamafactory_registry_password"] and not values["llamafactory_registry_username"]:
        return [
            "llamafactory_registry_password is set but llamafactory_registry_username is empty: "
            "set both (for Artifact Registry, llamafactory_registry_username=oauth2accesstoken "
            "with an access token)."
        ]
    return []


def _vm_deletion(values, purpose):
    """A deleted VM's disk goes with it: delete only what is also somewhere else - in the
    bucket (llamafactory_output_uri) or, for the model, on the controller."""
    found = []
    durable = values["llamafactory_output_uri"] or values["launch_fetch_model_max_mb"]
    if purpose in ("train", "admin") and not durable:
        for name in ("gcp_instances_when_done", "gcp_instances_when_failed"):
            if values[name] == "delete":
                found.append(
                    "%s is delete but llamafactory_output_uri is empty and "
                    "launch_fetch_model_max_mb is 0: the VMs' disks would go with the only copy "
                    "of the trained model and its checkpoints. Set llamafactory_output_uri "
                    "(gs://BUCKET/PREFIX: every checkpoint and the model go there), let the model "
                    "come to the controller (launch_fetch_model_max_mb, default 2048), or set %s "
                    "to stop (the disks stay, no GPU is billed) or keep." % (name, name)
                )
    return found


def _wait_forks(nodes, effective, values, purpose, forks):
    """Without host networking the ranks run without their agents, and the wait polls every
    node at once (with them it holds one fork: rank 0's agent watches the others)."""
    waits = purpose == "train" and values["launch_wait"]
    without_agents = [h for h in nodes if effective[h]["llamafactory_network_mode"] != "host"]
    if waits and without_agents and forks is not None and int(forks) < len(nodes):
        return [
            "forks is %s but the job has %d nodes and llamafactory_network_mode %s: without "
            "host networking the ranks run without their agents and the wait polls every node "
            "at once. Run with -f %d or set forks in ansible.cfg (or launch_wait=false)."
            % (
                forks,
                len(nodes),
                effective[without_agents[0]]["llamafactory_network_mode"],
                len(nodes),
            )
        ]
    return []


def _max_duration(nodes, effective, values, purpose):
    """The time limit is kept by the ranks' agents, which run with host networking only."""
    without_agents = [h for h in nodes if effective[h]["llamafactory_network_mode"] != "host"]
    if purpose == "train" and values["gcp_instances_max_duration"] and without_agents:
        return [
            "gcp_instances_max_duration is %s but llamafactory_network_mode is %s on %s: the "
            "time limit is kept by the ranks' agents, which run with host networking only. Set "
            "llamafactory_network_mode=host, or gcp_instances_max_duration=0."
            % (
                values["gcp_instances_max_duration"],
                effective[without_agents[0]]["llamafactory_network_mode"],
                without_agents[0],
            )
        ]
    return []


def _gcp_credentials(nodes, effective, values, purpose):
    """To train on GCP: the firewall rule's project, and the credentials its auth kind needs."""
    platforms = set(effective[h]["llamafactory_platform"] for h in nodes)
    if purpose != "train" or platforms != {"gcp"}:
        return []
    found = []
    if not values["llamafactory_gcp_project"]:
        found.append(
            "llamafactory_gcp_project is not set: the GCP firewall rule needs the ID of the "
            "project that holds the VMs' VPC network (the host project for a shared VPC); set "
            "it or export GCP_PROJECT (or llamafactory_platform=local off GCP)"
        )
    kind = values["llamafactory_gcp_auth_kind"]
    if kind == "serviceaccount" and not values["llamafactory_gcp_service_account_file"]:
        found.append(
            "llamafactory_gcp_auth_kind is serviceaccount but "
            "llamafactory_gcp_service_account_file is empty: give the key file's path on the "
            "controller"
        )
    if kind == "accesstoken" and not values["llamafactory_gcp_access_token"]:
        found.append(
            "llamafactory_gcp_auth_kind is accesstoken but llamafactory_gcp_access_token is "
            "empty: give a token (gcloud auth print-access-token)"
        )
    return found
