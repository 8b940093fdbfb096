# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: node_ranks
short_description: The node rank of every training host, checked
version_added: 0.1.0
description:
  - Maps each host of a group to its node rank - C(llamafactory_node_rank) when set, else the
    host's position in the group.
  - Fails, naming the hosts and the fix, unless the ranks are integers, unique and contiguous
    from 0, and C(llamafactory_node_rank) is set on every host or on none.
options:
  _input:
    description: The hosts, in group order (for example C(groups['llamafactory'])).
    type: list
    elements: str
    required: true
  hostvars:
    description: C(hostvars).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Rank the nodes
  ansible.builtin.set_fact:
    ranks: "{{ groups['llamafactory'] | hostnet.llamafactory.node_ranks(hostvars) }}"
"""

RETURN = r"""
_value:
  description: Host name to node rank.
  type: dict
  sample: {trainer-0: 0, trainer-1: 1}
"""

from ansible.errors import AnsibleFilterError


def node_ranks(hosts, hostvars):
    hosts = list(hosts or [])
    if not hosts:
        raise AnsibleFilterError("no training hosts: put the VMs in the group 'llamafactory'")
    given = dict((h, hostvars[h].get("llamafactory_node_rank")) for h in hosts)
    with_rank = [h for h in hosts if given[h] is not None]
    if with_rank and len(with_rank) != len(hosts):
        missing = [h for h in hosts if given[h] is None]
        raise AnsibleFilterError(
            "llamafactory_node_rank is set on %s but not on %s: set it on every node or on none "
            "(then the group order decides)" % (", ".join(with_rank), ", ".join(missing))
        )
    ranks = {}
    for index, host in enumerate(hosts):
        value = given[host] if with_rank else index
        try:
            ranks[host] = int(value)
            if str(ranks[host]) != str(value).strip():
                raise ValueError(value)
        except (TypeError, ValueError) as exc:
            raise AnsibleFilterError(
                "llamafactory_node_rank of %s is %r: it must be an integer "
                "from 0 to %d" % (host, value, len(hosts) - 1)
            ) from exc
    by_rank = {}
    for host, rank in ranks.items():
        by_rank.setdefault(rank, []).append(host)
    duplicates = ["%d (%s)" % (r, ", ".join(h)) for r, h in sorted(by_rank.items()) if len(h) > 1]
    if duplicates:
        raise AnsibleFilterError(
            "llamafactory_node_rank must be unique; shared: %s. Two nodes "
            "at one rank hang at the rendezvous." % "; ".join(duplicates)
        )
    if sorted(by_rank) != list(range(len(hosts))):
        raise AnsibleFilterError(
            "llamafactory_node_rank must run from 0 to %d without gaps "
            "(one rank per node); got %s"
            % (
                len(hosts) - 1,
                ", ".join("%s=%d" % (h, r) for h, r in sorted(ranks.items(), key=lambda i: i[1])),
            )
        )
    return ranks


class FilterModule(object):
    def filters(self):
        return {"node_ranks": node_ranks}
