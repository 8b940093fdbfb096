# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's side of job_results: the trained model's files, their checksums, reads of a file's
content in pieces, and the finished job's record (the controller's side:
plugins/plugin_utils/_results.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import hashlib
import json
import os
import tempfile

CHUNK = 1024 * 1024


def checksum(data):
    """The SHA-256 of bytes, by which the controller's copy and the node's file are compared."""
    return hashlib.sha256(data).hexdigest()


def file_checksum(path):
    """The SHA-256 of a file, read a MiB at a time (a model's files are large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def model_files(folder):
    """The trained model as LLaMA-Factory saves it: every regular, visible file at the top of
    the output folder (adapter or weights, config, tokenizer, results); the checkpoint-N and
    runs folders below it are not part of it. [{name, size}], sorted by name."""
    found = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not name.startswith(".") and os.path.isfile(path) and not os.path.islink(path):
            found.append({"name": name, "size": os.path.getsize(path)})
    return found


def describe_model(folder, max_bytes, known, inline_bytes):
    """The model's files with their SHA-256 when their total is at most max_bytes (none above:
    the model is not brought, and a large model is not read for nothing). The content of each
    file whose checksum differs from known[name] comes along, base64, while the total of such
    content stays within inline_bytes; the rest is read later in pieces (read_piece)."""
    files = model_files(folder) if os.path.isdir(folder) else []
    total = sum(f["size"] for f in files)
    if total > max_bytes:
        return {"files": files, "size": total, "checksummed": False}
    budget = inline_bytes
    for entry in files:
        path = os.path.join(folder, entry["name"])
        entry["sha256"] = file_checksum(path)
        if known.get(entry["name"]) != entry["sha256"] and entry["size"] <= budget:
            with open(path, "rb") as handle:
                data = handle.read()
            if checksum(data) == entry["sha256"]:  # unchanged since it was hashed
                entry["content"] = base64.b64encode(data).decode("ascii")
                budget -= len(data)
    return {"files": files, "size": total, "checksummed": True}


def read_piece(path, offset, length):
    """length bytes of the file from offset (fewer at its end), base64, and its size."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read(length)
        size = os.fstat(handle.fileno()).st_size
    return {"content": base64.b64encode(data).decode("ascii"), "size": size}


def write_record(path, record, check_mode=False):
    """Write `record` as JSON to `path` (mode 0600, replaced whole) unless the file holds it
    already; whether it was (in check mode, would be) written."""
    try:
        with open(path) as handle:
            if json.load(handle) == record:
                return False
    except (IOError, OSError, ValueError):
        pass
    if check_mode:
        return True
    folder = os.path.dirname(path) or "."
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".record-")
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(record, out, sort_keys=True)
        os.chmod(temporary, 0o600)
        os.rename(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    return True
