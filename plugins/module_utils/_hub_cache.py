# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A Hugging Face Hub repository in a node's cache, shared node to node (private; standard
library only: it runs on the nodes, in hostnet.llamafactory.hub_cache).

The cache is huggingface_hub's own layout (``HF_HUB_CACHE``): ``models--ORG--NAME/`` holds
``blobs/ETAG`` (the file, named by its ETag: the SHA-256 of an LFS file, the git SHA-1 of any
other), ``snapshots/COMMIT/PATH`` (relative links to the blobs), ``refs/REVISION`` (the commit)
and ``trees/COMMIT.json``. Rank 0's node downloads the repository into it once
(roles/launch/files/hub_download.py, in a container of the job's image); that step writes
``hostnet/REVISION.json``, the manifest: every regular file with its size and SHA-256, every
link with its target. The other nodes copy the folder from rank 0 over the VPC (serve() there,
pull() here), each blob checked against its name and the manifest, the manifest written last:
a node whose manifest is there holds the whole repository (complete()).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import hashlib
import json
import os
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from socketserver import ThreadingMixIn
from urllib.error import HTTPError, URLError
from urllib.parse import quote, unquote

from ansible.module_utils.urls import open_url

MANIFEST_DIR = "hostnet"
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
SHA1_RE = re.compile(r"^[0-9a-f]{40}$")
REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,255}$")
CHUNK = 1 << 20
# A server nobody asks for anything this long stops (a run that failed before stopping it).
IDLE_S = 120


class HubCacheError(Exception):
    """A cache or copy that cannot be used; the message says why."""


def repo_folder(repo_id, repo_type="model"):
    """huggingface_hub's folder name for a repository (``models--ORG--NAME``)."""
    return "%ss--%s" % (repo_type, repo_id.replace("/", "--"))


def manifest_name(revision):
    return "%s/%s.json" % (MANIFEST_DIR, revision.replace("/", "%2F"))


def _safe(relative):
    """A path inside the repository folder (no absolute path, no ``..``), or an error."""
    if not relative or relative.startswith("/") or "\0" in relative:
        raise HubCacheError("unsafe path in the manifest: %r" % (relative,))
    if ".." in relative.split("/"):
        raise HubCacheError("unsafe path in the manifest: %r" % (relative,))
    return relative


def file_hashes(path):
    """(sha256, git blob sha1) of a file, read once."""
    sha256, sha1 = hashlib.sha256(), hashlib.sha1()  # noqa: S324 - git's object id
    size = os.path.getsize(path)
    sha1.update(("blob %d\0" % size).encode("ascii"))
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            sha256.update(block)
            sha1.update(block)
    return sha256.hexdigest(), sha1.hexdigest()


def blob_matches_name(name, sha256, sha1):
    """Whether a blob's content is what its name (the Hub's ETag) says: an LFS file's SHA-256
    or a git file's SHA-1. Other names (a mirror's own ETags) cannot be checked: True."""
    if SHA256_RE.match(name):
        return sha256 == name
    if SHA1_RE.match(name):
        return sha1 == name
    return True


def write_json(path, data):
    folder = os.path.dirname(path)
    if folder and not os.path.isdir(folder):
        os.makedirs(folder)
    temporary = "%s.tmp-%d" % (path, os.getpid())
    with open(temporary, "w") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
    os.rename(temporary, path)


def read_json(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, IOError, ValueError):
        return None


def read_manifest(folder, revision):
    return read_json(os.path.join(folder, manifest_name(revision)))


def complete(folder, revision):
    """(True, manifest) when the folder holds the whole repository at `revision` as its
    manifest lists it (the ref, every link, every file at its size; contents are checked when
    written, not here), else (False, why)."""
    manifest = read_manifest(folder, revision)
    if not manifest:
        return False, "not in the cache"
    try:
        with open(os.path.join(folder, "refs", revision)) as handle:
            ref = handle.read().strip()
    except (OSError, IOError):
        ref = None
    if ref != manifest.get("commit"):
        return False, "refs/%s is not the manifest's commit" % revision
    for entry in manifest.get("files") or []:
        path = os.path.join(folder, _safe(entry["path"]))
        if not os.path.isfile(path) or os.path.getsize(path) != entry["size"]:
            return False, "%s is missing or incomplete" % entry["path"]
    for link in manifest.get("links") or []:
        if not os.path.exists(os.path.join(folder, _safe(link["path"]))):
            return False, "%s is missing" % link["path"]
    return True, manifest


def look(cache, repos):
    """{key: {complete, commit, bytes, why}} of each repository ({key, repo_id, repo_type,
    revision}) in the hub cache folder `cache`."""
    found = {}
    for repo in repos:
        folder = os.path.join(cache, repo_folder(repo["repo_id"], repo.get("repo_type") or "model"))
        ok, detail = complete(folder, repo["revision"])
        found[repo["key"]] = {
            "complete": ok,
            "commit": detail["commit"] if ok else None,
            "bytes": detail["bytes"] if ok else 0,
            "why": None if ok else detail,
            "folder": folder,
        }
    return found


# -- serving a folder to the other nodes ------------------------------------------------------


class _Server(ThreadingMixIn, HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def make_server(repos, address, port, counters=None):
    """An HTTP server of repository folders, `repos` {folder: revision}: for each, GET
    /NAME/manifest (its manifest) and GET /NAME/file/PATH (a file the manifest lists, with
    Range), NAME the folder's name (``models--ORG--NAME``). Nothing else is served."""
    served = {}
    for folder, revision in repos.items():
        manifest = read_manifest(folder, revision)
        if not manifest:
            raise HubCacheError("no complete copy of the repository in %s to serve" % folder)
        served[os.path.basename(os.path.normpath(folder))] = (
            folder,
            json.dumps(manifest).encode("utf-8"),
            dict((f["path"], f) for f in manifest["files"]),
        )
    counters = counters if counters is not None else {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # no stderr noise
            pass

        def do_GET(self):
            counters["last"] = time.time()
            name, _slash, rest = self.path.lstrip("/").partition("/")
            if name not in served:
                self._send(404, b"not found", "text/plain")
                return
            folder, body, listed = served[name]
            if rest == "manifest":
                self._send(200, body, "application/json")
                return
            if not rest.startswith("file/"):
                self._send(404, b"not found", "text/plain")
                return
            relative = unquote(rest[len("file/") :])
            entry = listed.get(relative)
            if entry is None:
                self._send(404, b"not listed", "text/plain")
                return
            path = os.path.join(folder, relative)
            size = entry["size"]
            start = 0
            wanted = self.headers.get("Range")
            found = re.match(r"^bytes=(\d+)-$", wanted or "")
            if found and int(found.group(1)) < size:
                start = int(found.group(1))
            self.send_response(206 if start else 200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size - start))
            if start:
                self.send_header("Content-Range", "bytes %d-%d/%d" % (start, size - 1, size))
            self.end_headers()
            sent = 0
            with open(path, "rb") as handle:
                handle.seek(start)
                for block in iter(lambda: handle.read(CHUNK), b""):
                    self.wfile.write(block)
                    sent += len(block)
                    counters["last"] = time.time()
            with lock:
                counters["bytes"] = counters.get("bytes", 0) + sent
                counters["files"] = counters.get("files", 0) + 1

        def _send(self, status, data, kind):
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return _Server((address, port), Handler)


def serve(repos, address, port, state_path, seconds, idle=IDLE_S):
    """Serve the repository folders ({folder: revision}) until `seconds` pass, nothing was
    asked for `idle` seconds, or the process is stopped, recording the state (listening, bytes
    sent) in state_path."""
    counters = {"last": time.time()}
    state = {"state": "starting", "pid": os.getpid(), "address": address, "port": port}
    try:
        server = make_server(repos, address, port, counters)
    except (HubCacheError, OSError, socket.error) as exc:
        state.update(state="failed", kind="serve", error=str(exc))
        write_json(state_path, state)
        return
    thread = threading.Thread(target=server.serve_forever)
    thread.daemon = True
    thread.start()
    deadline = time.time() + seconds
    state.update(state="serving", started=time.time())
    while time.time() < deadline and time.time() - counters["last"] < idle:
        state.update(sent=counters.get("bytes", 0), files=counters.get("files", 0))
        write_json(state_path, state)
        time.sleep(1)
    server.shutdown()
    state.update(state="ended", sent=counters.get("bytes", 0))
    write_json(state_path, state)


# -- copying a folder from another node -------------------------------------------------------


def _open(url, timeout, headers=None):
    return open_url(url, headers=headers or {}, timeout=timeout, use_proxy=False)


def _fetch_file(source, entry, folder, timeout, progress):
    """One listed file into folder: resumed from a partial copy, checked against the
    manifest's size and SHA-256 (and a blob against its name), then moved into place."""
    relative = _safe(entry["path"])
    final = os.path.join(folder, relative)
    if (
        os.path.isfile(final)
        and os.path.getsize(final) == entry["size"]
        and file_hashes(final)[0] == entry["sha256"]
    ):
        progress(entry["size"], skipped=True)
        return False
    partial = final + ".incomplete"
    if not os.path.isdir(os.path.dirname(final)):
        os.makedirs(os.path.dirname(final))
    have = os.path.getsize(partial) if os.path.isfile(partial) else 0
    if have > entry["size"]:
        os.remove(partial)
        have = 0
    if have:
        progress(have)
    if have < entry["size"]:
        headers = {"Range": "bytes=%d-" % have} if have else {}
        response = _open(source + "/file/" + quote(relative), timeout, headers)
        if have and response.status != 206:  # the server sent it whole
            have = 0
            with open(partial, "wb"):
                pass
        with open(partial, "ab" if have else "wb") as handle:
            for block in iter(lambda: response.read(CHUNK), b""):
                handle.write(block)
                progress(len(block))
    sha256, sha1 = file_hashes(partial)
    name = relative.split("/", 1)[1] if relative.startswith("blobs/") else None
    if (
        os.path.getsize(partial) != entry["size"]
        or sha256 != entry["sha256"]
        or (name and not blob_matches_name(name, sha256, sha1))
    ):
        os.remove(partial)
        raise HubCacheError(
            "%s arrived damaged (its size or SHA-256 is not rank 0's); it was removed: run again"
            % relative
        )
    os.rename(partial, final)
    return True


def pull(source, folder, revision, state_path, timeout=60):
    """Copy the repository folder from `source` (http://ADDRESS:PORT/NAME, another node's
    serve()) into `folder`: the files, then the links, the ref and the manifest last."""
    state = {"state": "pulling", "pid": os.getpid(), "source": source, "received": 0, "total": None}
    shown = [0.0]

    def progress(count, skipped=False):
        state["received"] += count
        if skipped:
            state["skipped"] = state.get("skipped", 0) + count
        now = time.time()
        if now - shown[0] >= 1:
            write_json(state_path, state)
            shown[0] = now

    try:
        manifest = json.loads(_open(source + "/manifest", timeout).read().decode("utf-8"))
        if manifest.get("revision") != revision:
            raise HubCacheError(
                "the source serves revision %r, not %r" % (manifest.get("revision"), revision)
            )
        state["total"] = sum(f["size"] for f in manifest["files"])
        state["commit"] = manifest["commit"]
        write_json(state_path, state)
        fetched = 0
        for entry in manifest["files"]:
            fetched += _fetch_file(source, entry, folder, timeout, progress)
        for link in manifest["links"]:
            path = os.path.join(folder, _safe(link["path"]))
            if not os.path.isdir(os.path.dirname(path)):
                os.makedirs(os.path.dirname(path))
            if os.path.islink(path) and os.readlink(path) == link["target"]:
                continue
            if os.path.lexists(path):
                os.remove(path)
            os.symlink(link["target"], path)
        ref = os.path.join(folder, "refs", _safe(revision))
        if not os.path.isdir(os.path.dirname(ref)):
            os.makedirs(os.path.dirname(ref))
        with open(ref, "w") as handle:
            handle.write(manifest["commit"])
        write_json(os.path.join(folder, manifest_name(revision)), manifest)
        state.update(state="done", fetched=fetched, ended=time.time())
    except HTTPError as exc:
        state.update(
            state="failed", kind="source", error="%s answered HTTP %s" % (source, exc.code)
        )
    except (URLError, socket.error, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        kind = "disk" if getattr(reason, "errno", None) == errno.ENOSPC else "source"
        state.update(state="failed", kind=kind, error="%s: %s" % (source, reason))
    except (HubCacheError, ValueError, KeyError) as exc:
        state.update(state="failed", kind="copy", error=str(exc))
    write_json(state_path, state)
