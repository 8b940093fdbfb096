# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's side of job_results: which files match, and their checksums."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fnmatch
import hashlib


def matching(names, patterns):
    """The names that match any of the shell patterns, sorted, as ansible.builtin.find matches
    them (the whole name; hidden files only when a pattern names them)."""
    found = []
    for name in names:
        for pattern in patterns:
            hidden_ok = pattern.startswith(".") or not name.startswith(".")
            if hidden_ok and fnmatch.fnmatchcase(name, pattern):
                found.append(name)
                break
    return sorted(found)


def checksum(data):
    """The SHA-256 of bytes, by which the controller's copy and the node's file are compared."""
    return hashlib.sha256(data).hexdigest()
