# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The job's nodes (controller only, private; steps of _validation.validate()).

The inventory (the group 'llamafactory' against the play's hosts), each node's own values, their
agreement across the nodes, and the node ranks. Each step returns the problems it found, each
naming the variable or host and the fix.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._node_ranks import node_ranks
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._validation_values import (
    check_value,
)


def membership(group_hosts, play_hosts, purpose):
    """Problems of the play's hosts against the group: none in it, hosts outside it, and a
    --limit that leaves out a node the job needs."""
    problems = []
    if not group_hosts:
        problems.append(
            "The inventory has no hosts in the group 'llamafactory'. Put the training VMs under "
            "[llamafactory] (see inventories/gcp.ini)."
        )
    outside = [h for h in play_hosts if h not in group_hosts]
    if outside:
        problems.append(
            "%s %s not in the group 'llamafactory': run the playbooks on that group (hosts: "
            "llamafactory) and put every training VM in it"
            % (", ".join(outside), "is" if len(outside) == 1 else "are")
        )
    left_out = [h for h in group_hosts if h not in play_hosts]
    if left_out and purpose in ("train", "doctor") and play_hosts:
        problems.append(
            "--limit leaves out %s of the group 'llamafactory': a %s runs on every node of the "
            "job (the ranks rendezvous), so drop --limit, or take the node out of the group"
            % (", ".join(left_out), "training job" if purpose == "train" else "doctor's check")
        )
    return problems


def host_values(schema, settings, per_host, values, group_hosts, play_hosts):
    """(nodes, effective, problems): the job's nodes (the group's hosts in the play), and for
    every host the value of each variable it uses - its own, checked, where it differs from the
    play's, else the play's (`values`)."""
    nodes = [h for h in group_hosts if h in play_hosts] if group_hosts else play_hosts
    everyone = list(group_hosts) + [h for h in play_hosts if h not in group_hosts]
    effective, problems = {}, []
    for host in everyone:
        effective[host] = {}
        for name, var in schema.items():
            if name in per_host.get(host, {}) and per_host[host][name] != settings.get(name):
                value, found = check_value(var, per_host[host][name], "%s of %s" % (name, host))
                problems.extend(found)
                effective[host][name] = value
            else:
                effective[host][name] = values[name]
    return nodes, effective, problems


def agreement(schema, nodes, per_host, effective, values):
    """Problems of the variables the job has one value of (the rules' `same`, and
    llamafactory_gpus_per_node unless llamafactory_allow_uneven_gpus): set on some nodes only,
    or different between them."""
    same = tuple(name for name, var in schema.items() if var.same)

    def varies(name):
        seen = []
        for host in nodes:
            value = effective[host][name]
            if value not in seen:
                seen.append(value)
        return seen

    problems = []
    uneven = values["llamafactory_allow_uneven_gpus"]
    for name in same + (() if uneven else ("llamafactory_gpus_per_node",)):
        set_on = [h for h in nodes if name in per_host.get(h, {})]
        if set_on and len(set_on) < len(nodes):
            problems.append(
                "%s is set on %s but not on %s: the job has one value; set it once for the group "
                "'llamafactory' (group_vars) or on every node"
                % (name, ", ".join(set_on), ", ".join(h for h in nodes if h not in set_on))
            )
    for name in same:
        seen = varies(name)
        if len(seen) > 1:
            problems.append(
                "%s differs between the nodes (%s): the job has one value; set it once for the "
                "group 'llamafactory'" % (name, ", ".join(str(v) for v in seen))
            )
    gpus_seen = varies("llamafactory_gpus_per_node")
    if len(gpus_seen) > 1 and not uneven:
        problems.append(
            "llamafactory_gpus_per_node differs between the nodes (%s): torchrun runs the same "
            "number of processes on every node. Set one value for the group, or "
            "llamafactory_allow_uneven_gpus=true if you know the job copes."
            % ", ".join(str(v) for v in gpus_seen)
        )
    return problems


def ranks(group_hosts, effective):
    """({host: rank}, problems) of the group's hosts (llamafactory_node_rank, or their order)."""
    if not group_hosts:
        return {}, []
    given = dict((h, effective[h]["llamafactory_node_rank"]) for h in group_hosts)
    return node_ranks(group_hosts, given)
