"""Google's published Cloud Storage JSON API v1 contract, to check the box's Cloud Storage front
(tools/localcluster/gcs_api.py) against.

The contract is the discovery document storage.v1.json that ships in google-api-python-client,
checked with compute_contract.py's machinery (methods, path and query parameters, request and
response schemas, Google's JSON error shape); what the document says about media on top:

- a method with `mediaUpload` (objects.insert) is also served on /upload/storage/v1/...: there
  uploadType must be one of its protocols' (media and multipart for `simple`, resumable), the
  JSON metadata (multipart's first part, a resumable session's body) fits the request schema and
  may be absent (a media upload has none);
- a resumable upload starts with 200 and no body (the session's URL in Location); the
  session's own requests (the upload path with upload_id, the protocol of
  https://cloud.google.com/storage/docs/performing-resumable-uploads, which the document does
  not describe) answer 308 without a body while incomplete, then the method's response;
- a method with `supportsMediaDownload` (objects.get) answers alt=media (and, where
  `useMediaDownloadService`, /download/storage/v1/...) with the object's bytes: 200 or 206, not
  JSON, or an error in Google's shape.

validate_log takes the front's log (GET /_fake/history) and returns the problems, each naming
the request and the method id; a request the contract does not allow must have been refused.
"""

from __future__ import annotations

import functools

from compute_contract import Contract, document_path

DOCUMENT = "discovery_cache/documents/storage.v1.json"
MEDIA_PREFIXES = {"/upload/storage/v1/": "upload", "/download/storage/v1/": "download"}
UPLOAD_TYPES = {"simple": ("media", "multipart"), "resumable": ("resumable",)}


class StorageContract(Contract):
    roots = ("https://storage.googleapis.com/", "https://www.googleapis.com/")


@functools.cache
def contract():
    return StorageContract.load(document_path(DOCUMENT))


def api_url(entry):
    """(the method's URL under storage/v1/, 'upload' | 'download' | None)."""
    path = entry["path"]
    for prefix, media in MEDIA_PREFIXES.items():
        if path.startswith(prefix):
            return f"https://storage.googleapis.com/storage/v1/{path[len(prefix) :]}", media
    return f"https://{entry.get('host') or 'storage.googleapis.com'}{path}", None


def validate_entry(api, entry):
    url, media = api_url(entry)
    status, query = entry["status"], dict(entry.get("query") or {})
    method, _params = api.match(entry["method"], url)
    if media == "upload" and "upload_id" in query:
        method, _params = api.match("POST", url)
        if method is None or method.id != "storage.objects.insert":
            return [f"{entry['method']} {url}: not a resumable session of objects.insert"]
        if entry["method"] not in ("PUT", "POST"):
            return [f"{method.id}: a resumable session takes PUT, not {entry['method']}"]
        if status == 308:
            return [] if entry.get("response") is None else [f"{method.id}: a 308 with a body"]
        return api.validate_response(method.id, status, entry.get("response"))
    method, _params = api.match(entry["method"], url)
    if method is None:
        if status < 400:
            return [f"{entry['method']} {url}: unknown method: {_params} (answered {status})"]
        return api.validate_error("unknown method", status, entry.get("response"))
    problems = []
    body = entry.get("body")
    if media == "upload":
        protocols = method.doc.get("mediaUpload", {}).get("protocols", {})
        allowed = [t for name in protocols for t in UPLOAD_TYPES.get(name, ())]
        if not allowed:
            problems.append(f"{method.id}: no media upload")
        if query.get("uploadType", [""])[0] not in allowed:
            problems.append(f"{method.id}: uploadType {query.get('uploadType')} not {allowed}")
        if body is None:
            body = {}  # media: the metadata is optional
    if media == "download" and not method.doc.get("useMediaDownloadService"):
        problems.append(f"{method.id}: not served on /download/")
    found = api.validate_request(entry["method"], url, query, body)
    if media == "upload":  # the document's body requirement is the metadata's, optional here
        found = [p for p in found if "body is required" not in p]
    if found and status < 400:
        problems += [f"{p} (yet the front answered {status})" for p in found]
    if media == "upload" and query.get("uploadType") == ["resumable"] and status < 400:
        # A session starts: 200, its URL in Location, no body.
        return problems + ([] if entry.get("response") is None else [f"{method.id}: a body"])
    is_media = media == "download" or query.get("alt", [""])[0] == "media"
    if is_media and status < 400:
        if not method.doc.get("supportsMediaDownload"):
            problems.append(f"{method.id}: answered media, which it does not support")
        if status not in (200, 206):
            problems.append(f"{method.id}: media answered {status}")
        return problems
    return problems + api.validate_response(method.id, status, entry.get("response"))


def validate_log(entries):
    """Problems with the exchanges the front recorded (gcs_api.py's log entries: method, host,
    path, query, body, status, response)."""
    api = contract()
    problems = []
    for number, entry in enumerate(entries):
        label = f"request {number} ({entry['method']} {entry['path']} -> {entry['status']})"
        problems += [f"{label}: {p}" for p in validate_entry(api, entry)]
    return problems
