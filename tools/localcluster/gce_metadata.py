"""The GCE metadata server of a local-cluster VM (GCE's own is out of reach here).

Runs inside each VM (stdlib only; python3 is in the VM images) on 169.254.169.254:80, which
`metadata.google.internal` resolves to, as on GCE images. It follows the real server's contract
(cloud.google.com/compute/docs/metadata/querying-metadata and predefined-metadata-keys):

- GET only (other methods: 405); a request without `Metadata-Flavor: Google`, or with
  `X-Forwarded-For`, gets 403; an unknown key 404; every answer carries `Metadata-Flavor: Google`
  and an `ETag` (a hash of the answer);
- a directory with a trailing slash lists its keys, one a line, subdirectories ending in `/`;
  without the slash it redirects (301) to the slash;
- `?recursive=true` answers a directory as JSON with camelCase keys (`alt=text`: `path value`
  lines); `?alt=json|text` picks the format of any answer;
- `?wait_for_change=true` holds the request until the answer's ETag differs from `last_etag`
  (or from the current one when none is given), or for `timeout_sec` seconds, then answers;
- `instance/service-accounts/ACCOUNT/token` answers `{"access_token", "expires_in",
  "token_type": "Bearer"}`: a made-up token, accepted by nothing but what this cluster fakes.
  With a token key (`--token-key FILE`, read at each request; the cluster's, 0600) the token is
  `ya29.local-PAYLOAD.MAC`: PAYLOAD the account's email and expiry (base64url), MAC an HMAC-SHA256
  of them under the key, so that the box's Cloud Storage front (gcs_api.py), which holds the same
  key, can tell who calls (token_identity) without asking the VM. To a client it stays an opaque
  bearer token, as GCE's are. Without the key file the token is random.

Its data is one JSON document per VM (`/etc/hlf-gce/instance.json`): `{"instance": {...},
"project": {...}}` in the shape `?recursive=true` answers (camelCase keys; `attributes` and
`serviceAccounts` keep their keys as given). The server re-reads it when it changes and wakes the
waiters: `publish()` rewrites it from the host (as the Compute API would change a VM's metadata).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

ADDRESS = "169.254.169.254"
HOSTNAMES = ("metadata.google.internal", "metadata")
DOCUMENT = "/etc/hlf-gce/instance.json"
KEY_FILE = "/etc/hlf-gce/token.key"  # the HMAC key of the tokens (a path)
TOKEN_PREFIX = "ya29.local-"  # noqa: S105 (the made-up tokens' prefix)
ROOT = "/computeMetadata/v1/"
# Keys whose children are named by the user (custom metadata, service-account emails).
VERBATIM = {"attributes", "serviceAccounts"}
# Lists answered as JSON text (the others as one item a line).
JSON_TEXT = {"tags"}
TOKEN_LIFETIME_S = 3599
POLL_S = 0.1
MAX_WAIT_S = 3600


def kebab(key: str) -> str:
    """machineType -> machine-type (the path spelling of a camelCase key)."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"-\1", key).lower()


def etag_of(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()[:16]


class Document:
    """The VM's metadata document, re-read when the file changes; waiters are woken then."""

    def __init__(self, path: str):
        self.path = path
        self.data: dict | None = None
        self.error = "not read yet"
        self.changed = threading.Condition()
        self._seen: tuple | None = None
        self.reload()

    def reload(self) -> bool:
        """Read the file when its identity or contents changed; True when the data changed."""
        try:
            stat = os.stat(self.path)
            seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if seen == self._seen:
                return False
            with open(self.path) as handle:
                data = json.load(handle)
            if not isinstance(data, dict):
                raise ValueError("the document is not a JSON object")
        except (OSError, ValueError) as exc:
            # Keep answering from the last good document (a half-written file is retried).
            self.error = f"{self.path}: {exc}"
            return False
        self._seen = seen
        with self.changed:
            old, self.data, self.error = self.data, data, ""
            self.changed.notify_all()
        return data != old

    def watch(self, stop: threading.Event) -> None:
        while not stop.wait(POLL_S):
            self.reload()


def lookup(data: dict, parts: list[str]):
    """The document's node at a path (kebab-case parts); (node, camelCase key) or KeyError."""
    node, key, verbatim = data, "", False
    for part in parts:
        if isinstance(node, list) and is_directory(node):
            if not part.isdigit() or int(part) >= len(node):
                raise KeyError(part)
            node, verbatim = node[int(part)], False
        elif isinstance(node, dict):
            names = {k if verbatim else kebab(k): k for k in node}
            if part not in names:
                raise KeyError(part)
            key = names[part]
            node, verbatim = node[key], key in VERBATIM
        else:
            raise KeyError(part)
    return node, key


def is_directory(node) -> bool:
    return isinstance(node, dict) or (
        isinstance(node, list) and any(isinstance(item, (dict, list)) for item in node)
    )


def listing(node, verbatim: bool) -> str:
    """A directory's keys, one a line, subdirectories with a trailing slash."""
    names = range(len(node)) if isinstance(node, list) else node
    lines = []
    for name in names:
        child = node[name]
        shown = str(name) if verbatim or isinstance(node, list) else kebab(name)
        lines.append(shown + ("/" if is_directory(child) else ""))
    return "".join(f"{line}\n" for line in lines)


def leaf_text(node, key: str) -> str:
    if isinstance(node, list):
        return json.dumps(node) if key in JSON_TEXT else "".join(f"{item}\n" for item in node)
    if isinstance(node, bool):
        return "TRUE" if node else "FALSE"
    return str(node)


def flat_text(node, prefix: str = "") -> str:
    """A directory as `path value` lines (recursive=true&alt=text)."""
    if not is_directory(node):
        return f"{prefix} {leaf_text(node, '').strip()}\n"
    items = enumerate(node) if isinstance(node, list) else node.items()
    out = ""
    for name, child in items:
        shown = kebab(name) if isinstance(name, str) else str(name)
        out += flat_text(child, f"{prefix}/{shown}" if prefix else shown)
    return out


class Answer:
    def __init__(self, status: int, body: str, content_type: str = "application/text", **headers):
        self.status, self.body = status, body.encode()
        self.headers = {"Content-Type": content_type, **headers}


def answer_for(
    data: dict | None, path: str, query: dict[str, str], key: bytes | None = None
) -> Answer:
    """The answer to a GET of `path` (below ROOT, or ROOT itself) with its query; `key` signs
    the tokens."""
    if data is None:
        return Answer(503, "The metadata document is not available.\n")
    rest = path[len(ROOT) :]
    directory_wanted = rest == "" or rest.endswith("/")
    parts = [part for part in rest.split("/") if part]
    if len(parts) >= 4 and parts[:2] == ["instance", "service-accounts"] and parts[3] == "token":
        return token_answer(data, parts[2], query, key)
    try:
        node, key = lookup(data, parts)
    except KeyError:
        return Answer(404, "Not Found\n")
    recursive = query.get("recursive", "false").lower() == "true"
    alt = query.get("alt", "json" if recursive and is_directory(node) else "text")
    if alt not in ("json", "text"):
        return Answer(400, f"Invalid alt {alt!r}: use json or text.\n")
    if is_directory(node):
        if not directory_wanted:
            return Answer(
                301, "", Location=f"{path}/" + (f"?{query_string(query)}" if query else "")
            )
        if recursive:
            if alt == "json":
                return Answer(200, json.dumps(node, sort_keys=True), "application/json")
            return Answer(200, flat_text(node))
        names = listing(node, key in VERBATIM).split()
        if parts[:2] == ["instance", "service-accounts"] and len(parts) == 3:
            names = sorted([*names, "token"])
        if alt == "json":
            return Answer(200, json.dumps(names), "application/json")
        return Answer(200, "".join(f"{name}\n" for name in names))
    if directory_wanted and parts:
        return Answer(404, "Not Found\n")
    if alt == "json":
        return Answer(200, json.dumps(node), "application/json")
    return Answer(200, leaf_text(node, key))


def query_string(query: dict[str, str]) -> str:
    return "&".join(f"{k}={v}" for k, v in query.items())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def make_token(email: str, key: bytes, lifetime_s: float = TOKEN_LIFETIME_S) -> str:
    """An access token for `email` that whoever holds `key` can check (token_identity)."""
    payload = _b64(f"{email} {int(time.time() + lifetime_s)}".encode())
    mac = hmac.new(key, f"{TOKEN_PREFIX}{payload}".encode(), hashlib.sha256).digest()
    return f"{TOKEN_PREFIX}{payload}.{_b64(mac)}"


def token_identity(token: str, key: bytes) -> str | None:
    """The email a token of make_token was issued to, or None (not ours, altered, expired)."""
    body, _dot, mac = token.rpartition(".")
    if not body.startswith(TOKEN_PREFIX) or not mac:
        return None
    wanted = _b64(hmac.new(key, body.encode(), hashlib.sha256).digest())
    if not hmac.compare_digest(wanted, mac):
        return None
    try:
        payload = body[len(TOKEN_PREFIX) :]
        email, expiry = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).split()
        return email.decode() if float(expiry) > time.time() else None
    except ValueError:
        return None


def read_key(path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def token_answer(
    data: dict, account: str, query: dict[str, str], key: bytes | None = None
) -> Answer:
    accounts = data.get("instance", {}).get("serviceAccounts", {})
    if account not in accounts:
        return Answer(404, "Not Found\n")
    email = accounts[account].get("email", account)
    token = {
        "access_token": (
            make_token(email, key) if key else f"{TOKEN_PREFIX}{secrets.token_urlsafe(24)}"
        ),
        "expires_in": TOKEN_LIFETIME_S,
        "token_type": "Bearer",
    }
    if query.get("alt") == "text":
        return Answer(200, "".join(f"{k} {v}\n" for k, v in token.items()))
    return Answer(200, json.dumps(token), "application/json")


def make_handler(document: Document, request_log: str | None = None, token_key: str | None = None):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            self._log()
            if self.headers.get("X-Forwarded-For"):
                return self._send(Answer(403, "Request had X-Forwarded-For header.\n"))
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._send(Answer(403, "Missing Metadata-Flavor:Google header.\n"))
            split = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(split.query).items()}
            path = split.path
            if path + "/" == ROOT:
                path = ROOT
            if not path.startswith(ROOT):
                if path in ("/", "/computeMetadata/"):
                    listed = "computeMetadata/\n" if path == "/" else "v1/\n"
                    return self._send(Answer(200, listed))
                return self._send(Answer(404, "Not Found\n"))
            if query.get("wait_for_change", "false").lower() == "true":
                return self._send(self._wait(path, query))
            return self._send(answer_for(document.data, path, query, read_key(token_key)))

        def _wait(self, path: str, query: dict[str, str]) -> Answer:
            try:
                timeout = float(query.get("timeout_sec", MAX_WAIT_S))
            except ValueError:
                return Answer(400, "timeout_sec must be a number of seconds.\n")
            deadline = time.monotonic() + max(0.0, min(timeout, MAX_WAIT_S))
            key = read_key(token_key)
            first = answer_for(document.data, path, query, key)
            last = query.get("last_etag") or etag_of(first.body)
            with document.changed:
                while True:
                    current = answer_for(document.data, path, query, key)
                    left = deadline - time.monotonic()
                    if current.status != 200 or etag_of(current.body) != last or left <= 0:
                        return current
                    document.changed.wait(left)

        def _refuse(self):
            self._log()
            self.close_connection = True  # its body, if any, is not read
            self._send(Answer(405, "Method not allowed: the metadata server answers GET only.\n"))

        do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _refuse

        def _send(self, answer: Answer) -> None:
            self.send_response(answer.status)
            self.send_header("Metadata-Flavor", "Google")
            self.send_header("ETag", etag_of(answer.body))
            for name, value in answer.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(answer.body)

        def _log(self) -> None:
            if request_log:
                flavor = self.headers.get("Metadata-Flavor")
                with open(request_log, "a") as handle:
                    handle.write(f"{self.command} {self.path} {flavor}\n")

        def version_string(self):
            return "Metadata Server for VM"  # the real server's Server header

        def log_message(self, *args):
            pass

    return Handler


def serve(
    document_path: str,
    host: str,
    port: int,
    request_log: str | None = None,
    token_key: str | None = None,
):
    """A running server (call .shutdown()), its document watched in a thread."""
    document = Document(document_path)
    server = ThreadingHTTPServer((host, port), make_handler(document, request_log, token_key))
    server.daemon_threads = True
    stop = threading.Event()
    threading.Thread(target=document.watch, args=(stop,), daemon=True).start()
    threading.Thread(target=server.serve_forever, args=(POLL_S,), daemon=True).start()
    original_shutdown = server.shutdown

    def shutdown():
        stop.set()
        original_shutdown()
        server.server_close()

    server.shutdown = shutdown
    return server


# ---------------------------------------------------------------- the host's side


def vm_document(
    *,
    project: str,
    zone: str,
    name: str,
    instance_id: int,
    machine_type: str,
    ip: str,
    mac: str,
    prefix: int,
    gateway: str,
    mtu: int,
    external_ip: str,
    tags: list[str] | None = None,
    attributes: dict[str, str] | None = None,
    more_nics: list[dict] | None = None,
    scheduling: dict | None = None,
    service_accounts: list[dict] | None = None,
    preempted: bool = False,
) -> dict:
    """The metadata of one VM as GCE gives it (nic0 = the VPC NIC). `more_nics`: a GPU machine
    type's NICs after nic0, in GCP's order, each {ip, mac, mtu, network (its name), prefix,
    gateway}; as on GCE only nic0 has an access config. `scheduling`: the instance's
    (compute#scheduling: provisioningModel, preemptible, automaticRestart, onHostMaintenance,
    instanceTerminationAction; a standard VM's when None); `service_accounts`: the instance's
    [{email, scopes}] (the project's default compute account when None; [] none); `preempted`:
    instance/preempted TRUE, as GCE sets it when it preempts a spot VM."""
    numeric_project = numeric_id(project, digits=12)

    def subnetmask(prefix: int) -> str:
        mask = (0xFFFFFFFF << (32 - prefix)) & 0xFFFFFFFF
        return ".".join(str((mask >> s) & 255) for s in (24, 16, 8, 0))

    account = f"{numeric_project}-compute@developer.gserviceaccount.com"
    scopes = ["https://www.googleapis.com/auth/cloud-platform"]
    if service_accounts is None:
        service_accounts = [{"email": account, "scopes": scopes}]
    accounts = {}
    for index, given in enumerate(service_accounts):
        email = given.get("email") or account
        if email == "default":
            email = account
        entry = {
            "aliases": ["default"] if index == 0 else [],
            "email": email,
            "scopes": list(given.get("scopes") or scopes),
        }
        if index == 0:
            accounts["default"] = entry
        accounts[email] = dict(entry)
    return {
        "instance": {
            "attributes": dict(attributes or {}),
            "hostname": f"{name}.{zone}.c.{project}.internal",
            "id": instance_id,
            "machineType": f"projects/{numeric_project}/machineTypes/{machine_type}",
            "maintenanceEvent": "NONE",
            "name": name,
            "networkInterfaces": [
                {
                    "accessConfigs": [{"externalIp": external_ip, "type": "ONE_TO_ONE_NAT"}],
                    "gateway": gateway,
                    "ip": ip,
                    "mac": mac,
                    "mtu": mtu,
                    "network": f"projects/{numeric_project}/networks/default",
                    "subnetmask": subnetmask(prefix),
                },
                *(
                    {
                        "gateway": nic["gateway"],
                        "ip": nic["ip"],
                        "mac": nic["mac"],
                        "mtu": nic["mtu"],
                        "network": f"projects/{numeric_project}/networks/{nic['network']}",
                        "subnetmask": subnetmask(nic["prefix"]),
                    }
                    for nic in more_nics or []
                ),
            ],
            "preempted": "TRUE" if preempted else "FALSE",
            "scheduling": scheduling_document(scheduling),
            "serviceAccounts": accounts,
            "tags": list(tags or []),
            "zone": f"projects/{numeric_project}/zones/{zone}",
        },
        "project": {
            "attributes": {},
            "numericProjectId": numeric_project,
            "projectId": project,
        },
    }


def scheduling_document(scheduling: dict | None) -> dict:
    """instance/scheduling/ as GCE's metadata server gives it (TRUE/FALSE strings) from an
    instance's compute#scheduling: automatic-restart, on-host-maintenance, preemptible, and for
    a spot VM provisioning-model and instance-termination-action."""
    scheduling = scheduling or {}
    spot = scheduling.get("provisioningModel") == "SPOT"
    preemptible = bool(scheduling.get("preemptible")) or spot
    restart = scheduling.get("automaticRestart", not preemptible)
    document = {
        "automaticRestart": "TRUE" if restart else "FALSE",
        "onHostMaintenance": scheduling.get(
            "onHostMaintenance", "TERMINATE" if preemptible else "MIGRATE"
        ),
        "preemptible": "TRUE" if preemptible else "FALSE",
    }
    if spot:
        document["provisioningModel"] = "SPOT"
        document["instanceTerminationAction"] = scheduling.get("instanceTerminationAction", "STOP")
    return document


def numeric_id(text: str, digits: int) -> int:
    """A stable number of `digits` digits (no leading zero) derived from `text`."""
    value = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    return 10 ** (digits - 1) + value % (9 * 10 ** (digits - 1))


def publish(container_name: str, document: dict) -> None:
    """Write a VM's metadata document into the VM (atomically); its server serves it within
    POLL_S and wakes the requests waiting for a change."""
    script = (
        f"install -d -m 0755 {os.path.dirname(DOCUMENT)} && cat > {DOCUMENT}.new && "
        f"chmod 0644 {DOCUMENT}.new && mv {DOCUMENT}.new {DOCUMENT}"
    )
    result = subprocess.run(
        ["docker", "exec", "-i", "-u", "root", container_name, "sh", "-ec", script],
        input=json.dumps(document, indent=2, sort_keys=True) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"publishing the metadata of {container_name} failed ({result.returncode}): "
            f"{result.stderr.strip()}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--document", default=DOCUMENT)
    parser.add_argument("--address", default=ADDRESS)
    parser.add_argument("--port", type=int, default=80)
    parser.add_argument("--request-log", help="append each request's method, path and flavor")
    parser.add_argument("--token-key", help="sign the access tokens with this file's key")
    args = parser.parse_args(argv)
    server = serve(args.document, args.address, args.port, args.request_log, args.token_key)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.shutdown()


if __name__ == "__main__":
    main()
