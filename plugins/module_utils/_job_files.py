# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""job_files on the node: what each wanted folder or file needs (its creation, its content,
its owner, group or mode), and the changes made whole (a file is written to a temporary name
and renamed over the old one)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import binascii
import grp
import os
import pwd
import stat
import tempfile


def ids(owner, group):
    """User and group names (or numeric ids) -> (uid, gid); KeyError names the unknown one."""
    uid = int(owner) if owner.isdigit() else pwd.getpwnam(owner).pw_uid
    gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    return uid, gid


def data(entry):
    """A file entry's bytes: its content as UTF-8, or its content_base64 decoded (ValueError
    when that is not base64); None for a folder."""
    if entry.get("state", "file") != "file":
        return None
    if entry.get("content_base64") is not None:
        try:
            return base64.b64decode(entry["content_base64"], validate=True)
        except (binascii.Error, TypeError) as exc:
            raise ValueError(str(exc)) from exc
    return entry["content"].encode("utf-8")


def needs(entry, uid, gid):
    """One wanted entry ({path, state, content, mode}) -> the changes it needs, in order:
    'create' (a missing folder), 'content' (a file missing or holding other bytes), 'owner',
    'mode'. A path of the other kind (a file where a folder is wanted) raises ValueError."""
    path, mode = entry["path"], int(entry["mode"], 8)
    try:
        st = os.lstat(path)
    except OSError:
        return ["create"] if entry["state"] == "directory" else ["content"]
    is_dir = stat.S_ISDIR(st.st_mode)
    if is_dir != (entry["state"] == "directory") or stat.S_ISLNK(st.st_mode):
        kind = "a folder" if is_dir else "a link" if stat.S_ISLNK(st.st_mode) else "a file"
        raise ValueError("%s is %s, not the %s wanted" % (path, kind, entry["state"]))
    changes = []
    if entry["state"] == "file":
        with open(path, "rb") as handle:
            if handle.read() != data(entry):
                changes.append("content")
    if (st.st_uid, st.st_gid) != (uid, gid):
        changes.append("owner")
    if stat.S_IMODE(st.st_mode) != mode:
        changes.append("mode")
    return changes


def apply(entry, changes, uid, gid):
    """Make the changes `needs` named."""
    path, mode = entry["path"], int(entry["mode"], 8)
    if "create" in changes:
        os.makedirs(path)
    if "content" in changes:
        folder = os.path.dirname(path) or "."
        handle, temporary = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path))
        try:
            # Owner and mode first: the content is never readable by others, even briefly.
            os.fchown(handle, uid, gid)
            os.fchmod(handle, mode)
            with os.fdopen(handle, "wb") as out:
                out.write(data(entry))
            os.rename(temporary, path)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise
        return
    if "create" in changes or "owner" in changes:
        os.chown(path, uid, gid)
    if "create" in changes or "mode" in changes:
        os.chmod(path, mode)
