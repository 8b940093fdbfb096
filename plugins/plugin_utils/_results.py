# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's side of job_results: checksums of what the controller holds, writes that
happen whole or not at all, and the model's SHA256SUMS (the node's side:
plugins/module_utils/_results.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import os
import tempfile

from ansible_collections.hostnet.llamafactory.plugins.module_utils._results import (
    checksum,
    file_checksum,
)

SUMS = "SHA256SUMS"


def sums_text(files):
    """SHA256SUMS as sha256sum writes it: 'SHA256  NAME' per file, sorted by name."""
    return "".join(
        "%s  %s\n" % (f["sha256"], f["name"]) for f in sorted(files, key=lambda f: f["name"])
    )


def known_checksums(folder, names):
    """name -> SHA-256 of the files of `names` already in `folder` (absent ones left out)."""
    known = {}
    for name in names:
        try:
            with open(os.path.join(folder, name), "rb") as handle:
                known[name] = checksum(handle.read())
        except (IOError, OSError):
            pass
    return known


def folder_checksums(folder):
    """name -> SHA-256 of every file in `folder` but SHA256SUMS ({} when there is no folder)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    known = {}
    for name in names:
        path = os.path.join(folder, name)
        if name != SUMS and os.path.isfile(path):
            known[name] = file_checksum(path)
    return known


def differs(path, data):
    """Whether the file at `path` is missing or holds other bytes than `data`."""
    try:
        with open(path, "rb") as handle:
            return handle.read() != data
    except (IOError, OSError):
        return True


def write(path, data, mode=0o644):
    """Write `data` to `path` whole or not at all (a temporary file renamed over it)."""
    write_pieces(path, [data], mode=mode)


def write_pieces(path, pieces, sha256=None, mode=0o644):
    """Write the bytes `pieces` yields to `path`, whole or not at all: into a temporary file
    renamed over it, and only when their SHA-256 is `sha256` (when given; else ValueError and
    `path` as it was)."""
    folder = os.path.dirname(path)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".")
    try:
        digest = hashlib.sha256()
        with os.fdopen(handle, "wb") as out:
            for data in pieces:
                digest.update(data)
                out.write(data)
        if sha256 is not None and digest.hexdigest() != sha256:
            raise ValueError(
                "%s: SHA-256 %s, not the node's %s" % (path, digest.hexdigest(), sha256)
            )
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
