# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: unknown_vars
short_description: Variables with the collection's prefixes that no role knows (typos)
version_added: 0.1.0
description:
  - Takes variable names and returns those that start with one of O(prefixes) but are not in
    O(known), each with the closest known name - so that C(llamafactory_gpu_per_node=0) is
    reported instead of silently training on the default.
options:
  _input:
    description: The names to check (for example C(hostvars[host].keys())).
    type: list
    elements: str
    required: true
  known:
    description: Every name the roles accept (their C(meta/argument_specs.yml) options and more).
    type: list
    elements: str
    required: true
  ignore:
    description: More names that are known but never suggested (facts the roles set).
    type: list
    elements: str
    default: []
  prefixes:
    description: Prefixes owned by the collection.
    type: list
    elements: str
    default: [llamafactory_, launch_]
"""

EXAMPLES = r"""
- name: Report typos
  ansible.builtin.debug:
    msg: "{{ hostvars[inventory_hostname].keys() | hostnet.llamafactory.unknown_vars(known) }}"
"""

RETURN = r"""
_value:
  description: Unknown name to its closest known name (empty when none is close).
  type: dict
"""

import difflib


def unknown_vars(names, known, ignore=(), prefixes=("llamafactory_", "launch_")):
    settings = sorted(set(known))
    accepted = set(known) | set(ignore)
    found = {}
    for name in sorted(set(names)):
        if name.startswith(tuple(prefixes)) and name not in accepted:
            close = difflib.get_close_matches(name, settings, n=1, cutoff=0.75)
            found[name] = close[0] if close else ""
    return found


class FilterModule(object):
    def filters(self):
        return {"unknown_vars": unknown_vars}
