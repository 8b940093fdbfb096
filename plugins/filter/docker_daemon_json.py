# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: docker_daemon_json
short_description: Merge settings into an existing Docker daemon.json, checking what is set
version_added: 0.1.0
description:
  - Parses the current C(/etc/docker/daemon.json) text (empty when the file is absent), checks the
    types and values of the keys being set, and returns the merged settings - nested mappings
    merged key by key, everything the settings do not name kept as it was.
  - Fails, naming the key and the fix, on a file that is not a JSON object or a bad value.
options:
  _input:
    description: The current file's text ('' when absent).
    type: str
    required: true
  settings:
    description: The settings to merge in; a key whose value is null is left out (not set).
    type: dict
    required: true
  over:
    description:
      - More settings merged over O(settings), in order, key by key (the docker_engine role's
        C(docker_engine_daemon_extra), then C(docker_engine_daemon_settings)); checked the same way.
    type: list
    elements: dict
    default: []
  strict:
    description:
      - With V(false), a file or a value that would fail gives null instead, for a comparison
        that must not fail (the docker_engine role asks whether a host is settled, then merges
        again with V(true), where the error is reported).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Merge the runtime in
  ansible.builtin.set_fact:
    merged: "{{ current_text | hostnet.llamafactory.docker_daemon_json({'bip': '172.31.0.1/16'}) }}"

- name: The role's own settings (null - not set), then the user's over them
  ansible.builtin.set_fact:
    merged: >-
      {{ current_text | hostnet.llamafactory.docker_daemon_json(
           {'bip': none, 'log-driver': 'json-file'}, over=[{'log-opts': {'max-size': '10m'}}]) }}
"""

RETURN = r"""
_value:
  description: The merged daemon.json content.
  type: dict
"""

import ipaddress
import json
import re

from ansible.errors import AnsibleFilterError

SIZE = re.compile(r"^[0-9]+[kmg]?$")
CGROUP_DRIVERS = ("cgroupfs", "systemd")


def _cidr(value, with_host):
    try:
        network = ipaddress.ip_interface("%s" % value)
    except ValueError:
        return False
    return (
        "/" in value
        and network.version == 4
        and (with_host or network.ip == network.network.network_address)
    )


def _check_key(key, value):
    """An error message for a bad value of a key this collection sets, else None."""
    if key == "bip" and not (isinstance(value, str) and _cidr(value, True)):
        return "must be the bridge's IPv4 address with a prefix, e.g. 172.31.0.1/16"
    if key == "default-address-pools":
        if not isinstance(value, list) or not value:
            return "must be a non-empty list of {base: CIDR, size: prefix length}"
        for pool in value:
            if not (
                isinstance(pool, dict)
                and _cidr(pool.get("base", ""), False)
                and isinstance(pool.get("size"), int)
                and 8 <= pool["size"] <= 30
            ):
                return (
                    "each pool needs base (an IPv4 network, e.g. 172.30.0.0/16) and size "
                    "(an integer prefix length 8..30), got %r" % (pool,)
                )
    if key == "exec-opts":
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            return "must be a list of strings"
        for opt in value:
            if (
                opt.startswith("native.cgroupdriver=")
                and opt.split("=", 1)[1] not in CGROUP_DRIVERS
            ):
                return "native.cgroupdriver must be one of %s" % ", ".join(CGROUP_DRIVERS)
    if key == "log-driver" and not isinstance(value, str):
        return "must be a string"
    if key == "log-opts":
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            return "must be a mapping of strings (Docker rejects numbers here)"
        if "max-size" in value and not SIZE.match(value["max-size"]):
            return "max-size must look like 100m"
        if "max-file" in value and not value["max-file"].isdigit():
            return 'max-file must be a number given as a string, e.g. "3"'
    if key == "data-root" and not (isinstance(value, str) and value.startswith("/")):
        return "must be an absolute path"
    if key == "runtimes":
        if not isinstance(value, dict):
            return "must be a mapping of runtime name to {path, args}"
        for name, runtime in value.items():
            if not (
                isinstance(runtime, dict)
                and isinstance(runtime.get("path"), str)
                and isinstance(runtime.get("args", []), list)
            ):
                return "runtime %r needs path (a string) and args (a list)" % name
    if key == "default-runtime" and not isinstance(value, str):
        return "must be a runtime name"
    return None


def _merge(base, extra):
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def docker_daemon_json(current_text, settings, over=(), strict=True):
    try:
        return _merged(current_text, settings, over)
    except AnsibleFilterError:
        if strict:
            raise
        return None


def _merged(current_text, settings, over):
    settings = dict((k, v) for k, v in (settings or {}).items() if v is not None)
    for layer in over or ():
        settings = _merge(settings, layer or {})
    text = (current_text or "").strip()
    try:
        current = json.loads(text) if text else {}
    except ValueError as exc:
        raise AnsibleFilterError(
            "/etc/docker/daemon.json is not valid JSON (%s): fix or remove it; nothing was "
            "changed" % exc
        ) from exc
    if not isinstance(current, dict):
        raise AnsibleFilterError(
            "/etc/docker/daemon.json must hold a JSON object; nothing was changed"
        )
    errors = []
    for key, value in (settings or {}).items():
        problem = _check_key(key, value)
        if problem:
            errors.append("%r: %r %s" % (key, value, problem))
    merged = _merge(current, settings or {})
    runtime = merged.get("default-runtime")
    if (
        runtime
        and runtime not in ("runc", "io.containerd.runc.v2")
        and runtime not in (merged.get("runtimes") or {})
    ):
        errors.append("'default-runtime': %r names no runtime in 'runtimes'" % runtime)
    if errors:
        raise AnsibleFilterError(
            "bad Docker daemon settings (docker_engine_* variables or docker_engine_daemon_"
            "settings); nothing was changed: %s" % "; ".join(errors)
        )
    return merged


class FilterModule(object):
    def filters(self):
        return {"docker_daemon_json": docker_daemon_json}
