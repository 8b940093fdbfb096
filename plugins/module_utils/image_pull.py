# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pulling an image through the Docker Engine API with progress: the logic behind
hostnet.llamafactory.image_pull, pure functions except DockerSocket and credential_helper."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json
import socket
import subprocess

try:
    from http.client import HTTPConnection
    from urllib.parse import quote, urlencode
except ImportError:  # pragma: no cover (Python 2 is not supported by the collection)
    HTTPConnection = object

DOCKER_HUB = "docker.io"
DOCKER_HUB_AUTH_KEY = "https://index.docker.io/v1/"


def split_reference(name):
    """'reg:5000/team/img:tag' -> ('reg:5000', 'reg:5000/team/img', 'tag').

    Docker's rule: the first path component is a registry when it holds a '.' or a ':' or is
    'localhost'. A digest ('img@sha256:...') takes the place of the tag; no tag means 'latest'
    (the Engine API pulls every tag of a repository when none is given).
    """
    repository, digest = name, None
    if "@" in name:
        repository, digest = name.split("@", 1)
    tag = None
    last = repository.rsplit("/", 1)[-1]
    if ":" in last:
        repository, tag = repository.rsplit(":", 1)
    first = repository.split("/", 1)[0]
    if "/" in repository and ("." in first or ":" in first or first == "localhost"):
        registry = first
    else:
        registry = DOCKER_HUB
    return registry, repository, digest or tag or "latest"


def _config_keys(registry):
    if registry == DOCKER_HUB:
        return [DOCKER_HUB_AUTH_KEY, "index.docker.io", "docker.io", "https://index.docker.io/v1"]
    return [registry, "https://" + registry, "http://" + registry, "https://" + registry + "/"]


def config_auth(config, registry, helper=None):
    """Credentials for `registry` from a Docker client config (~/.docker/config.json), looked up
    the way the docker CLI does: credHelpers[registry], then auths[registry], then credsStore.
    `helper(name, server)` runs docker-credential-NAME and returns {'Username', 'Secret'} or None.
    Returns (auth dict for X-Registry-Auth or None, where it came from)."""
    config = config or {}
    keys = _config_keys(registry)
    helpers = config.get("credHelpers") or {}
    for key in keys:
        if key in helpers and helper:
            found = helper(helpers[key], key)
            if found:
                return _helper_auth(
                    found, registry
                ), "credHelpers (docker-credential-%s)" % helpers[key]
            raise ValueError(
                "docker-credential-%s (credHelpers of the node's docker config) gave no "
                "credentials for %s" % (helpers[key], registry)
            )
    auths = config.get("auths") or {}
    for key in keys:
        entry = auths.get(key)
        if not entry:
            continue
        if entry.get("identitytoken"):
            return {"identitytoken": entry["identitytoken"], "serveraddress": registry}, "auths"
        if entry.get("auth"):
            decoded = base64.b64decode(entry["auth"]).decode("utf-8")
            username, _sep, password = decoded.partition(":")
            return (
                {"username": username, "password": password, "serveraddress": registry},
                "auths",
            )
    if config.get("credsStore") and helper:
        found = helper(config["credsStore"], keys[0])
        if found:
            return _helper_auth(found, registry), "credsStore (docker-credential-%s)" % config[
                "credsStore"
            ]
    return None, "anonymous"


def _helper_auth(found, registry):
    # A helper answers '<token>' as Username for identity tokens.
    if found.get("Username") == "<token>":
        return {"identitytoken": found.get("Secret", ""), "serveraddress": registry}
    return {
        "username": found.get("Username", ""),
        "password": found.get("Secret", ""),
        "serveraddress": registry,
    }


def credential_helper(name, server, timeout=30):
    """Run docker-credential-NAME get (the credential helper protocol: server on stdin, JSON
    out). None when the helper has nothing for the server or is not installed."""
    try:
        done = subprocess.run(
            ["docker-credential-" + name, "get"],
            input=server.encode("utf-8"),
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    try:
        return json.loads(done.stdout.decode("utf-8"))
    except ValueError:
        return None


def auth_header(auth):
    """The X-Registry-Auth header value (base64url of the JSON credentials)."""
    raw = json.dumps(auth or {}).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii")


class PullProgress(object):
    """Folds the Engine API's pull stream into one summary: bytes downloaded and extracted of the
    bytes known, layers done of the layers seen. Sizes are compressed (what travels over the
    network); the daemon reports extraction in the same unit."""

    DONE = ("Pull complete", "Already exists")

    def __init__(self):
        self.layers = {}  # id -> {"current", "extracted", "total", "done"}
        self.status = ""
        self.digest = ""
        self.error = ""

    def feed(self, event):
        if event.get("error") or event.get("errorDetail"):
            self.error = event.get("error") or (event.get("errorDetail") or {}).get("message", "")
            return
        status = event.get("status") or ""
        layer = event.get("id")
        if status.startswith("Digest: "):
            self.digest = status[len("Digest: ") :]
            return
        if status.startswith("Status: "):
            self.status = status[len("Status: ") :]
            return
        if not layer or status.startswith("Pulling from "):
            return
        state = self.layers.setdefault(
            layer, {"current": 0, "extracted": 0, "total": 0, "done": False}
        )
        detail = event.get("progressDetail") or {}
        if status == "Downloading":
            state["current"] = int(detail.get("current") or 0)
            state["total"] = int(detail.get("total") or state["total"])
        elif status in ("Download complete", "Verifying Checksum"):
            state["total"] = max(state["total"], state["current"])
            state["current"] = state["total"]
        elif status == "Extracting":
            state["total"] = max(state["total"], int(detail.get("total") or 0))
            state["current"] = state["total"]
            state["extracted"] = int(detail.get("current") or 0)
        elif status in self.DONE:
            state["done"] = True
            state["current"] = state["extracted"] = state["total"]

    def snapshot(self):
        layers = list(self.layers.values())
        return {
            "downloaded": sum(layer["current"] for layer in layers),
            "extracted": sum(layer["extracted"] for layer in layers),
            "total": sum(layer["total"] for layer in layers),
            "layers": len(layers),
            "layers_done": sum(1 for layer in layers if layer["done"]),
            "status": self.status,
            "digest": self.digest,
            "error": self.error,
        }


def human_bytes(count):
    value = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return ("%.0f %s" if unit in ("B", "kB") else "%.1f %s") % (value, unit)
        value /= 1000.0
    return "%.1f GB" % value  # pragma: no cover


def describe(snapshot, elapsed=None, rate=None):
    """'812.3 MB of 2.1 GB (38%), 3 of 9 layers, 41.2 MB/s, 20 s', then, once everything is
    downloaded, '2.1 GB, extracted 45%, 7 of 9 layers, 80 s'."""
    parts = []
    total = snapshot.get("total") or 0
    got = snapshot.get("downloaded") or 0
    layers, done = snapshot.get("layers") or 0, snapshot.get("layers_done") or 0
    if total and got < total:
        parts.append("%s of %s (%d%%)" % (human_bytes(got), human_bytes(total), 100 * got // total))
    elif total and done < layers:
        extracted = snapshot.get("extracted") or 0
        parts.append("%s, extracted %d%%" % (human_bytes(total), 100 * extracted // total))
    elif total:
        parts.append(human_bytes(total))
    elif layers:
        parts.append("starting")
    else:
        parts.append("contacting the registry")
    if layers:
        parts.append("%d of %d layers" % (done, layers))
    if rate and got < total:
        parts.append("%s/s" % human_bytes(rate))
    if elapsed is not None:
        parts.append("%.0f s" % elapsed)
    return ", ".join(parts)


# (substring of the daemon's error, cause, fix); {image} and {registry} are filled in.
PULL_ERRORS = (
    (
        ("unauthorized", "authentication required", "no basic auth credentials", "denied"),
        "the registry {registry} refused the credentials (or gave none) for {image}",
        "set launch_registry_username and launch_registry_password (vault the password); for "
        "Artifact Registry use oauth2accesstoken and a token from `gcloud auth "
        "print-access-token`, or _json_key and a service account key, or run `gcloud auth "
        "configure-docker REGION-docker.pkg.dev` on the nodes",
    ),
    (
        ("manifest unknown", "not found", "does not exist", "repository name not known"),
        "{image} does not exist in {registry}",
        "check llamafactory_image (repository and tag), and that the image was pushed there",
    ),
    (
        ("x509", "certificate"),
        "the node does not trust {registry}'s TLS certificate",
        "put the registry's CA in /etc/docker/certs.d/{registry}/ca.crt on every node, or list "
        "the registry in docker_engine_daemon_extra.insecure-registries",
    ),
    (
        ("server gave http response to https client",),
        "{registry} speaks plain HTTP",
        "list it in docker_engine_daemon_extra.insecure-registries (docker_engine role), or serve "
        "it over TLS",
    ),
    (
        ("no such host", "name resolution", "lookup "),
        "the node cannot resolve {registry}",
        "check the registry name in llamafactory_image and the node's DNS",
    ),
    (
        (
            "i/o timeout",
            "connection refused",
            "no route to host",
            "network is unreachable",
            "tls handshake timeout",
            "context deadline exceeded",
        ),
        "the node cannot reach {registry}",
        "check the node's route and firewall to the registry (on GCP: Cloud NAT or Private Google "
        "Access for VMs without external IPs)",
    ),
    (
        ("no space left on device",),
        "the node's disk is full",
        "free space under Docker's data root (/var/lib/docker) or use larger disks",
    ),
)


def explain(error, image):
    """(cause, fix) for a pull error, or (None, None) when the table does not know it."""
    registry = split_reference(image)[0]
    lowered = (error or "").lower()
    for needles, cause, fix in PULL_ERRORS:
        if any(needle in lowered for needle in needles):
            return cause.format(image=image, registry=registry), fix.format(
                image=image, registry=registry
            )
    return None, None


class UnixHTTPConnection(HTTPConnection):
    def __init__(self, path, timeout):
        HTTPConnection.__init__(self, "localhost", timeout=timeout)
        self.socket_path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


class DockerSocket(object):
    """The few Engine API calls a pull needs, over the daemon's unix socket (stdlib only)."""

    def __init__(self, path="/var/run/docker.sock", timeout=60):
        self.path = path
        self.timeout = timeout

    def _connection(self, timeout=None):
        return UnixHTTPConnection(self.path, self.timeout if timeout is None else timeout)

    def image_id(self, name):
        """The local image's ID, or None when the daemon does not have it."""
        connection = self._connection()
        try:
            connection.request("GET", "/images/%s/json" % quote(name, safe="/:@"))
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        if response.status == 404:
            return None
        if response.status != 200:
            raise IOError("docker: GET image %s: %s %s" % (name, response.status, body[:300]))
        return json.loads(body.decode("utf-8"))["Id"]

    def pull(self, name, auth, read_timeout):
        """Yield the pull's JSON events. `read_timeout` bounds each wait for the next event."""
        _registry, repository, tag = split_reference(name)
        query = urlencode({"fromImage": repository, "tag": tag})
        headers = {"X-Registry-Auth": auth_header(auth)} if auth else {}
        connection = self._connection(read_timeout)
        try:
            connection.request("POST", "/images/create?" + query, headers=headers)
            response = connection.getresponse()
            if response.status != 200:
                body = response.read().decode("utf-8", "replace")
                try:
                    message = json.loads(body).get("message", body)
                except ValueError:
                    message = body
                yield {"error": message.strip()}
                return
            buffered = b""
            while True:
                chunk = response.read1(65536) if hasattr(response, "read1") else response.read(1)
                if not chunk:
                    break
                buffered += chunk
                while b"\n" in buffered:
                    line, buffered = buffered.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line.decode("utf-8"))
            if buffered.strip():
                yield json.loads(buffered.decode("utf-8"))
        finally:
            connection.close()
