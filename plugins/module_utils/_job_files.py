# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""job_files on the node (and the files preflight_probe writes before its start): each wanted
entry checked first, what each folder or file needs (its creation, its content, its owner, group
or mode), and the changes made whole (a file is written to a temporary name and renamed over the
old one)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import binascii
import grp
import json
import os
import pwd
import stat
import tempfile

# One entry's argument spec (the modules' `entries` and `files` options). The content is no_log:
# the result's invocation does not echo it back (an environment file, up to 16 MiB of copies).
ENTRY_OPTIONS = dict(
    path=dict(type="path", required=True),
    state=dict(type="str", choices=["directory", "file"], default="file"),
    content=dict(type="str", no_log=True),
    content_base64=dict(type="str", no_log=True),
    mode=dict(type="str", required=True),
    json=dict(type="bool", default=False),
)


class EntryError(Exception):
    """An entry that cannot be made; `changes` holds what was made before it."""

    def __init__(self, msg, changes=None):
        super().__init__(msg)
        self.changes = changes or {}


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


def problem(entry):
    """What is wrong with one entry as given (None when nothing), found before anything is
    written: content and content_base64 both or neither, base64 that is not, a mode that is not
    octal, text meant to be JSON that is not."""
    path = entry["path"]
    if entry["state"] == "file" and (entry["content"] is None) == (entry["content_base64"] is None):
        return "%s: a file needs content or content_base64, one of them" % path
    try:
        data(entry)
    except ValueError as exc:
        return "%s: content_base64 is not base64 (%s)" % (path, exc)
    try:
        int(entry["mode"], 8)
    except ValueError:
        return "%s: mode %r is not octal" % (path, entry["mode"])
    if entry["json"]:
        try:
            json.loads(entry["content"])
        except ValueError as exc:
            return "%s: not valid JSON (%s); nothing written" % (path, exc)
    return None


def write(entries, owner, group, check_mode):
    """Every entry checked, then made in order (nothing in check mode) -> {path: changes} of
    those that needed any. Raises EntryError (with what was made before) on the first entry
    that cannot be made; nothing is written when one is wrong as given."""
    try:
        uid, gid = ids(owner, group)
    except KeyError as exc:
        raise EntryError("no such owner or group on this node: %s" % exc) from exc
    for entry in entries:
        found = problem(entry)
        if found:
            raise EntryError(found)
    changes = {}
    for entry in entries:
        try:
            needed = needs(entry, uid, gid)
            if needed and not check_mode:
                apply(entry, needed, uid, gid)
        except (OSError, ValueError) as exc:
            raise EntryError(str(exc), changes) from exc
        if needed:
            changes[entry["path"]] = needed
    return changes
