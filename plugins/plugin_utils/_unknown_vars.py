# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Variables with the collection's prefixes that no role knows (controller only, private)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import difflib

PREFIXES = (
    "llamafactory_",
    "launch_",
    "preflight_",
    "job_admin_",
    "gcp_firewall_",
    "gcp_instances_",
    "discover_network_",
    "docker_engine_",
    "nvidia_container_toolkit_",
)


def unknown_vars(names, known, ignore=(), prefixes=PREFIXES):
    """{unknown name: closest known name, or ""} for the prefixed names not in known or ignore."""
    settings = sorted(set(known))
    accepted = set(known) | set(ignore)
    found = {}
    for name in sorted(set(names)):
        if name.startswith(tuple(prefixes)) and name not in accepted:
            close = difflib.get_close_matches(name, settings, n=1, cutoff=0.75)
            found[name] = close[0] if close else ""
    return found
