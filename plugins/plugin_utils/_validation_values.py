# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One value of one variable, checked (controller only, private; part of _validation.py).

check_value() converts a value to its variable's type as Ansible's argument spec would, and
applies the variable's choices, bounds and syntax check. The syntax checks (the `check=` of
_validation.RULES) each take (label, value) and return problems that name `label` and the fix:
every value that reaches a node (a file, a command line, a container or folder name) is checked
here, before any node is contacted.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ipaddress
import re

from ansible_collections.hostnet.llamafactory.plugins.module_utils import _gcs_outputs
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._address_kind import (
    address_kind,
)

JOB_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,47}$")
# [REGISTRY[:PORT]/]REPOSITORY[:TAG][@sha256:DIGEST], Docker's grammar (lower-case names).
IMAGE_RE = re.compile(
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$"
)
# Node paths: Docker volume specs split on ':' and ',', the launch script is shell.
NODE_PATH_RE = re.compile(r"^/[A-Za-z0-9._@+/-]*$")
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Linux's dev_valid_name (1-15 bytes, no '/', ':' or whitespace, not '.' or '..'), narrowed to
# the characters real NIC names use, since the name goes into env files and commands.
INTERFACE_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,15}$")
CONTAINER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
HF_TOKEN_RE = re.compile(r"^[A-Za-z0-9_.-]*$")
GCE_NAME_RE = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
GCP_PROJECT_RE = re.compile(r"^(?:[a-z][-a-z0-9.]*[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]$")
URL_RE = re.compile(r"^https?://[^\s\"'`$\\;|&<>]+$")
ULIMIT_RE = re.compile(r"^([a-z]+):(-?[0-9]+):(-?[0-9]+)$")
ULIMIT_NAMES = tuple(
    [
        "core",
        "cpu",
        "data",
        "fsize",
        "locks",
        "memlock",
        "msgqueue",
        "nice",
        "nofile",
        "nproc",
        "rss",
        "rtprio",
        "rttime",
        "sigpending",
        "stack",
    ]
)
# The launch sets these per node; llamafactory_env must not.
RESERVED_ENV = tuple(
    [
        "FORCE_TORCHRUN",
        "NNODES",
        "NODE_RANK",
        "RANK",
        "NPROC_PER_NODE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "WORLD_SIZE",
        "LOCAL_RANK",
    ]
)
SECRET_ENV_RE = re.compile(r"(?i)token|password|secret|key")

TRUE_WORDS = ("true", "yes", "on", "1", "y", "t")
FALSE_WORDS = ("false", "no", "off", "0", "n", "f")


# -- syntax checks: each returns problems naming `label` and the fix ----------------------


def one_line(label, value, what="the value"):
    if CONTROL_RE.search(value):
        return [
            "%s contains a line break or control character: %s must be one line (a line break "
            "would start a new entry in the file it is written to)" % (label, what)
        ]
    return []


def node_path(label, value):
    if not value.startswith("/"):
        return [
            "%s is %r: use an absolute path on the nodes (starting with /), for example "
            "/var/lib/llamafactory/jobs" % (label, value)
        ]
    if ".." in value.split("/"):
        return [
            "%s is %r: a '..' component leaves the folder it names; write the path without it"
            % (label, value)
        ]
    if not NODE_PATH_RE.match(value):
        return [
            "%s is %r: a path on the nodes may hold only letters, digits and . _ - @ + / "
            "(no spaces, line breaks, ':' or ',', which break Docker volume specs, and no shell "
            "characters such as ; $ ` or quotes); rename the folder" % (label, value)
        ]
    if value.strip("/") == "":
        return ["%s is %r: the root folder cannot be used; name a folder" % (label, value)]
    return []


def controller_path(label, value):
    return one_line(label, value, "a path on the controller")


def job_name(label, value):
    if value and not JOB_RE.match(value):
        return [
            "%s %r is not usable as a container and folder name: use 1-48 lower-case letters, "
            "digits and dashes, starting with a letter or digit." % (label, value)
        ]
    return []


def image(label, value):
    if not IMAGE_RE.match(value):
        return [
            "%s %r is not an image reference: use [REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST] in "
            "lower case, for example hiyouga/llamafactory:0.9.5 or "
            "us-docker.pkg.dev/PROJECT/REPO/llamafactory:0.9.5." % (label, value)
        ]
    return []


def interface(label, value):
    if value in (".", "..") or not INTERFACE_RE.match(value):
        return [
            "%s is %r: not a network interface name. Use the NIC's name as `ip link` shows it "
            "(1-15 letters, digits and . _ - @; no '/', ':', whitespace or shell characters), "
            "for example ens4" % (label, value)
        ]
    return []


def master_addr(label, value):
    kind = address_kind(value) if value == value.strip() else "invalid"
    if kind == "private" or kind == "public":
        return []  # public: judged with llamafactory_allow_public_master_addr (the platform step)
    what = {
        "bridge": "a Docker bridge address (172.17-31.x: no other VM can reach it)",
        "loopback": "a loopback address",
        "invalid": "not an IP address",
    }.get(kind, "not a private address")
    return [
        "%s %s is %s. Remove it to let discover_network use rank 0's internal address, or set "
        "it to that address." % (label, value, what)
    ]


def env(label, value):
    problems = []
    for key in sorted(value, key=str):
        item = value[key]
        if not isinstance(key, str) or not IDENTIFIER_RE.match(key):
            problems.append(
                "%s has the key %r: environment names are letters, digits and underscores, not "
                "starting with a digit (no spaces, '=', line breaks or shell characters); rename it"
                % (label, key)
            )
            continue
        if isinstance(item, (dict, list, tuple)) or item is None:
            problems.append(
                "%s sets %s to %r: give a string or a number (the value goes into an env file)"
                % (label, key, item)
            )
        elif CONTROL_RE.search(str(item)):
            problems.append(
                "%s sets %s to a value with a line break or control character: the env file would "
                "get a second line, which could set another variable. Give one line." % (label, key)
            )
    keys = [k for k in value if isinstance(k, str)]
    secret = sorted(k for k in keys if SECRET_ENV_RE.search(k))
    if secret:
        problems.append(
            "%s sets %s: environment values show up in `docker inspect` and process listings. "
            "Give the Hugging Face token as llamafactory_hf_token (written to a 0600 file, read "
            "through HF_TOKEN_PATH) and registry credentials as llamafactory_registry_username/"
            "llamafactory_registry_password (vault them)." % (label, ", ".join(secret))
        )
    clash = [k for k in sorted(keys) if k in RESERVED_ENV]
    if clash:
        problems.append(
            "%s sets %s, which the launch sets per node from the inventory: remove them (ranks "
            "come from llamafactory_node_rank, the port from llamafactory_master_port, the NIC "
            "from discovery or llamafactory_interface, the process count from "
            "llamafactory_gpus_per_node)." % (label, ", ".join(clash))
        )
    return problems


def _scalar(item):
    return item is None or isinstance(item, (str, int, float, bool))


def overrides(label, value):
    problems = []
    for key in sorted(value, key=str):
        item = value[key]
        if not isinstance(key, str) or not IDENTIFIER_RE.match(key):
            problems.append(
                "%s has the key %r: LLaMA-Factory option names are letters, digits and "
                "underscores; fix the name" % (label, key)
            )
        elif not (_scalar(item) or (isinstance(item, list) and all(_scalar(i) for i in item))):
            problems.append(
                "%s sets %s to %r: give a string, a number, a boolean or a list of them"
                % (label, key, item)
            )
    return problems


def shared_mounts(label, value):
    problems = []
    for mount in value:
        found = node_path("%s entry" % label, mount)
        if found:
            problems.append(
                "%s must list absolute folders that every node has mounted (Filestore, "
                "gcsfuse...), for example [/mnt/shared]: %s" % (label, found[0])
            )
    return problems


def ulimits(label, value):
    problems = []
    for entry in value:
        match = ULIMIT_RE.match(entry)
        bad = not match or match.group(1) not in ULIMIT_NAMES
        if not bad:
            soft, hard = int(match.group(2)), int(match.group(3))
            bad = soft < -1 or hard < -1 or (hard != -1 and (soft == -1 or soft > hard))
        if bad:
            problems.append(
                "%s has %r: use NAME:SOFT:HARD with NAME one of %s and SOFT <= HARD whole "
                "numbers (-1 for unlimited), for example memlock:-1:-1"
                % (label, entry, ", ".join(ULIMIT_NAMES))
            )
    return problems


def registry_username(label, value):
    if ":" in value or re.search(r"\s", value) or CONTROL_RE.search(value):
        return [
            "%s is %r: a registry user name has no ':' (it separates user and password) and no "
            "whitespace or line break; for Artifact Registry use oauth2accesstoken or _json_key"
            % (label, value)
        ]
    return []


def hf_token(label, value):
    if not HF_TOKEN_RE.match(value):
        return [
            "%s is not a Hugging Face token: it is written to a one-line file on every node and "
            "may hold only letters, digits, '_', '.' and '-' (no spaces or line breaks); copy the "
            "token (hf_...) again" % label
        ]
    return []


def gcp_project(label, value):
    if value and not GCP_PROJECT_RE.match(value):
        return [
            "%s is %r, which is not a GCP project ID (6 to 30 lowercase letters, digits and "
            "hyphens, starting with a letter; the ID, not the project's name or number)"
            % (label, value)
        ]
    return []


def output_uri(label, value):
    """gs://BUCKET[/PREFIX] with a valid bucket name (the nodes write the job's outputs there)."""
    if not value:
        return []
    try:
        _gcs_outputs.parse_uri(value)
    except ValueError as exc:
        return ["%s: %s. Example: gs://my-bucket/llamafactory" % (label, exc)]
    return []


def gce_name(limit):
    def check(label, value):
        if value and (len(value) > limit or not GCE_NAME_RE.match(value)):
            return [
                "%s is %r: use lowercase letters, digits and hyphens, starting with a letter, at "
                "most %d characters (GCE's naming rule)" % (label, value, limit)
            ]
        return []

    return check


def gce_names(label, value):
    return [p for item in value for p in gce_name(63)("%s entry" % label, item)]


def cidrs(label, value):
    problems = []
    for item in value:
        try:
            ipaddress.ip_network(item.strip(), strict=False)
        except ValueError:
            problems.append(
                "%s contains %r, which is not an address range (CIDR such as 10.128.0.0/20)"
                % (label, item)
            )
    return problems


def container(label, value):
    if value and not CONTAINER_RE.match(value):
        return [
            "%s is %r: a container name is letters, digits and _ . - (starting with a letter or "
            "digit); give the name `docker ps` shows" % (label, value)
        ]
    return []


def url(label, value):
    if not URL_RE.match(value):
        return [
            "%s is %r: give an http:// or https:// URL without spaces, quotes or shell "
            "characters" % (label, value)
        ]
    return []


LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")  # Compute Engine's label keys


def label_key(label, value):
    if not LABEL_KEY_RE.match(value or ""):
        return [
            "%s is %r: a Compute Engine label key is 1-63 lower-case letters, digits, _ and -, "
            "starting with a letter" % (label, value)
        ]
    return []


# -- types --------------------------------------------------------------------------------


def _show(var, value):
    return "(hidden)" if var.secret else repr(value)


def _convert(kind, value):
    """value as `kind` (as Ansible's argument spec converts it), or raise ValueError."""
    if kind in ("str", "path"):
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError("a string")
        return str(value)
    if kind == "int":
        if isinstance(value, bool):
            raise ValueError("a whole number")
        if isinstance(value, int):
            return value
        if isinstance(value, str) and re.match(r"^\s*[+-]?[0-9]+\s*$", value):
            return int(value)
        raise ValueError("a whole number")
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError("a number")
        try:
            return float(value)
        except ValueError:
            raise ValueError("a number") from None
    if kind == "bool":
        if isinstance(value, bool):
            return value
        word = str(value).strip().lower() if isinstance(value, (str, int)) else None
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise ValueError("true or false")
    if kind == "list":
        if not isinstance(value, (list, tuple)):
            raise ValueError("a list")
        return list(value)
    if kind == "dict":
        if not isinstance(value, dict):
            raise ValueError("a mapping (NAME: value)")
        return dict(value)
    raise ValueError(kind)


def check_value(var, value, label=None):
    """(value converted to var's type, problems) for one value of one variable (a
    _validation.Var). Null passes where the variable is nullable or has no default."""
    label = label or var.name
    if value is None or (var.nullable and value == ""):
        if var.nullable or not var.has_default:
            return None, []
        return None, ["%s is empty (null): give a value or remove it to get the default" % label]
    try:
        value = _convert(var.kind, value)
    except ValueError as exc:
        return None, ["%s is %s: it must be %s" % (label, _show(var, value), exc)]
    if var.kind == "list" and var.elements:
        try:
            value = [_convert(var.elements, item) for item in value]
        except ValueError as exc:
            return None, ["%s is %s: every entry must be %s" % (label, _show(var, value), exc)]
    if var.choices is not None and value not in var.choices:
        return None, [
            "%s is %s: use one of %s"
            % (label, _show(var, value), ", ".join(repr(c) for c in var.choices))
        ]
    low, high = var.low, var.high
    if (low is not None and value < low) or (high is not None and value > high):
        span = "at least %s" % low if high is None else "from %s to %s" % (low, high)
        return None, ["%s is %s: it must be %s" % (label, _show(var, value), span)]
    if var.kind in ("str", "path") and not var.multiline:
        found = one_line(label, value)
        if found:
            return None, found
    if var.check is not None:
        found = var.check(label, value)
        if found:
            return None, found
    return value, []
