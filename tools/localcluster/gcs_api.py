"""Cloud Storage for the local cluster: storage.googleapis.com, which neither the box nor the tests
can reach, served by the PyPI emulator gcp-storage-emulator behind a front of ours that keeps
the Cloud Storage JSON API contract where the emulator does not.

The contract is the JSON API v1 (https://cloud.google.com/storage/docs/json_api/v1, the
discovery document storage.v1.json that ships in google-api-python-client) for what
google-cloud-storage 3.x uses: buckets.get, buckets.insert (POST /storage/v1/b?project=P),
buckets.list, buckets.delete; objects.insert on /upload/storage/v1/b/B/o with uploadType media,
multipart (metadata part, then the media) and resumable (a session: POST answers 200 and a
Location with upload_id, PUTs of Content-Range chunks answer 308 with Range until the last, which
answers the object; https://cloud.google.com/storage/docs/performing-resumable-uploads; the
session URL is the credential, as on GCS: its requests need no token); objects.get (metadata,
or the media with alt=media, also on /download/storage/v1/...); objects.list; objects.delete.
Anything else: 404 notFound (or 405 on a known path), in Google's JSON error shape.

What the front does over the emulator (the emulator's deviations from the contract, fixed):

- auth, which the emulator has none of: a request without a bearer token gets 401 (reason
  required, "Anonymous caller does not have PERMISSION access to ..."), one with a token the box
  did not issue 401 "Invalid Credentials" (reason authError). Valid tokens: those of the box's
  OAuth2 endpoint (compute_api.py; the caller is the key's client_email, learnt from its
  tokeninfo endpoint through the box's proxy, cached until the token expires) and those of the
  VMs' metadata servers (gce_metadata.make_token, HMAC-signed with the cluster's key: the caller
  is the VM's service account);
- IAM as GCS answers it: every method maps to its permission (PERMISSIONS); a permission denied
  to a caller on a bucket (the control API) is a 403 forbidden "EMAIL does not have PERMISSION
  access to the Google Cloud Storage object|bucket|project. Permission 'PERMISSION' denied on
  resource (or it may not exist).";
- errors: the emulator answers 404 and most 400/409s with an empty body; here every error is
  Google's JSON error ({"error": {"code", "message", "errors": [{"message", "domain",
  "reason"}]}}) with GCS's messages ("No such object: B/O", "The specified bucket does not
  exist.", "You already own this bucket. Please select another name.", "The bucket you tried to
  delete is not empty.");
- links: the emulator writes selfLink relative and mediaLink (and a resumable session's Location)
  with http:// and the Host it was asked; here they are GCS's: selfLink
  https://www.googleapis.com/storage/v1/b/B[/o/O], mediaLink
  https://storage.googleapis.com/download/storage/v1/b/B/o/O?generation=G&alt=media, Location
  https://storage.googleapis.com/upload/..., object names percent-encoded;
- resources: null fields and empty lists (acl, items, prefixes) are left out, as GCS does;
- objects.list pages: the emulator returns every match at once; here maxResults (default and at
  most 1000) and pageToken page through items and prefixes in name order, nextPageToken while
  more remain; startOffset and endOffset are applied;
- preconditions, which the emulator ignores: ifGenerationMatch (0: the object must not exist),
  ifGenerationNotMatch, ifMetagenerationMatch and ifMetagenerationNotMatch on objects.insert
  (checked when the upload, or the resumable session, starts), get and delete: 412
  conditionNotMet "At least one of the pre-conditions you specified did not hold."; objects.get
  or delete with a generation other than the live one is a 404 (the emulator keeps one);
- media downloads: Range (bytes=A-B, A-, -N) is served here (the emulator knows only A-B), with
  206 and Content-Range, 416 when unsatisfiable; every download carries X-Goog-Hash (crc32c and
  md5 of the whole object, base64 of the big-endian value, as GCS), X-Goog-Generation,
  X-Goog-Metageneration, X-Goog-Stored-Content-Length and -Encoding;
- objects.delete and buckets.delete answer 204 without a body, as GCS.

Not served or not checked: object versions, ACLs, IAM policies, compose/copy/rewrite, patch,
XML API, batch; the resumable session's precondition is checked at its start only.

Reached as storage.googleapis.com:443: from this machine through the box's proxy (compute_api.py
relays CONNECT to storage.googleapis.com to this front's TLS port on loopback), and from the VMs
at the address the cluster's hosts file gives the name (this front listens there on port 443:
the host's own address on the VM network). TLS with a certificate for storage.googleapis.com
from the box's CA (the compute fake's STATE/ca.pem and ca-key.pem). It listens on loopback and
on the --listen addresses only.

Plain requests to the control port's /_fake/... are the tests' control API: GET requests (the
log: per request its time, identity, method, host, path, query, body (the JSON metadata, not the
media), upload (media, multipart, resumable, session), method (the JSON API method id), status,
response (JSON, or null for media and empty bodies)), DELETE requests, GET history (every entry
since the start), POST buckets {"name"} (creates it; 200 with the bucket, or when it exists),
DELETE buckets/NAME (with its objects), GET deny, POST deny {"identity" (an email or "*"),
"permission", "bucket" (a name or "*")}, DELETE deny (every denial lifted).

Usage: python gcs_api.py start|stop|serve --state DIR --ca-dir GCE_STATE [--listen ADDRESS]...
  [--metadata-key FILE] [--project P]
  start daemonizes, waits until it answers and writes DIR/client.json (pid, api (host:port of
  the loopback TLS port), control, listen); stop ends it by that pid; serve runs in the
  foreground. The objects live in DIR/data.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import http.client
import json
import logging
import os
import re
import signal
import ssl
import sys
import threading
import time
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

try:
    from . import gce_metadata
except ImportError:  # run as a script
    import gce_metadata

API_HOST = "storage.googleapis.com"
SELF_ROOT = "https://www.googleapis.com/storage/v1"
MEDIA_ROOT = f"https://{API_HOST}/download/storage/v1"
TOKENINFO = "https://oauth2.googleapis.com/tokeninfo"
PREFIXES = ("/storage/v1", "/upload/storage/v1", "/download/storage/v1")
MAX_RESULTS = 1000
# (HTTP method, path below the prefix) -> (JSON API method, IAM permission, resource kind)
ROUTES = (
    ("GET", r"/b", "storage.buckets.list", "storage.buckets.list", "project"),
    ("POST", r"/b", "storage.buckets.insert", "storage.buckets.create", "project"),
    ("GET", r"/b/([^/]+)", "storage.buckets.get", "storage.buckets.get", "bucket"),
    ("DELETE", r"/b/([^/]+)", "storage.buckets.delete", "storage.buckets.delete", "bucket"),
    ("GET", r"/b/([^/]+)/o", "storage.objects.list", "storage.objects.list", "bucket"),
    ("POST", r"/b/([^/]+)/o", "storage.objects.insert", "storage.objects.create", "object"),
    ("PUT", r"/b/([^/]+)/o", "storage.objects.insert", "storage.objects.create", "object"),
    ("GET", r"/b/([^/]+)/o/(.+)", "storage.objects.get", "storage.objects.get", "object"),
    ("DELETE", r"/b/([^/]+)/o/(.+)", "storage.objects.delete", "storage.objects.delete", "object"),
)
# Each JSON API method served, and the IAM permission it needs.
PERMISSIONS = {method: permission for _verb, _path, method, permission, _kind in ROUTES}
RESOURCE_NAMES = {
    "object": "Google Cloud Storage object",
    "bucket": "Google Cloud Storage bucket",
    "project": "Google Cloud project",
}
PRECONDITIONS = (
    "ifGenerationMatch",
    "ifGenerationNotMatch",
    "ifMetagenerationMatch",
    "ifMetagenerationNotMatch",
)
# Request headers the emulator is given (the rest, Authorization and Range among them, are not).
FORWARDED = ("content-type", "content-range", "content-encoding", "x-upload-content-type")


class ApiError(Exception):
    def __init__(self, code, reason, message, **extra):
        super().__init__(message)
        self.code, self.reason, self.message, self.extra = code, reason, message, extra

    def body(self):
        entry = {"message": self.message, "domain": "global", "reason": self.reason, **self.extra}
        return {"error": {"code": self.code, "message": self.message, "errors": [entry]}}


def no_bucket():
    return ApiError(404, "notFound", "The specified bucket does not exist.")


def no_object(bucket, name):
    return ApiError(404, "notFound", f"No such object: {bucket}/{name}")


def precondition_failed():
    return ApiError(
        412,
        "conditionNotMet",
        "At least one of the pre-conditions you specified did not hold.",
        locationType="header",
        location="If-Match",
    )


def denied(who, permission, kind):
    return (
        f"{who} does not have {permission} access to the {RESOURCE_NAMES[kind]}. Permission "
        f"'{permission}' denied on resource (or it may not exist)."
    )


class Answer:
    """What the front sends: a status, headers, a body (bytes), and what the log records."""

    def __init__(self, status, payload=None, data=None, headers=None):
        self.status, self.payload, self.headers = status, payload, dict(headers or {})
        if payload is not None:
            data = json.dumps(payload).encode()
            self.headers.setdefault("Content-Type", "application/json; charset=UTF-8")
        self.data = data or b""


class Storage:
    """The front's state: the emulator behind it, the callers' identities, denials, the log."""

    def __init__(self, data_dir, ca_dir=None, metadata_key=None, project="hostnet-box"):
        from gcp_storage_emulator.handlers import buckets as emulator_buckets
        from gcp_storage_emulator.server import RequestHandler
        from gcp_storage_emulator.storage import Storage as EmulatorStorage

        logging.getLogger("gcp_storage_emulator").setLevel(logging.ERROR)
        for name in ("api.object", "api.bucket", "gcp_storage_emulator.server"):
            logging.getLogger(name).setLevel(logging.ERROR)
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        number = gce_metadata.numeric_id(project, digits=12)
        self.emulator = EmulatorStorage(data_dir=str(data_dir), project_number=str(number))
        self._create_bucket = emulator_buckets.create_bucket
        # The emulator's own server, single-threaded (its storage is not thread-safe), loopback.
        from http.server import HTTPServer

        self.backend = HTTPServer(
            ("127.0.0.1", 0), functools.partial(RequestHandler, self.emulator)
        )
        self.backend_lock = threading.Lock()
        self.ca_dir = Path(ca_dir) if ca_dir else None
        self.metadata_key = metadata_key  # path of the metadata servers' token key
        self.project = project
        self.tokens = {}  # access token -> (email, expiry)
        self.deny = set()  # (identity or "*", permission, bucket or "*")
        self.lock = threading.RLock()
        self.log = []
        self.history = []

    # -- control ----------------------------------------------------------------------------

    def create_bucket(self, name):
        with self.backend_lock:
            if name not in self.emulator.buckets:
                self._create_bucket(name, self.emulator)
            return fix_bucket(dict(self.emulator.buckets[name]))

    def delete_bucket(self, name):
        with self.backend_lock:
            if name not in self.emulator.buckets:
                return False
            for object_name in list(self.emulator.objects.get(name, {})):
                self.emulator.delete_file(name, object_name)
            for upload_id, obj in list(self.emulator.resumable.items()):
                if obj.get("bucket") == name:
                    self.emulator.delete_resumable_file_obj(upload_id)
            self.emulator.soft_deleted.pop(name, None)
            self.emulator.delete_bucket(name)
            return True

    def record(self, entry):
        with self.lock:
            self.log.append(entry)
            self.history.append(entry)

    # -- identity ---------------------------------------------------------------------------

    def identity(self, token):
        """The caller a bearer token stands for, or None."""
        if token.startswith(gce_metadata.TOKEN_PREFIX):
            key = gce_metadata.read_key(self.metadata_key)
            return gce_metadata.token_identity(token, key) if key else None
        with self.lock:
            known = self.tokens.get(token)
        if known and known[1] > time.time():
            return known[0]
        info = self._tokeninfo(token)
        if not info:
            return None
        email, expiry = info["email"], float(info["exp"])
        with self.lock:
            self.tokens[token] = (email, expiry)
        return email

    def _tokeninfo(self, token):
        """Ask the box's OAuth2 endpoint (through its proxy, trusting its CA) about a token."""
        import requests

        if self.ca_dir is None or not (self.ca_dir / "client.json").exists():
            return None
        client = json.loads((self.ca_dir / "client.json").read_text())
        session = requests.Session()
        session.trust_env = False
        session.proxies = {"https": client["proxy"]}
        session.verify = client["ca"]
        try:
            answer = session.get(TOKENINFO, params={"access_token": token}, timeout=10)
        except requests.RequestException:
            return None
        finally:
            session.close()
        return answer.json() if answer.status_code == 200 else None

    def allowed(self, who, permission, bucket):
        with self.lock:
            return not any(
                (i, p, b) in self.deny
                for i in (who, "*")
                for p in (permission,)
                for b in (bucket, "*")
            )

    # -- the emulator -----------------------------------------------------------------------

    def backend_call(self, method, path, body=None, headers=None):
        """(status, headers, body) of one request to the emulator."""
        connection = http.client.HTTPConnection("127.0.0.1", self.backend.server_port, timeout=60)
        try:
            with self.backend_lock:
                connection.request(
                    method, path, body=body, headers={"Host": API_HOST, **(headers or {})}
                )
                response = connection.getresponse()
                data = response.read()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, data
        except (OSError, http.client.HTTPException) as exc:
            raise ApiError(
                500, "backendError", f"Backend Error ({exc.__class__.__name__})"
            ) from exc
        finally:
            connection.close()

    def object_meta(self, bucket, name):
        """The emulator's resource of a live object, or None."""
        status, _headers, data = self.backend_call(
            "GET", f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"
        )
        if status == 200:
            return json.loads(data)
        return None

    def bucket_exists(self, bucket):
        with self.backend_lock:
            return bucket in self.emulator.buckets


# -- the API --------------------------------------------------------------------------------


def fix_object(obj):
    """An emulator object resource as GCS writes it (links, no nulls or empty lists)."""
    obj = clean(obj)
    bucket, name = obj["bucket"], obj["name"]
    quoted = quote(name, safe="")
    obj["selfLink"] = f"{SELF_ROOT}/b/{bucket}/o/{quoted}"
    obj["mediaLink"] = (
        f"{MEDIA_ROOT}/b/{bucket}/o/{quoted}?generation={obj['generation']}&alt=media"
    )
    if obj.get("size") is not None:
        obj["size"] = str(obj["size"])
    return obj


def fix_bucket(bucket):
    bucket = clean(bucket)
    bucket["selfLink"] = f"{SELF_ROOT}/b/{bucket['name']}"
    return bucket


def clean(value):
    """Without null fields and empty lists, at every level (GCS leaves them out)."""
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items() if v is not None and v != []}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


def check_preconditions(query, obj):
    """412 unless every precondition of the query holds for `obj` (None: no live object)."""
    generation = int(obj["generation"]) if obj else 0
    metageneration = int(obj["metageneration"]) if obj else None
    for name in PRECONDITIONS:
        if name not in query:
            continue
        try:
            wanted = int(query[name][0])
        except ValueError:
            raise ApiError(400, "invalid", f"Invalid argument for {name}.") from None
        held = {
            "ifGenerationMatch": generation == wanted,
            "ifGenerationNotMatch": generation != wanted,
            "ifMetagenerationMatch": metageneration == wanted,
            "ifMetagenerationNotMatch": metageneration != wanted,
        }[name]
        if not held:
            raise precondition_failed()


def error_from_backend(status, data, bucket=None, name=None, deleting=False):
    """An emulator error answer as Google's JSON error with GCS's message."""
    message = ""
    with contextlib.suppress(ValueError, AttributeError):
        message = json.loads(data)["error"].get("message") or ""
    if status == 404:
        raise no_object(bucket, name) if name else no_bucket()
    if status == 409:
        if deleting or "not empty" in message or "pending upload" in message:
            raise ApiError(409, "conflict", "The bucket you tried to delete is not empty.")
        raise ApiError(409, "conflict", "You already own this bucket. Please select another name.")
    if status == 400:
        raise ApiError(400, "invalid", message or "Invalid argument.")
    raise ApiError(500, "backendError", message or f"Backend Error (HTTP {status})")


def multipart_metadata(content_type, body):
    """The JSON metadata part of a multipart upload."""
    message = BytesParser().parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    parts = message.get_payload() if message.is_multipart() else []
    if len(parts) != 2:
        raise ApiError(400, "invalid", "Multipart upload: expected 2 parts, metadata and media.")
    try:
        return json.loads(parts[0].get_payload(decode=True))
    except ValueError:
        raise ApiError(400, "parseError", "Parse Error") from None


def byte_range(header, size):
    """(start, end) inclusive of a Range header, None for the whole object; 416 if off."""
    match = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", header or "")
    if not match or match.groups() == ("", ""):
        return None
    first, last = match.groups()
    if first == "":
        start, end = max(0, size - int(last)), size - 1
    else:
        start, end = int(first), min(size - 1, int(last)) if last else size - 1
    if start >= size or start > end:
        raise ApiError(
            416, "requestedRangeNotSatisfiable", "The requested range cannot be satisfied."
        )
    return start, end


class Request:
    def __init__(self, method, path, query, headers, body):
        self.method, self.path, self.query, self.headers, self.body = (
            method,
            path,
            query,
            headers,
            body,
        )
        self.raw_path = None


def handle(storage, request, entry):
    """Answer one API request (Answer); fills the log entry's method, identity and body."""
    path = request.path
    prefix = next((p for p in PREFIXES if path == p or path.startswith(p + "/")), None)
    if prefix is None:
        raise ApiError(404, "notFound", "Not Found")
    rest = path[len(prefix) :]
    route = None
    known_path = False
    for verb, pattern, method_id, permission, kind in ROUTES:
        match = re.fullmatch(pattern, rest)
        if match:
            known_path = True
            if verb == request.method:
                route = (method_id, permission, kind, [unquote(g) for g in match.groups()])
                break
    if route is None:
        if known_path:
            raise ApiError(405, "methodNotAllowed", "Method not allowed")
        raise ApiError(404, "notFound", "Not Found")
    method_id, permission, kind, names = route
    upload = prefix == "/upload/storage/v1"
    if upload != (method_id == "storage.objects.insert"):
        raise ApiError(404, "notFound", "Not Found")
    if prefix == "/download/storage/v1" and method_id != "storage.objects.get":
        raise ApiError(404, "notFound", "Not Found")
    entry["method_id"] = method_id
    query = request.query
    session = upload and "upload_id" in query
    if session:
        entry["upload"] = "session"
        return resumable_chunk(storage, request)
    if request.method == "PUT":
        raise ApiError(405, "methodNotAllowed", "Method not allowed")

    # Authentication, then authorization.
    header = request.headers.get("authorization", "")
    token = header[len("Bearer ") :].strip() if header.startswith("Bearer ") else ""
    if not token:
        raise ApiError(
            401,
            "required",
            denied("Anonymous caller", permission, kind),
            locationType="header",
            location="Authorization",
        )
    who = storage.identity(token)
    entry["identity"] = who
    if who is None:
        raise ApiError(
            401, "authError", "Invalid Credentials", locationType="header", location="Authorization"
        )
    bucket = names[0] if names else None
    if not storage.allowed(who, permission, bucket or "*"):
        raise ApiError(403, "forbidden", denied(who, permission, kind))

    if method_id == "storage.buckets.list":
        return list_buckets(storage, query)
    if method_id == "storage.buckets.insert":
        return insert_bucket(storage, request, entry)
    if bucket is not None and not storage.bucket_exists(bucket):
        raise no_bucket()
    if method_id == "storage.buckets.get":
        status, _h, data = storage.backend_call("GET", f"/storage/v1/b/{quote(bucket)}")
        if status != 200:
            error_from_backend(status, data)
        return Answer(200, fix_bucket(json.loads(data)))
    if method_id == "storage.buckets.delete":
        status, _h, data = storage.backend_call("DELETE", f"/storage/v1/b/{quote(bucket)}")
        if status >= 300:
            error_from_backend(status, data, deleting=True)
        return Answer(204)
    if method_id == "storage.objects.list":
        return list_objects(storage, bucket, query)
    if method_id == "storage.objects.insert":
        return insert_object(storage, bucket, request, entry)
    name = names[1]
    obj = storage.object_meta(bucket, name)
    if obj is None or ("generation" in query and query["generation"][0] != obj["generation"]):
        raise no_object(bucket, name)
    check_preconditions(query, obj)
    if method_id == "storage.objects.delete":
        status, _h, data = storage.backend_call(
            "DELETE", f"/storage/v1/b/{quote(bucket)}/o/{quote(name, safe='')}"
        )
        if status >= 300:
            error_from_backend(status, data, bucket, name)
        return Answer(204)
    if prefix == "/download/storage/v1" or query.get("alt", [""])[0] == "media":
        entry["media"] = True
        return download(storage, bucket, name, obj, request)
    return Answer(200, fix_object(obj))


def list_buckets(storage, query):
    if not query.get("project"):
        raise ApiError(400, "required", "Required parameter: project")
    status, _h, data = storage.backend_call("GET", "/storage/v1/b")
    if status != 200:
        error_from_backend(status, data)
    items = [fix_bucket(b) for b in json.loads(data).get("items") or []]
    prefix = query.get("prefix", [""])[0]
    items = sorted((b for b in items if b["name"].startswith(prefix)), key=lambda b: b["name"])
    answer = {"kind": "storage#buckets"}
    if items:
        answer["items"] = items
    return Answer(200, answer)


def insert_bucket(storage, request, entry):
    if not request.query.get("project"):
        raise ApiError(400, "required", "Required parameter: project")
    body = request.json()
    entry["body"] = body
    name = body.get("name") if isinstance(body, dict) else None
    if not name:
        raise ApiError(400, "required", "Required")
    if not re.fullmatch(r"[a-z0-9][-a-z0-9_.]{1,61}[a-z0-9]", name):
        raise ApiError(400, "invalid", f"Invalid bucket name: '{name}'")
    status, _h, data = storage.backend_call(
        "POST",
        "/storage/v1/b",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    if status != 200:
        error_from_backend(status, data)
    return Answer(200, fix_bucket(json.loads(data)))


def list_objects(storage, bucket, query):
    def one(name):
        return query.get(name, [""])[0]

    forward = {k: one(k) for k in ("prefix", "delimiter", "matchGlob") if one(k)}
    suffix = "&".join(f"{k}={quote(v, safe='')}" for k, v in forward.items())
    status, _h, data = storage.backend_call(
        "GET", f"/storage/v1/b/{quote(bucket)}/o" + (f"?{suffix}" if suffix else "")
    )
    if status != 200:
        error_from_backend(status, data)
    listed = json.loads(data)
    entries = [(obj["name"], fix_object(obj)) for obj in listed.get("items") or []]
    entries += [(prefix, None) for prefix in listed.get("prefixes") or []]
    start, end = one("startOffset"), one("endOffset")
    entries = sorted(
        (e for e in entries if e[0] >= start and (not end or e[0] < end)), key=lambda e: e[0]
    )
    try:
        size = min(MAX_RESULTS, int(one("maxResults") or MAX_RESULTS))
    except ValueError:
        raise ApiError(400, "invalid", "Invalid argument for maxResults.") from None
    if size < 0:
        raise ApiError(400, "invalid", "Invalid argument for maxResults.")
    token = one("pageToken")
    if token:
        try:
            after = base64.urlsafe_b64decode(token.encode()).decode()
        except ValueError:
            raise ApiError(400, "invalid", "Invalid page token.") from None
        entries = [e for e in entries if e[0] > after]
    page = entries[: max(size, 1)]
    answer = {"kind": "storage#objects"}
    items = [obj for _key, obj in page if obj is not None]
    prefixes = [key for key, obj in page if obj is None]
    if prefixes:
        answer["prefixes"] = prefixes
    if items:
        answer["items"] = items
    if len(entries) > len(page):
        answer["nextPageToken"] = base64.urlsafe_b64encode(page[-1][0].encode()).decode()
    return Answer(200, answer)


def insert_object(storage, bucket, request, entry):
    query = request.query
    upload_type = query.get("uploadType", [""])[0]
    entry["upload"] = upload_type
    content_type = request.headers.get("content-type", "")
    if upload_type == "multipart":
        metadata = multipart_metadata(content_type, request.body)
    elif upload_type == "resumable":
        metadata = request.json() or {}
    elif upload_type == "media":
        metadata = {}
    else:
        raise ApiError(400, "invalid", f"Invalid upload type: '{upload_type}'.")
    entry["body"] = metadata or None
    name = query.get("name", [""])[0] or metadata.get("name")
    if not name:
        raise ApiError(400, "required", "Required")
    check_preconditions(query, storage.object_meta(bucket, name))
    headers = {k: v for k, v in request.headers.items() if k in FORWARDED}
    if upload_type == "resumable":
        headers["Content-Type"] = "application/json"
        if "x-upload-content-length" in request.headers:
            headers["X-Upload-Content-Length"] = request.headers["x-upload-content-length"]
    status, got, data = storage.backend_call(
        "POST", request.raw_path, request.body or None, headers
    )
    if upload_type == "resumable":
        if status != 200 or "location" not in got:
            error_from_backend(status, data, bucket)
        location = urlsplit(got["location"])
        return Answer(
            200,
            data=b"",
            headers={"Location": f"https://{API_HOST}{location.path}?{location.query}"},
        )
    if status != 200:
        error_from_backend(status, data, bucket)
    return Answer(200, fix_object(json.loads(data)))


def resumable_chunk(storage, request):
    """A PUT (or POST) to a resumable session: 308 with Range while incomplete, then the
    object."""
    headers = {k: v for k, v in request.headers.items() if k in FORWARDED}
    headers["Content-Type"] = "application/octet-stream"
    status, got, data = storage.backend_call("PUT", request.raw_path, request.body, headers)
    if status == 308:
        extra = {"Range": got["range"]} if "range" in got else {}
        return Answer(308, data=b"", headers=extra)
    if status != 200:
        if status == 404:
            raise ApiError(404, "notFound", "No such upload session.")
        error_from_backend(status, data)
    return Answer(200, fix_object(json.loads(data)))


def download(storage, bucket, name, obj, request):
    status, _got, data = storage.backend_call(
        "GET", f"/download/storage/v1/b/{quote(bucket)}/o/{quote(name, safe='')}?alt=media"
    )
    if status != 200:
        error_from_backend(status, data, bucket, name)
    headers = {
        "Content-Type": obj.get("contentType") or "application/octet-stream",
        "X-Goog-Hash": f"crc32c={obj['crc32c']},md5={obj['md5Hash']}",
        "X-Goog-Generation": obj["generation"],
        "X-Goog-Metageneration": obj["metageneration"],
        "X-Goog-Stored-Content-Length": str(len(data)),
        "X-Goog-Stored-Content-Encoding": obj.get("contentEncoding") or "identity",
        "Accept-Ranges": "bytes",
    }
    wanted = byte_range(request.headers.get("range"), len(data))
    if wanted is None:
        return Answer(200, data=data, headers=headers)
    start, end = wanted
    headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
    return Answer(206, data=data[start : end + 1], headers=headers)


# -- the servers ----------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 120
    server_version = "UploadServer"
    sys_version = ""

    def log_message(self, *args):
        pass

    def send(self, answer):
        self.send_response(answer.status)
        for name, value in answer.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer.data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(answer.data)

    def read_body(self):
        length = self.headers.get("Content-Length")
        if length:
            return self.rfile.read(int(length))
        if (self.headers.get("Transfer-Encoding") or "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline().strip():
                        pass
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return b""


class ApiHandler(Handler):
    """The JSON API (after TLS)."""

    def serve(self):
        storage = self.server.storage
        url = urlsplit(self.path)
        query = parse_qs(url.query, keep_blank_values=True)
        headers = {k.lower(): v for k, v in self.headers.items()}
        body = self.read_body()
        request = Request(self.command, url.path, query, headers, body)
        request.raw_path = self.path
        request.json = lambda: parse_json(body)
        entry = {
            "time": time.time(),
            "method": self.command,
            "host": (self.headers.get("Host") or API_HOST).split(":")[0],
            "path": url.path,
            "query": query,
            "body": None,
            "identity": None,
            "method_id": None,
        }
        try:
            answer = handle(storage, request, entry)
        except ApiError as error:
            answer = Answer(error.code, error.body())
        entry["status"] = answer.status
        entry["response"] = answer.payload
        storage.record(entry)
        self.send(answer)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = serve


def parse_json(body):
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        raise ApiError(400, "parseError", "Parse Error") from None


class ControlHandler(Handler):
    def control(self):
        storage = self.server.storage
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/")[2:]]
        if not url.path.startswith("/_fake/") or not parts:
            return self.send(Answer(404, {"error": f"no control route {url.path}"}))
        try:
            body = parse_json(self.read_body()) or {}
        except ApiError:
            return self.send(Answer(400, {"error": "the body is not JSON"}))
        route = (self.command, parts[0])
        if route in (("GET", "requests"), ("GET", "history")):
            with storage.lock:
                entries = list(storage.history if parts[0] == "history" else storage.log)
            return self.send(Answer(200, entries))
        if route == ("DELETE", "requests"):
            with storage.lock:
                storage.log.clear()
            return self.send(Answer(200, {}))
        if route == ("POST", "buckets") and body.get("name"):
            return self.send(Answer(200, storage.create_bucket(str(body["name"]))))
        if route == ("DELETE", "buckets") and len(parts) == 2:
            found = storage.delete_bucket(parts[1])
            return self.send(Answer(200 if found else 404, {"deleted": found}))
        if route == ("GET", "deny"):
            with storage.lock:
                return self.send(Answer(200, [list(d) for d in sorted(storage.deny)]))
        if route == ("POST", "deny") and body.get("permission"):
            denial = (body.get("identity") or "*", body["permission"], body.get("bucket") or "*")
            with storage.lock:
                storage.deny.add(denial)
            return self.send(Answer(200, {}))
        if route == ("DELETE", "deny"):
            with storage.lock:
                storage.deny.clear()
            return self.send(Answer(200, {}))
        return self.send(Answer(404, {"error": f"no control route {self.command} {url.path}"}))

    do_GET = do_POST = do_PUT = do_DELETE = control


class TlsServer(ThreadingHTTPServer):
    """The API on one address, TLS (the handshake in the request's thread)."""

    daemon_threads = True

    def __init__(self, address, storage, tls):
        self.storage, self.tls = storage, tls
        super().__init__(address, ApiHandler)

    def finish_request(self, request, client_address):
        try:
            request.settimeout(120)
            tls = self.tls.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        try:
            ApiHandler(tls, client_address, self)
        except OSError:
            pass  # the client went away
        finally:
            with contextlib.suppress(OSError):
                tls.close()


class ControlServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, storage):
        self.storage = storage
        super().__init__(("127.0.0.1", 0), ControlHandler)


def tls_context(ca_dir):
    """A server context with a certificate for storage.googleapis.com from the box's CA."""
    import trustme

    ca = trustme.CA.from_pem((ca_dir / "ca.pem").read_bytes(), (ca_dir / "ca-key.pem").read_bytes())
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(API_HOST).configure_cert(context)
    return context


class Front:
    """Every server of the service: the emulator, the loopback TLS port (the proxy's relay
    target), one TLS port 443 per --listen address, and the control port."""

    def __init__(self, state_dir, ca_dir, listen=(), metadata_key=None, project="hostnet-box"):
        self.state_dir = Path(state_dir)
        self.storage = Storage(self.state_dir / "data", ca_dir, metadata_key, project)
        tls = tls_context(Path(ca_dir))
        self.api = TlsServer(("127.0.0.1", 0), self.storage, tls)
        self.public = [TlsServer((address, 443), self.storage, tls) for address in listen]
        self.control = ControlServer(self.storage)
        self.servers = [self.storage.backend, self.api, *self.public, self.control]

    def start(self):
        for server in self.servers:
            threading.Thread(
                target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True
            ).start()
        return self

    def stop(self):
        for server in self.servers:
            server.shutdown()
            server.server_close()

    def client_info(self):
        return {
            "pid": os.getpid(),
            "api": f"127.0.0.1:{self.api.server_port}",
            "control": f"http://127.0.0.1:{self.control.server_port}/_fake",
            "listen": [f"{s.server_address[0]}:{s.server_port}" for s in self.public],
        }


# -- the daemon ----------------------------------------------------------------------------


def serve(args):
    args.state.mkdir(parents=True, exist_ok=True)
    front = Front(args.state, args.ca_dir, args.listen, args.metadata_key, args.project).start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    tmp = args.state / "client.json.tmp"
    tmp.write_text(json.dumps(front.client_info(), indent=2))
    tmp.replace(args.state / "client.json")
    try:
        done.wait()
    finally:
        front.stop()
        (args.state / "client.json").unlink(missing_ok=True)


def start(args, wait=20.0):
    args.state.mkdir(parents=True, exist_ok=True)
    client = args.state / "client.json"
    client.unlink(missing_ok=True)
    if os.fork() == 0:
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        log = os.open(args.state / "gcs.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, 1024)
        os.chdir("/")
        try:
            serve(args)
        finally:
            os._exit(0)
    os.wait()
    deadline = time.monotonic() + wait
    while not client.exists():
        if time.monotonic() > deadline:
            sys.exit(f"the Cloud Storage front did not start; see {args.state / 'gcs.log'}")
        time.sleep(0.05)
    print(client.read_text())


def is_front(pid):
    try:
        return Path(__file__).name in Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False


def stop(state_dir, wait=5.0):
    client = state_dir / "client.json"
    if not client.exists():
        return
    pid = json.loads(client.read_text())["pid"]
    if is_front(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait
        while is_front(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if is_front(pid):
            os.kill(pid, signal.SIGKILL)
    client.unlink(missing_ok=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["start", "stop", "serve"])
    parser.add_argument("--state", required=True, type=Path)
    parser.add_argument("--ca-dir", type=Path, help="the compute fake's state (CA, client.json)")
    parser.add_argument("--listen", action="append", default=[], help="also serve ADDRESS:443")
    parser.add_argument("--metadata-key", help="the VMs' metadata servers' token key (a file)")
    parser.add_argument("--project", default="hostnet-box")
    args = parser.parse_args()
    if args.action == "stop":
        stop(args.state)
    elif args.ca_dir is None:
        parser.error("--ca-dir is required")
    elif args.action == "start":
        start(args)
    else:
        serve(args)


if __name__ == "__main__":
    main()
