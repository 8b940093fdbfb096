# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pulling an image through the Docker Engine API with progress, on the node: the logic behind the
module hostnet.llamafactory.image_pull - image references, registry credentials (the docker CLI's
config and credential helpers), and the pull's event stream folded into one progress summary.

Pure functions except credential_helper (runs docker-credential-* through the module) and
pull (talks to the daemon through _docker_api). How the controller words progress and errors is in
plugins/plugin_utils/_pull_report.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json

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


def credential_helper(run, name, server, timeout=30):
    """Run docker-credential-NAME get (the credential helper protocol: server on stdin, JSON
    out) under coreutils' timeout, through `run` (AnsibleModule.run_command, which has no
    deadline of its own). None when the helper has nothing for the server, is not installed or
    does not answer within `timeout` seconds."""
    argv = ["timeout", str(int(timeout)), "docker-credential-" + name, "get"]
    rc, out, _err = run(argv, data=server, binary_data=True)
    if rc != 0:
        return None
    try:
        return json.loads(out)
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


def pull(docker, name, auth, read_timeout):
    """Yield the events of a pull of `name` through `docker` (a _docker_api.DockerAPI), with
    `auth` (credentials from config_auth or the module's arguments, or None) as X-Registry-Auth.
    `read_timeout` bounds each wait for the next event."""
    _registry, repository, tag = split_reference(name)
    return docker.pull_image(
        repository, tag, registry_auth=auth_header(auth) if auth else None, timeout=read_timeout
    )
