# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node rank of every training host, checked (controller only, private)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


def node_ranks(hosts, given):
    """({host: rank}, problems) for `hosts` in group order.

    given: host -> llamafactory_node_rank, or None where unset. A rank is the given one when
    every host has one, else the host's position in the group. Problems name the hosts and the fix.
    """
    hosts = list(hosts or [])
    if not hosts:
        return {}, ["no training hosts: put the VMs in the group 'llamafactory'"]
    with_rank = [h for h in hosts if given.get(h) is not None]
    if with_rank and len(with_rank) != len(hosts):
        missing = [h for h in hosts if given.get(h) is None]
        return {}, [
            "llamafactory_node_rank is set on %s but not on %s: set it on every node or on none "
            "(then the group order decides)" % (", ".join(with_rank), ", ".join(missing))
        ]
    ranks, problems = {}, []
    for index, host in enumerate(hosts):
        value = given[host] if with_rank else index
        try:
            if isinstance(value, bool):
                raise ValueError(value)
            ranks[host] = int(value)
            if str(ranks[host]) != str(value).strip():
                raise ValueError(value)
        except (TypeError, ValueError):
            ranks.pop(host, None)
            problems.append(
                "llamafactory_node_rank of %s is %r: it must be an integer from 0 to %d"
                % (host, value, len(hosts) - 1)
            )
    if problems:
        return {}, problems
    by_rank = {}
    for host, rank in ranks.items():
        by_rank.setdefault(rank, []).append(host)
    duplicates = ["%d (%s)" % (r, ", ".join(h)) for r, h in sorted(by_rank.items()) if len(h) > 1]
    if duplicates:
        return {}, [
            "llamafactory_node_rank must be unique; shared: %s. Two nodes at one rank hang at "
            "the rendezvous." % "; ".join(duplicates)
        ]
    if sorted(by_rank) != list(range(len(hosts))):
        order = sorted(ranks.items(), key=lambda item: item[1])
        return {}, [
            "llamafactory_node_rank must run from 0 to %d without gaps (one rank per node); got %s"
            % (len(hosts) - 1, ", ".join("%s=%d" % (h, r) for h, r in order))
        ]
    return ranks, []
