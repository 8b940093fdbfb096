# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The job's validation and plan (controller only, private; used by the validate_job action).

validate() takes the job's settings as plain data and returns (plan, problems): every problem
at once, each naming its variable and the fix, or the job plan that every role then reads. It
runs before any node is contacted, so every value that reaches a node (a file, a command line,
a container or folder name) is checked for its syntax here.

SCHEMA lists every variable the playbooks hand to the nodes, with its type, range and syntax;
tests/unit/plugins/plugin_utils/test_validation.py holds it against the roles' argument specs.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import ipaddress
import os
import re

import yaml
from ansible_collections.hostnet.llamafactory.plugins.module_utils import (
    _network_profile as network_profile,
)
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._address_kind import (
    address_kind,
)
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._node_ranks import node_ranks
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._train_config import (
    PlanError,
)
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._train_config import (
    plan as train_plan,
)
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._unknown_vars import (
    PREFIXES,
    unknown_vars,
)

GROUP = "llamafactory"
PURPOSES = ("train", "admin", "doctor")
PLAN_FACT = "llamafactory_job_plan"

# A variable's name in an older release -> its name now. Setting an old name is refused, naming
# the new one.
RENAMED = {
    "launch_registry_username": "llamafactory_registry_username",
    "launch_registry_password": "llamafactory_registry_password",
    "launch_pull": "llamafactory_pull",
    "launch_pull_timeout": "llamafactory_pull_timeout",
    "launch_hf_token": "llamafactory_hf_token",
    "launch_nccl_ib_disable": "llamafactory_nccl_ib_disable",
    "launch_nccl_debug": "llamafactory_nccl_debug",
    "launch_ulimits": "llamafactory_ulimits",
    "launch_progress_every": "llamafactory_progress_every",
    "launch_stop_timeout": "llamafactory_stop_timeout",
    "launch_allow_bridge": "llamafactory_allow_bridge",
    "launch_allow_public_master_addr": "llamafactory_allow_public_master_addr",
    "launch_allow_uneven_gpus": "llamafactory_allow_uneven_gpus",
    "gcp_firewall_project": "llamafactory_gcp_project",
    "gcp_firewall_auth_kind": "llamafactory_gcp_auth_kind",
    "gcp_firewall_service_account_file": "llamafactory_gcp_service_account_file",
    "gcp_firewall_access_token": "llamafactory_gcp_access_token",
    "launch_preflight": "preflight_enabled",
    "launch_preflight_timeout": "preflight_timeout",
    "launch_preflight_port": "preflight_port",
    "launch_min_free_gb": "preflight_min_free_gb",
    "launch_smoke_test": "preflight_smoke_test",
    "launch_smoke_size_mb": "preflight_smoke_size_mb",
    "launch_doctor_container": "preflight_doctor_container",
    "launch_cleanup_outputs": "job_admin_cleanup_outputs",
}
REMOVED = {
    "gcp_firewall_group": (
        "gcp_firewall_group was removed: the job's nodes are always the inventory group "
        "'llamafactory'. Put the training VMs in that group and drop the variable."
    ),
}

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
# The training YAML: types of the options the collection or the nodes depend on.
CONFIG_PATH_KEYS = (
    "model_name_or_path",
    "adapter_name_or_path",
    "dataset_dir",
    "output_dir",
    "deepspeed",
    "tokenized_path",
    "cache_dir",
    "logging_dir",
)
CONFIG_STRING_KEYS = (
    "stage",
    "finetuning_type",
    "template",
    "dataset",
    "eval_dataset",
    "lora_target",
    "lr_scheduler_type",
    "ddp_backend",
    "optim",
)
CONFIG_NUMBER_KEYS = (
    "learning_rate",
    "num_train_epochs",
    "max_steps",
    "per_device_train_batch_size",
    "per_device_eval_batch_size",
    "gradient_accumulation_steps",
    "cutoff_len",
    "max_samples",
    "save_steps",
    "logging_steps",
    "eval_steps",
    "warmup_ratio",
    "warmup_steps",
    "lora_rank",
    "lora_alpha",
    "lora_dropout",
    "ddp_timeout",
    "preprocessing_num_workers",
    "weight_decay",
    "max_grad_norm",
    "seed",
    "save_total_limit",
    "val_size",
)
CONFIG_BOOL_KEYS = (
    "do_train",
    "do_eval",
    "do_predict",
    "plot_loss",
    "overwrite_cache",
    "overwrite_output_dir",
    "bf16",
    "fp16",
    "save_on_each_node",
    "trust_remote_code",
)
TRUE_WORDS = ("true", "yes", "on", "1", "y", "t")
FALSE_WORDS = ("false", "no", "off", "0", "n", "f")


class Var(object):
    """One variable: type (an argument spec type), range, choices and a syntax check.

    check(label, value) returns the problems of a value already of the right type. default is
    the role default (None: no default, or derived by validate()).
    """

    def __init__(
        self,
        name,
        kind,
        role,
        default=None,
        elements=None,
        choices=None,
        low=None,
        high=None,
        nullable=False,
        secret=False,
        check=None,
        per_host=False,
        multiline=False,
    ):
        self.name, self.kind, self.role, self.default = name, kind, role, default
        self.elements, self.choices, self.low, self.high = elements, choices, low, high
        self.nullable, self.secret, self.check, self.per_host = nullable, secret, check, per_host
        self.multiline = multiline


# -- value checks: each returns problems naming `label` and the fix -------------------------


def _one_line(label, value, what="the value"):
    if CONTROL_RE.search(value):
        return [
            "%s contains a line break or control character: %s must be one line (a line break "
            "would start a new entry in the file it is written to)" % (label, what)
        ]
    return []


def _node_path(label, value):
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


def _controller_path(label, value):
    return _one_line(label, value, "a path on the controller")


def _job(label, value):
    if value and not JOB_RE.match(value):
        return [
            "%s %r is not usable as a container and folder name: use 1-48 lower-case letters, "
            "digits and dashes, starting with a letter or digit." % (label, value)
        ]
    return []


def _image(label, value):
    if not IMAGE_RE.match(value):
        return [
            "%s %r is not an image reference: use [REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST] in "
            "lower case, for example hiyouga/llamafactory:0.9.5 or "
            "us-docker.pkg.dev/PROJECT/REPO/llamafactory:0.9.5." % (label, value)
        ]
    return []


def _interface(label, value):
    if value in (".", "..") or not INTERFACE_RE.match(value):
        return [
            "%s is %r: not a network interface name. Use the NIC's name as `ip link` shows it "
            "(1-15 letters, digits and . _ - @; no '/', ':', whitespace or shell characters), "
            "for example ens4" % (label, value)
        ]
    return []


def _master_addr(label, value):
    kind = address_kind(value) if value == value.strip() else "invalid"
    if kind == "private" or kind == "public":
        return []  # public: judged with llamafactory_allow_public_master_addr in validate()
    what = {
        "bridge": "a Docker bridge address (172.17-31.x: no other VM can reach it)",
        "loopback": "a loopback address",
        "invalid": "not an IP address",
    }.get(kind, "not a private address")
    return [
        "%s %s is %s. Remove it to let discover_network use rank 0's internal address, or set "
        "it to that address." % (label, value, what)
    ]


def _env(label, value):
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


def _overrides(label, value):
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


def _shared_mounts(label, value):
    problems = []
    for mount in value:
        found = _node_path("%s entry" % label, mount)
        if found:
            problems.append(
                "%s must list absolute folders that every node has mounted (Filestore, "
                "gcsfuse...), for example [/mnt/shared]: %s" % (label, found[0])
            )
    return problems


def _ulimits(label, value):
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


def _registry_username(label, value):
    if ":" in value or re.search(r"\s", value) or CONTROL_RE.search(value):
        return [
            "%s is %r: a registry user name has no ':' (it separates user and password) and no "
            "whitespace or line break; for Artifact Registry use oauth2accesstoken or _json_key"
            % (label, value)
        ]
    return []


def _hf_token(label, value):
    if not HF_TOKEN_RE.match(value):
        return [
            "%s is not a Hugging Face token: it is written to a one-line file on every node and "
            "may hold only letters, digits, '_', '.' and '-' (no spaces or line breaks); copy the "
            "token (hf_...) again" % label
        ]
    return []


def _gcp_project(label, value):
    if value and not GCP_PROJECT_RE.match(value):
        return [
            "%s is %r, which is not a GCP project ID (6 to 30 lowercase letters, digits and "
            "hyphens, starting with a letter; the ID, not the project's name or number)"
            % (label, value)
        ]
    return []


def _gce_name(limit):
    def check(label, value):
        if value and (len(value) > limit or not GCE_NAME_RE.match(value)):
            return [
                "%s is %r: use lowercase letters, digits and hyphens, starting with a letter, at "
                "most %d characters (GCE's naming rule)" % (label, value, limit)
            ]
        return []

    return check


def _gce_names(label, value):
    return [p for item in value for p in _gce_name(63)("%s entry" % label, item)]


def _cidrs(label, value):
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


def _container(label, value):
    if value and not CONTAINER_RE.match(value):
        return [
            "%s is %r: a container name is letters, digits and _ . - (starting with a letter or "
            "digit); give the name `docker ps` shows" % (label, value)
        ]
    return []


def _url(label, value):
    if not URL_RE.match(value):
        return [
            "%s is %r: give an http:// or https:// URL without spaces, quotes or shell "
            "characters" % (label, value)
        ]
    return []


LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")  # Compute Engine's label keys


def _label_key(label, value):
    if not LABEL_KEY_RE.match(value or ""):
        return [
            "%s is %r: a Compute Engine label key is 1-63 lower-case letters, digits, _ and -, "
            "starting with a letter" % (label, value)
        ]
    return []


# -- the schema ---------------------------------------------------------------------------

SCHEMA = {}


def _add(name, kind, role, **options):
    SCHEMA[name] = Var(name, kind, role, **options)


_LF = "llamafactory"
_add("llamafactory_purpose", "str", _LF, default="train", choices=PURPOSES)
_add("llamafactory_config", "path", _LF, nullable=True, check=_controller_path)
_add("llamafactory_job", "str", _LF, nullable=True, check=_job)
_add("llamafactory_master_port", "int", _LF, nullable=True, low=1024, high=65535)
_add("llamafactory_image", "str", _LF, default="hiyouga/llamafactory:0.9.5", check=_image)
_add("llamafactory_gpus_per_node", "int", _LF, default=1, low=0)
_add("llamafactory_network_mode", "str", _LF, default="host")
_add("llamafactory_platform", "str", _LF, default="gcp")
# The hosts are the local cluster's VM containers (tools/localcluster): its four differences from
# GCP follow from it (roles/llamafactory/README.md).
_add("llamafactory_local_cluster", "bool", _LF, default=False)
_add("llamafactory_jobs_root", "path", _LF, default="/var/lib/llamafactory/jobs", check=_node_path)
_add(
    "llamafactory_hf_cache", "path", _LF, default="/var/lib/llamafactory/hf-cache", check=_node_path
)
_add("llamafactory_shared_mounts", "list", _LF, default=[], elements="str", check=_shared_mounts)
_add("llamafactory_env", "dict", _LF, default={}, check=_env)
_add("llamafactory_train_overrides", "dict", _LF, default={}, check=_overrides)
_add("llamafactory_registry_username", "str", _LF, default="", check=_registry_username)
# Only in the pull request (a _json_key password is a multi-line JSON key).
_add("llamafactory_registry_password", "str", _LF, default="", secret=True, multiline=True)
_add("llamafactory_hf_token", "str", _LF, default="", secret=True, check=_hf_token)
_add(
    "llamafactory_pull",
    "str",
    _LF,
    default="not_present",
    choices=("always", "not_present", "never"),
)
_add("llamafactory_pull_timeout", "int", _LF, default=3600, low=1)
_add("llamafactory_progress_every", "int", _LF, default=30, low=1)
_add("llamafactory_stop_timeout", "int", _LF, default=10, low=0)
_add("llamafactory_collective_timeout_max", "int", _LF, default=3600, low=60)
_add("llamafactory_rendezvous_timeout", "int", _LF, default=600, low=30)
_add("llamafactory_nccl_ib_disable", "bool", _LF, default=True)
_add("llamafactory_network_profile", "str", _LF, default="auto", choices=network_profile.CHOICES)
_add(
    "llamafactory_nccl_debug",
    "str",
    _LF,
    default="",
    choices=("", "VERSION", "WARN", "INFO", "TRACE"),
)
_add(
    "llamafactory_ulimits",
    "list",
    _LF,
    default=["memlock:-1:-1", "stack:67108864:67108864"],
    elements="str",
    check=_ulimits,
)
_add("llamafactory_allow_bridge", "bool", _LF, default=False)
_add("llamafactory_allow_public_master_addr", "bool", _LF, default=False)
_add("llamafactory_allow_uneven_gpus", "bool", _LF, default=False)
_add("llamafactory_gcp_project", "str", _LF, default="", check=_gcp_project)
_add(
    "llamafactory_gcp_auth_kind",
    "str",
    _LF,
    default="application",
    choices=("application", "serviceaccount", "accesstoken", "machineaccount"),
)
_add("llamafactory_gcp_service_account_file", "path", _LF, default="", check=_controller_path)
_add("llamafactory_gcp_access_token", "str", _LF, default="", secret=True)
_add("llamafactory_node_rank", "int", _LF, nullable=True, low=0, per_host=True)
_add("llamafactory_interface", "str", _LF, check=_interface, per_host=True)
_add("llamafactory_master_interface", "str", _LF, check=_interface, per_host=True)
_add("llamafactory_master_addr", "str", _LF, check=_master_addr, per_host=True)

_add("preflight_enabled", "bool", "preflight", default=True)
_add("preflight_timeout", "int", "preflight", default=60, low=1)
_add("preflight_port", "int", "preflight", nullable=True, low=1024, high=65535)
_add("preflight_min_free_gb", "float", "preflight", default=10, low=0)
_add("preflight_smoke_test", "bool", "preflight", default=True)
_add("preflight_smoke_size_mb", "float", "preflight", default=64, low=0.001)
_add("preflight_gpu_health", "bool", "preflight", default=True)
_add("preflight_doctor_container", "str", "preflight", default="", check=_container)

_add("launch_restart_on_change", "bool", "launch", default=False)
_add("launch_wait", "bool", "launch", default=True)
_add("launch_wait_timeout", "int", "launch", default=86400, low=1)
_add("launch_stall_timeout", "int", "launch", default=1800, low=0)
_add("launch_poll_interval", "int", "launch", default=10, low=1)
_add("launch_max_restarts", "int", "launch", default=2, low=0, high=100)
_add("launch_peer_timeout", "int", "launch", default=120, low=0)
_add("launch_agent_port", "int", "launch", nullable=True, low=1024, high=65535)
_add("launch_results_dir", "path", "launch", check=_controller_path)
_add("launch_fetch_model_max_mb", "float", "launch", default=2048, low=0)

_add("job_admin_cleanup_outputs", "bool", "job_admin", default=False)

_GI = "gcp_instances"
_add("gcp_instances_when_done", "str", _GI, default="keep", choices=("keep", "stop", "delete"))
_add("gcp_instances_when_failed", "str", _GI, default="keep", choices=("keep", "stop", "delete"))
_add("gcp_instances_label", "str", _GI, default="llamafactory-job", check=_label_key)
_add("gcp_instances_timeout", "int", _GI, default=600, low=1)
_add("gcp_instances_restart_stopped", "bool", _GI, default=False)
_add("gcp_instances_capacity_retries", "int", _GI, default=5, low=0)

_GF = "gcp_firewall"
_add("gcp_firewall_state", "str", _GF, default="present", choices=("present", "absent"))
_add(
    "gcp_firewall_cluster_name",
    "str",
    _GF,
    default="llamafactory",
    check=_gce_name(63 - len("-nodes")),
)
_add("gcp_firewall_network", "str", _GF, default="default", check=_gce_name(63))
_add("gcp_firewall_priority", "int", _GF, default=1000, low=0, high=65535)
_add("gcp_firewall_source", "str", _GF, default="addresses", choices=("addresses", "tag", "ranges"))
_add("gcp_firewall_tag", "str", _GF, default="", check=_gce_name(63))
_add("gcp_firewall_ranges", "list", _GF, default=[], elements="str", check=_cidrs)
_add("gcp_firewall_target_tags", "list", _GF, default=[], elements="str", check=_gce_names)
_add("gcp_firewall_ssh_source_ranges", "list", _GF, default=[], elements="str", check=_cidrs)
_add("gcp_firewall_operation_timeout", "int", _GF, default=300, low=1)
_add("gcp_firewall_python", "str", _GF, check=_controller_path)

_DN = "discover_network"
_add(
    "discover_network_gcp_metadata", "str", _DN, default="auto", choices=("auto", "always", "never")
)
_add(
    "discover_network_metadata_url",
    "str",
    _DN,
    default="http://metadata.google.internal/computeMetadata/v1",
    check=_url,
)
_add("discover_network_metadata_timeout", "float", _DN, default=2.0, low=0.001)
_add("discover_network_include_tunnels", "bool", _DN, default=False)

# Must be the same on every node (the rest may differ per host).
SAME_ON_EVERY_NODE = (
    "llamafactory_config",
    "llamafactory_job",
    "llamafactory_master_port",
    "llamafactory_image",
    "llamafactory_network_mode",
    "llamafactory_network_profile",
    "llamafactory_platform",
    "llamafactory_local_cluster",
    "llamafactory_jobs_root",
    "preflight_port",
    "launch_agent_port",
)


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
    """(value converted to var's type, problems) for one value of one variable."""
    label = label or var.name
    if value is None or (var.nullable and value == ""):
        if var.nullable or var.default is None:
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
        found = _one_line(label, value)
        if found:
            return None, found
    if var.check is not None:
        found = var.check(label, value)
        if found:
            return None, found
    return value, []


# -- the training config ------------------------------------------------------------------


def read_yaml(path):
    with open(path) as handle:
        return yaml.safe_load(handle)


def _number(value):
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    try:
        float(str(value))
        return True
    except ValueError:
        return False


def config_problems(config, overrides, config_path, gpus):
    """Problems of the training YAML merged with llamafactory_train_overrides."""
    if not isinstance(config, dict):
        return [
            "llamafactory_config %s is not a LLaMA-Factory config: it must be a YAML mapping of "
            "options (model_name_or_path, stage, dataset, output_dir, ...)" % config_path
        ]
    merged = dict(config)
    merged.update(overrides)
    problems = []

    def where(key):
        if key in overrides:
            return "llamafactory_train_overrides.%s" % key
        return "%s in llamafactory_config (%s)" % (key, config_path)

    for key in ("model_name_or_path", "stage"):
        if key not in merged:
            problems.append(
                "llamafactory_config %s has no '%s': set it in the file or in "
                "llamafactory_train_overrides" % (config_path, key)
            )
    for key in CONFIG_PATH_KEYS:
        value = merged.get(key)
        if value is None or (key == "deepspeed" and isinstance(value, dict)):
            continue
        if not isinstance(value, str):
            problems.append("%s is %r: it must be a path (a string)" % (where(key), value))
        elif CONTROL_RE.search(value):
            problems.append(
                "%s contains a line break or control character: give the path on one line"
                % where(key)
            )
    for key in CONFIG_STRING_KEYS:
        value = merged.get(key)
        if value is not None and (not isinstance(value, str) or CONTROL_RE.search(value)):
            problems.append("%s is %r: it must be a string on one line" % (where(key), value))
    for key in CONFIG_NUMBER_KEYS:
        value = merged.get(key)
        if value is not None and not _number(value):
            problems.append("%s is %r: it must be a number" % (where(key), value))
    for key in CONFIG_BOOL_KEYS:
        value = merged.get(key)
        words = ("true", "false")
        if value is not None and not isinstance(value, bool) and str(value).lower() not in words:
            problems.append("%s is %r: it must be true or false" % (where(key), value))
    if gpus == 0 and merged.get("ddp_backend") != "gloo":
        problems.append(
            "llamafactory_gpus_per_node is 0 (CPU nodes) but the training config sets no "
            "`ddp_backend: gloo` (NCCL needs GPUs): add it to %s or to "
            "llamafactory_train_overrides." % config_path
        )
    return problems


# -- the job ------------------------------------------------------------------------------


def derive_job(config_path):
    """The job name llamafactory_config's file name gives (as the old default expression)."""
    name = os.path.splitext(os.path.basename(config_path))[0].lower()
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-")


def derive_master_port(job):
    return 29500 + int(hashlib.sha1(job.encode("utf-8")).hexdigest()[:6], 16) % 500  # noqa: S324


def derive_preflight_port(master_port):
    return master_port + 20000 if master_port < 45000 else master_port - 20000


def derive_agent_port(master_port):
    return master_port + 10000 if master_port < 55000 else master_port - 10000


def _names_problems(play_names, per_host, known, ignore):
    """Renamed, removed and unknown variables, each with where it was set."""
    where = {}
    for name in play_names:
        where.setdefault(name, []).append("play vars")
    for host in sorted(per_host):
        for name in per_host[host]:
            where.setdefault(name, []).append(host)

    def at(name):
        places = where[name]
        shown = places if len(places) <= 3 else [*places[:3], "%d more" % (len(places) - 3)]
        return "set in: %s" % ", ".join(shown)

    problems = []
    for name in sorted(where):
        if name in RENAMED:
            problems.append(
                "%s was renamed %s (%s): set %s instead"
                % (name, RENAMED[name], at(name), RENAMED[name])
            )
        elif name in REMOVED:
            problems.append("%s (%s)" % (REMOVED[name], at(name)))
    accepted = set(known) | set(SCHEMA) | {PLAN_FACT}
    typos = unknown_vars(
        [n for n in where if n not in RENAMED and n not in REMOVED], accepted, ignore=ignore
    )
    for name, close in sorted(typos.items()):
        problems.append(
            "unknown variable %s%s (%s): no role reads it; fix the name (the roles' READMEs list "
            "every variable)" % (name, " (did you mean %s?)" % close if close else "", at(name))
        )
    return problems


def validate(
    settings,
    per_host,
    play_hosts,
    group_hosts,
    purpose="train",
    forks=None,
    known=(),
    read_config=read_yaml,
    play_names=(),
    ignore=(),
    instances=None,
):
    """(plan, problems) of one job, computed once on the controller.

    settings: the play-level value of each variable (role defaults included), already templated.
    per_host: host -> {name: value} of the variables set for that host (inventory, extra vars),
    not facts or registered results. play_hosts: ansible_play_hosts_all. group_hosts:
    groups['llamafactory']. purpose: train, admin or doctor. forks: ansible_forks. known: every
    variable the roles' argument specs name. read_config: path -> parsed YAML. play_names:
    variables set at play level (play vars, vars files; not role defaults) for the name checks.
    ignore: names never reported as unknown (values the roles keep in vars/main.yml).
    instances: host -> {status, zone} of the VMs the gcp_compute inventory lists (its gcp_status
    and gcp_zone): a node that is not RUNNING is refused by name.
    plan is None when there are problems.
    """
    problems = []

    def add(found):
        for problem in found:
            if problem not in problems:
                problems.append(problem)

    def note(problem):
        add([problem])

    if purpose not in PURPOSES:
        add(["llamafactory_purpose is %r: use one of train, admin, doctor" % (purpose,)])
    per_host = dict((h, dict(per_host.get(h) or {})) for h in set(per_host) | set(play_hosts))
    add(_names_problems(play_names, per_host, known, ignore))

    group_hosts = list(group_hosts or [])
    play_hosts = list(play_hosts or [])
    if not group_hosts:
        note(
            "The inventory has no hosts in the group 'llamafactory'. Put the training VMs under "
            "[llamafactory] (see inventories/gcp.ini)."
        )
    outside = [h for h in play_hosts if h not in group_hosts]
    if outside:
        note(
            "%s %s not in the group 'llamafactory': run the playbooks on that group (hosts: "
            "llamafactory) and put every training VM in it"
            % (", ".join(outside), "is" if len(outside) == 1 else "are")
        )
    left_out = [h for h in group_hosts if h not in play_hosts]
    if left_out and purpose in ("train", "doctor") and play_hosts:
        note(
            "--limit leaves out %s of the group 'llamafactory': a %s runs on every node of the "
            "job (the ranks rendezvous), so drop --limit, or take the node out of the group"
            % (", ".join(left_out), "training job" if purpose == "train" else "doctor's check")
        )

    values = {}
    for name, var in SCHEMA.items():
        if name in settings:
            value, found = check_value(var, settings[name])
            add(found)
            values[name] = value
        else:
            values[name] = var.default

    # Each host's own values (where they differ from the play's), and the value each node uses.
    nodes = [h for h in group_hosts if h in play_hosts] if group_hosts else play_hosts
    everyone = list(group_hosts) + [h for h in play_hosts if h not in group_hosts]
    effective = {}
    for host in everyone:
        effective[host] = {}
        for name, var in SCHEMA.items():
            if name in per_host.get(host, {}) and per_host[host][name] != settings.get(name):
                value, found = check_value(var, per_host[host][name], "%s of %s" % (name, host))
                add(found)
                effective[host][name] = value
            else:
                effective[host][name] = values[name]

    def varies(name):
        seen = []
        for host in nodes:
            value = effective[host][name]
            if value not in seen:
                seen.append(value)
        return seen

    uneven = values["llamafactory_allow_uneven_gpus"]
    for name in SAME_ON_EVERY_NODE + (() if uneven else ("llamafactory_gpus_per_node",)):
        set_on = [h for h in nodes if name in per_host.get(h, {})]
        if set_on and len(set_on) < len(nodes):
            note(
                "%s is set on %s but not on %s: the job has one value; set it once for the group "
                "'llamafactory' (group_vars) or on every node"
                % (name, ", ".join(set_on), ", ".join(h for h in nodes if h not in set_on))
            )
    for name in SAME_ON_EVERY_NODE:
        seen = varies(name)
        if len(seen) > 1:
            note(
                "%s differs between the nodes (%s): the job has one value; set it once for the "
                "group 'llamafactory'" % (name, ", ".join(str(v) for v in seen))
            )
    gpus_seen = varies("llamafactory_gpus_per_node")
    if len(gpus_seen) > 1 and not values["llamafactory_allow_uneven_gpus"]:
        note(
            "llamafactory_gpus_per_node differs between the nodes (%s): torchrun runs the same "
            "number of processes on every node. Set one value for the group, or "
            "llamafactory_allow_uneven_gpus=true if you know the job copes."
            % ", ".join(str(v) for v in gpus_seen)
        )

    for host in nodes:
        platform = effective[host]["llamafactory_platform"]
        if platform is not None and platform not in ("gcp", "local"):
            note(
                "llamafactory_platform is %r on %s; set it to 'gcp' (GCP VMs, the default) or "
                "'local' (the local cluster)." % (platform, host)
            )
        mode = effective[host]["llamafactory_network_mode"]
        allowed = mode == "bridge" and values["llamafactory_allow_bridge"]
        if mode is not None and mode != "host" and not allowed:
            note(
                "llamafactory_network_mode is %r: only 'host' trains across nodes (on Docker's "
                "bridge every rank advertises a 172.17.x address that the other VMs cannot reach: "
                '"socketStartConnect: Connect to 172.17.0.2<...> failed"). Set '
                "llamafactory_network_mode=host. ('bridge' with llamafactory_allow_bridge=true "
                "exists to reproduce that failure.)" % mode
            )
        profile = effective[host]["llamafactory_network_profile"]
        if mode is not None and mode != "host" and profile not in (None, "auto", "socket"):
            note(
                "llamafactory_network_profile is %r but llamafactory_network_mode is %r: GPU NICs "
                "are the host's, so the %s profile needs llamafactory_network_mode=host."
                % (profile, mode, profile)
            )
        addr = effective[host]["llamafactory_master_addr"]
        allow_public = values["llamafactory_allow_public_master_addr"]
        if addr is not None and address_kind(addr) == "public" and not allow_public:
            note(
                "llamafactory_master_addr %s is a public address (an external IP: the rendezvous "
                "would go over the internet and need its port open to it). Remove it to let "
                "discover_network use rank 0's internal address, or set it to that address "
                "(llamafactory_allow_public_master_addr=true accepts a public one)." % addr
            )

    for host in nodes if purpose in ("train", "doctor") else ():
        instance = (instances or {}).get(host) or {}
        status = instance.get("status")
        if status is not None and status != "RUNNING":
            zone = str(instance.get("zone") or "ZONE").rsplit("/", 1)[-1]
            note(
                "%s is %s in Compute Engine (gcp_status, from the dynamic inventory), not "
                "RUNNING: it cannot take part in the job. Start it (gcloud compute instances "
                "start %s --zone %s), or take it out of the job (remove its llamafactory=training "
                "label), then run again." % (host, status, host, zone)
            )

    if values["llamafactory_registry_password"] and not values["llamafactory_registry_username"]:
        note(
            "llamafactory_registry_password is set but llamafactory_registry_username is empty: "
            "set both (for Artifact Registry, llamafactory_registry_username=oauth2accesstoken "
            "with an access token)."
        )
    # A deleted VM's disk goes with it: delete only what is also somewhere else.
    if purpose in ("train", "admin") and not values["launch_fetch_model_max_mb"]:
        for name in ("gcp_instances_when_done", "gcp_instances_when_failed"):
            if values[name] == "delete":
                note(
                    "%s is delete but launch_fetch_model_max_mb is 0: the VMs' disks would go "
                    "with the only copy of the trained model and its checkpoints. Let the model "
                    "come to the controller (launch_fetch_model_max_mb, default 2048), or set %s "
                    "to stop (the disks stay, no GPU is billed) or keep." % (name, name)
                )
    # Without host networking the ranks run without their agents, and the wait polls every
    # node at once (with them it holds one fork: rank 0's agent watches the others).
    waits = purpose == "train" and values["launch_wait"]
    without_agents = [h for h in nodes if effective[h]["llamafactory_network_mode"] != "host"]
    if waits and without_agents and forks is not None and int(forks) < len(nodes):
        note(
            "forks is %s but the job has %d nodes and llamafactory_network_mode %s: without "
            "host networking the ranks run without their agents and the wait polls every node "
            "at once. Run with -f %d or set forks in ansible.cfg (or launch_wait=false)."
            % (
                forks,
                len(nodes),
                effective[without_agents[0]]["llamafactory_network_mode"],
                len(nodes),
            )
        )
    platforms = set(effective[h]["llamafactory_platform"] for h in nodes)
    if purpose == "train" and platforms == {"gcp"}:
        if not values["llamafactory_gcp_project"]:
            note(
                "llamafactory_gcp_project is not set: the GCP firewall rule needs the ID of the "
                "project that holds the VMs' VPC network (the host project for a shared VPC); set "
                "it or export GCP_PROJECT (or llamafactory_platform=local off GCP)"
            )
        kind = values["llamafactory_gcp_auth_kind"]
        if kind == "serviceaccount" and not values["llamafactory_gcp_service_account_file"]:
            note(
                "llamafactory_gcp_auth_kind is serviceaccount but "
                "llamafactory_gcp_service_account_file is empty: give the key file's path on the "
                "controller"
            )
        if kind == "accesstoken" and not values["llamafactory_gcp_access_token"]:
            note(
                "llamafactory_gcp_auth_kind is accesstoken but llamafactory_gcp_access_token is "
                "empty: give a token (gcloud auth print-access-token)"
            )

    ranks, found = (
        node_ranks(
            group_hosts, dict((h, effective[h]["llamafactory_node_rank"]) for h in group_hosts)
        )
        if group_hosts
        else ({}, [])
    )
    add(found)

    # The job's identity.
    config_path = values["llamafactory_config"]
    job = values["llamafactory_job"]
    given_job, given_config = settings.get("llamafactory_job"), settings.get("llamafactory_config")
    if purpose == "train" and not given_config:
        note(
            "llamafactory_config must name a LLaMA-Factory training YAML on the controller (got "
            "nothing); for example llamafactory_config=configs/llama3_lora_sft_ds3.yaml."
        )
    if purpose == "admin" and not given_job and not given_config:
        note(
            "llamafactory_job is not set: name the job to act on (-e llamafactory_job=NAME), or "
            "give its llamafactory_config; status, stop and cleanup act on one job only"
        )
    if not job and config_path:
        job = derive_job(config_path)
        if not JOB_RE.match(job):
            note(
                "llamafactory_job is not set and the name of llamafactory_config (%s) gives no "
                "usable job name (%r): set llamafactory_job to 1-48 lower-case letters, digits "
                "and dashes" % (config_path, job)
            )
    job = job or ""
    master_port = values["llamafactory_master_port"]
    if master_port is None:
        master_port = derive_master_port(job)
    preflight_port = values["preflight_port"]
    if preflight_port is None:
        preflight_port = derive_preflight_port(master_port)
    elif preflight_port == master_port:
        note(
            "preflight_port is %d, the same as llamafactory_master_port: give another port (or "
            "leave it unset: MASTER_PORT + 20000)" % preflight_port
        )
    agent_port = values["launch_agent_port"]
    if agent_port is None:
        agent_port = derive_agent_port(master_port)
    elif agent_port in (master_port, preflight_port):
        note(
            "launch_agent_port is %d, the same as llamafactory_master_port or preflight_port: "
            "give another port (or leave it unset: MASTER_PORT + 10000)" % agent_port
        )
    jobs_root = (values["llamafactory_jobs_root"] or "").rstrip("/") or "/"
    job_dir = "%s/%s" % (jobs_root, job if job else ".doctor")

    result = {
        "job": job,
        "purpose": purpose,
        "master_port": master_port,
        "preflight_port": preflight_port,
        "agent_port": agent_port,
        "jobs_root": jobs_root,
        "job_dir": job_dir,
        "output_dir": "%s/output" % job_dir,
        "container": "llamafactory-%s" % job if job else "",
        "nodes": nodes,
        "ranks": ranks,
        "master": next((h for h, r in ranks.items() if r == 0), None),
        "nproc": max(values["llamafactory_gpus_per_node"] or 0, 1),
        "platform": values["llamafactory_platform"],
        "gpus_per_node": dict((h, effective[h]["llamafactory_gpus_per_node"] or 0) for h in nodes),
    }

    if purpose == "train" and config_path:
        overrides = values["llamafactory_train_overrides"] or {}
        path = os.path.abspath(os.path.expanduser(config_path))
        try:
            config = read_config(path)
        except (OSError, yaml.YAMLError) as exc:
            note(
                "llamafactory_config must name a LLaMA-Factory training YAML on the controller "
                "(got %s: %s); for example llamafactory_config=configs/llama3_lora_sft_ds3.yaml."
                % (config_path, getattr(exc, "strerror", None) or exc)
            )
        else:
            found = config_problems(
                config, overrides, config_path, values["llamafactory_gpus_per_node"]
            )
            add(found)
            if not found:
                try:
                    planned = train_plan(
                        config,
                        path,
                        job_dir,
                        overrides,
                        values["llamafactory_shared_mounts"],
                        collective_timeout_max=values["llamafactory_collective_timeout_max"],
                    )
                except PlanError as exc:
                    add(["llamafactory_config: %s" % exc])
                else:
                    result.update(
                        config=planned["config"],
                        copies=planned["copies"],
                        digest=planned["digest"],
                        notes=planned["notes"],
                        warnings=planned["warnings"],
                        output_dir=planned["output_dir"],
                    )
    if problems:
        return None, problems
    return result, []


def spec_options(roles_dir):
    """{name: option} of every option in every roles/*/meta/argument_specs.yml."""
    options = {}
    for role in sorted(os.listdir(roles_dir)):
        path = os.path.join(roles_dir, role, "meta", "argument_specs.yml")
        if not os.path.isfile(path):
            continue
        specs = read_yaml(path).get("argument_specs") or {}
        for entry in specs.values():
            for name, option in ((entry or {}).get("options") or {}).items():
                options.setdefault(name, option or {})
    return options


def role_value_names(roles_dir):
    """Names the roles define in defaults/ and vars/ main.yml (not user settings)."""
    defaults, fixed = set(), set()
    for role in sorted(os.listdir(roles_dir)):
        for folder, into in (("defaults", defaults), ("vars", fixed)):
            path = os.path.join(roles_dir, role, folder, "main.yml")
            if not os.path.isfile(path):
                continue
            data = read_yaml(path) or {}
            into.update(data)
    return defaults, fixed


__all__ = ["PREFIXES", "SCHEMA", "validate"]
