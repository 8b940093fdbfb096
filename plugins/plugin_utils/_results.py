# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's side of job_results: the listing's text and writes that happen only when
the content differs (the node's side: plugins/module_utils/_results.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import tempfile

from ansible_collections.hostnet.llamafactory.plugins.module_utils._results import checksum


def listing_text(header, matching):
    """The listing file: '# HEADER', then 'NAME SIZE' per file, sorted by name."""
    lines = ["# " + header] if header else []
    lines += ["%s %s" % (f["name"], f["size"]) for f in sorted(matching, key=lambda f: f["name"])]
    return "\n".join(lines) + "\n"


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


def differs(path, data):
    """Whether the file at `path` is missing or holds other bytes than `data`."""
    try:
        with open(path, "rb") as handle:
            return handle.read() != data
    except (IOError, OSError):
        return True


def write(path, data, mode=0o644):
    """Write `data` to `path` whole or not at all (a temporary file renamed over it)."""
    folder = os.path.dirname(path)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
