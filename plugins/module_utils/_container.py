# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A container's create body for the Docker Engine API (POST /containers/create), from options
named as community.docker.docker_container names them; used by job_container (a rank) and
preflight_probe (the preflight's probe)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import shlex

# The options every body takes (those of a module that creates containers).
OPTIONS = dict(
    image=dict(type="str"),
    command=dict(type="list", elements="str"),
    network_mode=dict(type="str", default="host"),
    volumes=dict(type="list", elements="str", default=[]),
    published_ports=dict(type="list", elements="str", default=[]),
    device_requests=dict(type="list", elements="dict", default=[]),
    labels=dict(type="dict", default={}),
)


class ContainerSpecError(Exception):
    """An option the Engine API cannot take (a malformed ulimit or device)."""


def env_file_lines(text, environ=None):
    """KEY=VALUE strings from an env file, read as `docker run --env-file` reads it (docker/cli
    opts/file.go): a leading BOM dropped, blank lines and lines starting with # skipped, the
    value kept as written (no quotes removed), and a KEY without = taken from the environment
    when it is set there (dropped when not)."""
    environ = os.environ if environ is None else environ
    if text.startswith("\ufeff"):
        text = text[1:]
    found = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.lstrip()
        if not line or line.startswith("#"):
            continue
        key, equals, value = line.partition("=")
        if not key or any(c.isspace() for c in key):
            raise ContainerSpecError(
                "env file line %d: variable %r has white space or is empty" % (number, key)
            )
        if equals:
            found.append("%s=%s" % (key, value))
        elif key in environ:
            found.append("%s=%s" % (key, environ[key]))
    return found


def ulimit(text):
    """NAME:SOFT[:HARD] (docker run --ulimit NAME=SOFT[:HARD]) as the API's Ulimit."""
    parts = str(text).split(":")
    numbers = parts[1:]
    if not parts[0] or not 1 <= len(numbers) <= 2 or not all(_integer(n) for n in numbers):
        raise ContainerSpecError("ulimit %r: write NAME:SOFT:HARD, e.g. memlock:-1:-1" % (text,))
    soft = int(numbers[0])
    return {"Name": parts[0], "Soft": soft, "Hard": int(numbers[-1])}


def _integer(text):
    return text.lstrip("-").isdigit()


def device(text):
    """HOST[:CONTAINER][:PERMISSIONS] (docker run --device) as the API's DeviceMapping."""
    parts = str(text).split(":")
    permissions = "rwm"
    if (
        len(parts) > 1
        and parts[-1]
        and set(parts[-1]) <= set("rwm")
        and not parts[-1].startswith("/")
    ):
        permissions = parts.pop()
    if not parts[0] or len(parts) > 2:
        raise ContainerSpecError("device %r: write HOST[:CONTAINER][:PERMISSIONS]" % (text,))
    return {
        "PathOnHost": parts[0],
        "PathInContainer": parts[1] if len(parts) > 1 and parts[1] else parts[0],
        "CgroupPermissions": permissions,
    }


def create_body(params, env=None):
    """The create body for `params` (OPTIONS, and job_container's working_dir, ipc_mode,
    ulimits and devices when present); `env`: KEY=VALUE strings."""
    ports = {}
    for published in params["published_ports"] or []:
        host, _colon, inside = str(published).rpartition(":")
        ports["%s/tcp" % (inside or host)] = [{"HostPort": host or inside}]
    requests = [
        {
            "Driver": request.get("driver", ""),
            "Count": request.get("count", 0),
            "DeviceIDs": request.get("device_ids"),
            "Capabilities": request.get("capabilities") or [],
            "Options": request.get("options") or {},
        }
        for request in params["device_requests"] or []
    ]
    host_config = {
        "NetworkMode": params["network_mode"],
        "Binds": list(params["volumes"] or []),
        "PortBindings": ports,
        "DeviceRequests": requests,
        "RestartPolicy": {"Name": "no"},
    }
    if params.get("auto_remove"):
        host_config["AutoRemove"] = True
    if params.get("ipc_mode"):
        host_config["IpcMode"] = params["ipc_mode"]
    if params.get("ulimits"):
        host_config["Ulimits"] = [ulimit(text) for text in params["ulimits"]]
    if params.get("devices"):
        host_config["Devices"] = [device(text) for text in params["devices"]]
    body = {
        "Image": params["image"],
        "Cmd": [str(part) for part in params["command"]],
        "Labels": dict((k, str(v)) for k, v in (params["labels"] or {}).items()),
        "ExposedPorts": dict((port, {}) for port in ports),
        "HostConfig": host_config,
    }
    if params.get("working_dir"):
        body["WorkingDir"] = params["working_dir"]
    if env:
        body["Env"] = list(env)
    return body


def _gpus(request):
    """One device request as `docker run --gpus` writes it: the IDs, else the count (-1: all)."""
    if request.get("device_ids"):
        return "device=" + ",".join(str(one) for one in request["device_ids"])
    count = request.get("count", 0)
    return "all" if count == -1 else str(count)


def docker_run_script(name, params):
    """A POSIX sh script that starts, by hand, the container create_body(params) describes
    (the same options as `docker run` flags; the env file read by the docker CLI as the module
    reads it), replacing any container called `name`."""
    quote = shlex.quote
    labels = params["labels"] or {}
    flags = ["--name " + quote(name), "--network " + quote(params["network_mode"])]
    if params.get("ipc_mode"):
        flags.append("--ipc " + quote(params["ipc_mode"]))
    flags.append("--restart no")
    if params.get("env_file"):
        flags.append("--env-file " + quote(params["env_file"]))
    if params.get("working_dir"):
        flags.append("--workdir " + quote(params["working_dir"]))
    flags += ["-v " + quote(volume) for volume in params["volumes"] or []]
    flags += ["-p " + quote(str(port)) for port in params["published_ports"] or []]
    for text in params.get("ulimits") or []:
        limit = ulimit(text)
        flags.append("--ulimit %s=%d:%d" % (quote(limit["Name"]), limit["Soft"], limit["Hard"]))
    flags += ["--device " + quote(text) for text in params.get("devices") or []]
    flags += ["--gpus " + quote(_gpus(request)) for request in params["device_requests"] or []]
    flags += ["--label " + quote("%s=%s" % (key, labels[key])) for key in sorted(labels)]
    run = [quote(params["image"])] + [quote(str(part)) for part in params["command"]]
    lines = [
        "#!/bin/sh",
        "# Written by hostnet.llamafactory's job_container as it started this container (job %s,"
        % labels.get("hostnet.llamafactory.job", "-"),
        "# rank %s): run it to start the same container by hand."
        % labels.get("hostnet.llamafactory.rank", "-"),
        "set -eu",
        "docker rm -f %s >/dev/null 2>&1 || true" % quote(name),
        "exec docker run -d \\",
    ]
    lines += ["    %s \\" % flag for flag in flags]
    lines.append("    " + " ".join(run))
    return "\n".join(lines) + "\n"


def replace(docker, name, body):
    """Remove any container called `name` (killed if it runs), create one from `body` and start
    it: its ID. Raises DockerError."""
    docker.remove_container(name)
    found = docker.create_container(name, body)
    docker.start_container(name)
    return found
