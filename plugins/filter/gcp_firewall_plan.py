# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: gcp_firewall_plan
short_description: The GCE firewall rules a training cluster needs, checked before any API call
version_added: 0.1.0
description:
  - Turns the role gcp_firewall's settings into the rules to ensure, each with the options for
    C(google.cloud.gcp_compute_firewall) and the API resource they make.
  - "The nodes rule: INGRESS, allow tcp 0-65535, udp 0-65535 and icmp, named C(CLUSTER-nodes),
    from the nodes' internal addresses as /32 ranges, from a network tag (source and target), or
    from given private subnet ranges. The SSH rule C(CLUSTER-ssh): tcp 22 from admin ranges, or
    absent when none are given."
  - "For every other network on which the nodes have NICs by the Compute Engine API's view
    (C(interfaces); a GPU machine type's VPCs: A3 High/Mega's GPU NICs, A3 Ultra/A4's second
    gVNIC), one more rule like the nodes rule, C(CLUSTER-nodes-TAIL) (TAIL the network's name
    less a leading C(CLUSTER-); cut and ended with a hash of the network's name when longer
    than 63 characters), from the nodes' addresses on that network as /32 ranges, with the nodes
    rule's target tags. RDMA VPCs (a NIC of nicType MRDMA or IRDMA, or, without a nicType, a
    network named like C(DEPLOYMENT-rdma-net)) get none: RoCE VPCs take no VPC firewall rules;
    C(skipped_networks) and C(notes) say so."
  - Fails, naming the variable and the fix, on 0.0.0.0/0 or ::/0 in any spelling, on a non-private
    source for the nodes rule (it would publish MASTER_PORT beyond the cluster), on an SSH rule
    when MASTER_PORT is 22, on a node without a known internal address, on a node whose address
    is not its address on the rule's network (when the Compute Engine API's view of its NICs is
    known), and on names GCE refuses.
options:
  _input:
    description:
      - "The settings: C(state), C(cluster), C(project), C(network), C(priority), C(source)
        (addresses, tag or ranges), C(tag), C(ranges), C(target_tags), C(ssh_source_ranges),
        C(master_port), C(nodes) (host name to internal address, or null), and C(interfaces)
        (host name to the VM's C(networkInterfaces) as the gcp_compute inventory lists them, or
        null)."
    type: dict
    required: true
  errors:
    description:
      - "V(raise) fails the template on a refused setting; V(return) returns C({error: MESSAGE})
        instead, for a task of its own to fail with the message alone (the role does)."
    type: str
    choices: [raise, return]
    default: raise
"""

EXAMPLES = r"""
- name: Plan the rules
  ansible.builtin.set_fact:
    plan: "{{ settings | hostnet.llamafactory.gcp_firewall_plan }}"
  vars:
    settings:
      cluster: llamafactory
      project: my-project
      network: default
      nodes: {trainer-0: 10.128.0.5, trainer-1: 10.128.0.6}
"""

RETURN = r"""
_value:
  description: The plan; with O(errors=return) and a refused setting, C(error) alone.
  type: dict
  contains:
    error:
      description: Why the settings were refused, naming the variable and the fix.
      type: str
      returned: with O(errors=return), on a refused setting
    project:
      description: The project ID.
      type: str
    cluster:
      description: The cluster name.
      type: str
    rules:
      description:
        - One per rule name; C(state) present or absent, C(params) (the module's options) and
          C(want) (the API resource) for present ones; a rule for another network has C(role)
          C(network) and C(network) (its name).
      type: list
      elements: dict
    networks:
      description: The nodes' other networks that get a rule, each with the rule's name.
      type: dict
    skipped_networks:
      description: The nodes' other networks that get no rule, each with C(network) and C(reason).
      type: list
      elements: dict
    notes:
      description: Lines for the report (the skipped networks; nodes whose NICs are not known).
      type: list
      elements: str
    list_filter:
      description: The list filter (C(name eq "RE2")) that finds every rule of the cluster.
      type: str
    prune:
      description:
        - Whether the cluster's rules that the plan does not name are deleted - with state absent,
          and when every node's NICs are known (a rule for a network no node uses now).
      type: bool
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._gcp_firewall import (
    FirewallError,
    plan,
)


def gcp_firewall_plan(settings, errors="raise"):
    if errors not in ("raise", "return"):
        raise AnsibleFilterError(
            "gcp_firewall_plan: errors must be raise or return, not %r" % errors
        )
    try:
        return plan(dict(settings or {}))
    except FirewallError as exc:
        if errors == "return":
            return {"error": str(exc)}
        raise AnsibleFilterError(str(exc)) from None


class FilterModule(object):
    def filters(self):
        return {"gcp_firewall_plan": gcp_firewall_plan}
