"""A test double of the Hugging Face Hub's download API, for the box (the Hub is out of reach).

It follows the contract huggingface_hub (1.33, the training image's) relies on through
HF_ENDPOINT, as snapshot_download and hf_hub_download use it:

- ``GET /api/models/REPO/revision/REV[?blobs=true]``: the repository's info - ``sha`` (the
  commit), ``siblings`` (``rfilename``; with blobs, ``size``, ``blobId`` and ``lfs``
  {size, sha256, pointerSize});
- ``GET /api/models/REPO/tree/REV[/PATH]?recursive=...``: the files (``type``, ``path``,
  ``size``, ``oid``, ``lfs`` {oid, size, pointerSize}), folders too;
- ``HEAD``/``GET /REPO/resolve/REV/PATH``: ``X-Repo-Commit``, ``ETag`` (an LFS file's SHA-256,
  else its git blob SHA-1), ``X-Linked-Etag``/``X-Linked-Size`` for LFS files, ``Content-Length``,
  ``Accept-Ranges``; ``Range: bytes=N-`` answered 206 with ``Content-Range``. Files are served in
  place (as a mirror does); the Hub's redirect of LFS files to its CDN is not modelled.
- errors as the Hub sends them (``X-Error-Code``, ``X-Error-Message``): ``RepoNotFound`` (401
  without a token, 404 with one), ``RevisionNotFound``, ``EntryNotFound``, ``GatedRepo`` (401
  without a token, 403 with a token that was not granted access) for a gated repository's files
  (its info stays public, as on the Hub), and ``Invalid credentials in Authorization header`` (401)
  for an unknown token.

Every request is counted (``requests``: method, path, status, bytes sent); ``rate`` (bytes/s,
shared by every connection: a site's link to the Hub) throttles what it sends.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

# Files of these kinds, or larger than LFS_MIN, are LFS files on the Hub (its .gitattributes).
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx")
LFS_MIN = 10 * 1024 * 1024
CHUNK = 256 * 1024


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324 - git's id


@dataclass
class HubFile:
    path: str
    data: bytes

    @property
    def lfs(self) -> bool:
        return self.path.endswith(LFS_SUFFIXES) or len(self.data) >= LFS_MIN

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else git_sha1(self.data)

    def pointer(self) -> bytes:
        return (
            f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\n"
            f"size {len(self.data)}\n"
        ).encode()


@dataclass
class HubRepo:
    repo_id: str
    files: dict[str, HubFile]
    repo_type: str = "model"
    gated: bool = False
    granted: set[str] = field(default_factory=set)  # tokens with access to a gated repo
    branches: dict[str, str] = field(default_factory=dict)

    @property
    def commit(self) -> str:
        digest = hashlib.sha1(self.repo_id.encode())  # noqa: S324 - a made-up commit id
        for name in sorted(self.files):
            digest.update(name.encode() + b"\0" + self.files[name].etag.encode())
        return digest.hexdigest()

    def resolve(self, revision: str) -> str | None:
        if revision in ("main", self.commit):
            return self.commit
        return self.branches.get(revision)


@dataclass
class Request:
    method: str
    path: str
    status: int
    sent: int
    token: bool


class HubDouble:
    """The double; start() serves it on (address, port) in a thread, stop() ends it."""

    def __init__(self, address: str = "127.0.0.1", port: int = 0, rate: float | None = None):
        self.repos: dict[tuple[str, str], HubRepo] = {}  # (repo_type, repo_id)
        self.tokens: set[str] = set()
        self._requests: list[Request] = []
        self._in_flight = 0
        self.rate = rate
        self._lock = threading.Lock()
        self._budget_at = time.monotonic()
        self._server = ThreadingHTTPServer((address, port), self._handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add_repo(self, repo_id: str, files: dict[str, bytes | Path], **options) -> HubRepo:
        loaded = {
            name: HubFile(name, data.read_bytes() if isinstance(data, Path) else data)
            for name, data in files.items()
        }
        repo = HubRepo(repo_id, loaded, **options)
        self.repos[(repo.repo_type, repo_id)] = repo
        return repo

    def repo(self, repo_id: str, repo_type: str = "model") -> HubRepo:
        return self.repos[(repo_type, repo_id)]

    def start(self) -> HubDouble:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def requests(self) -> list[Request]:
        """Every request answered, once those being answered are done (a client may have its
        answer a moment before the request is counted)."""
        deadline = time.monotonic() + 5
        while self._in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        with self._lock:
            return list(self._requests)

    def reset(self) -> None:
        self.requests  # noqa: B018 - those under way are counted first
        with self._lock:
            self._requests.clear()

    def downloads(self, repo_id: str | None = None, repo_type: str = "model") -> list[Request]:
        """The GET requests of files (resolve), the downloads themselves."""
        prefix = "" if repo_type == "model" else f"/{repo_type}s"
        return [
            r
            for r in self.requests
            if r.method == "GET"
            and "/resolve/" in r.path
            and (repo_id is None or r.path.startswith(f"{prefix}/{repo_id}/resolve/"))
        ]

    def sent(self) -> int:
        return sum(r.sent for r in self.requests)

    def _throttle(self, count: int) -> None:
        """Wait until `count` more bytes fit the shared rate."""
        if not self.rate:
            return
        with self._lock:
            now = time.monotonic()
            self._budget_at = max(self._budget_at, now) + count / self.rate
            wait = self._budget_at - now
        if wait > 0:
            time.sleep(wait)

    def _handler(self):
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self._answer(head=True)

            def do_GET(self):
                self._answer(head=False)

            def _answer(self, head: bool) -> None:
                self.sent = 0
                with double._lock:
                    double._in_flight += 1
                try:
                    status = self._route(head)
                except Exception:
                    status = 0
                    raise
                finally:
                    with double._lock:
                        double._in_flight -= 1
                        double._requests.append(
                            Request(
                                self.command,
                                urlsplit(self.path).path,
                                status,
                                self.sent,
                                "Authorization" in self.headers,
                            )
                        )

            def _token(self) -> str | None:
                value = self.headers.get("Authorization") or ""
                return value[len("Bearer ") :] if value.startswith("Bearer ") else None

            def _error(self, status: int, code: str | None, message: str, commit=None) -> int:
                body = json.dumps({"error": message}).encode()
                self.send_response(status)
                if code:
                    self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", message)
                if commit:
                    self.send_header("X-Repo-Commit", commit)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                return status

            def _json(self, data) -> int:
                body = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                self.sent += len(body)
                return 200

            def _repo(self, repo_id: str, files: bool, repo_type: str = "model"):
                """(repo, None) or (None, the status of the error sent)."""
                token = self._token()
                if token is not None and token not in double.tokens:
                    return None, self._error(
                        401, None, "Invalid credentials in Authorization header"
                    )
                repo = double.repos.get((repo_type, repo_id))
                if repo is None:
                    return None, self._error(
                        404 if token else 401, "RepoNotFound", "Repository not found"
                    )
                if files and repo.gated and token not in repo.granted:
                    return None, self._error(
                        403 if token else 401,
                        "GatedRepo",
                        f"Access to model {repo_id} is restricted. You must have access to it "
                        "and be authenticated to access it. Please log in.",
                    )
                return repo, None

            def _route(self, head: bool) -> int:
                parts = urlsplit(self.path)
                path, query = unquote(parts.path), parse_qs(parts.query)
                api = re.match(
                    r"^/api/(model|dataset)s/(.+?)/(revision|tree)/([^/]+)(?:/(.*))?$", path
                )
                if api and not head:
                    kind, api = api[1], [None, *api.groups()[1:]]
                    repo, failed = self._repo(api[1], files=False, repo_type=kind)
                    if repo is None:
                        return failed
                    commit = repo.resolve(api[3])
                    if commit is None:
                        return self._error(404, "RevisionNotFound", f"Invalid rev id: {api[3]}")
                    if api[2] == "revision":
                        return self._json(self._info(repo, commit, "blobs" in query))
                    recursive = (query.get("recursive") or ["false"])[0].lower() == "true"
                    return self._json(self._tree(repo, api[4] or "", recursive))
                resolve = re.match(r"^/(datasets/)?(.+?)/resolve/([^/]+)/(.+)$", path)
                if resolve:
                    kind = "dataset" if resolve[1] else "model"
                    resolve = [None, *resolve.groups()[1:]]
                    repo, failed = self._repo(resolve[1], files=True, repo_type=kind)
                    if repo is None:
                        return failed
                    commit = repo.resolve(resolve[2])
                    if commit is None:
                        return self._error(404, "RevisionNotFound", f"Invalid rev id: {resolve[2]}")
                    entry = repo.files.get(resolve[3])
                    if entry is None:
                        return self._error(404, "EntryNotFound", "Entry not found", commit)
                    return self._file(entry, commit, head)
                return self._error(404, None, "Not Found")

            @staticmethod
            def _info(repo: HubRepo, commit: str, blobs: bool) -> dict:
                siblings = []
                for name in sorted(repo.files):
                    entry = repo.files[name]
                    sibling = {"rfilename": name}
                    if blobs:
                        sibling.update(
                            size=len(entry.data),
                            blobId=git_sha1(entry.pointer() if entry.lfs else entry.data),
                        )
                        if entry.lfs:
                            sibling["lfs"] = {
                                "size": len(entry.data),
                                "sha256": entry.sha256,
                                "pointerSize": len(entry.pointer()),
                            }
                    siblings.append(sibling)
                return {
                    "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24],  # noqa: S324
                    "id": repo.repo_id,
                    "modelId": repo.repo_id,
                    "private": False,
                    "gated": "manual" if repo.gated else False,
                    "disabled": False,
                    "sha": commit,
                    "tags": [],
                    "siblings": siblings,
                }

            @staticmethod
            def _tree(repo: HubRepo, under: str, recursive: bool) -> list:
                prefix = under.rstrip("/") + "/" if under else ""
                entries, folders = [], set()
                for name in sorted(repo.files):
                    if not name.startswith(prefix):
                        continue
                    rest = name[len(prefix) :]
                    if "/" in rest:
                        parts = rest.split("/")
                        for depth in range(1, len(parts) if recursive else 2):
                            folders.add(prefix + "/".join(parts[:depth]))
                        if not recursive:
                            continue
                    entry = repo.files[name]
                    item = {
                        "type": "file",
                        "oid": git_sha1(entry.pointer() if entry.lfs else entry.data),
                        "size": len(entry.data),
                        "path": name,
                    }
                    if entry.lfs:
                        item["lfs"] = {
                            "oid": entry.sha256,
                            "size": len(entry.data),
                            "pointerSize": len(entry.pointer()),
                        }
                    entries.append(item)
                tree_oid = "0" * 40
                return [
                    {"type": "directory", "oid": tree_oid, "size": 0, "path": f}
                    for f in sorted(folders)
                ] + entries

            def _file(self, entry: HubFile, commit: str, head: bool) -> int:
                size = len(entry.data)
                start = 0
                wanted = re.match(r"^bytes=(\d+)-(\d*)$", self.headers.get("Range") or "")
                end = size - 1
                if wanted:
                    start = int(wanted[1])
                    if wanted[2]:
                        end = min(int(wanted[2]), size - 1)
                    if start >= size:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{size}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return 416
                status = 206 if wanted else 200
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("ETag", f'"{entry.etag}"')
                self.send_header("X-Repo-Commit", commit)
                if entry.lfs:
                    self.send_header("X-Linked-Etag", f'"{entry.etag}"')
                    self.send_header("X-Linked-Size", str(size))
                self.send_header("Content-Length", str(end - start + 1))
                if wanted:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
                self.end_headers()
                if head:
                    return status
                view = memoryview(entry.data)[start : end + 1]
                for offset in range(0, len(view), CHUNK):
                    block = view[offset : offset + CHUNK]
                    double._throttle(len(block))
                    self.wfile.write(block)
                    self.sent += len(block)
                return status

        return Handler


# A fixed port on the cluster's own gateway address: the endpoint is part of a job's env, so a
# kept cluster's next session finds the same one.
PORT = 18080


def on_cluster(definition, port: int = PORT, rate: float | None = None) -> HubDouble:
    """The double, started, on the cluster's VPC gateway (the host's address on the VMs'
    network, which every VM reaches)."""
    return HubDouble(definition.networks["vpc"].gateway, port, rate).start()
