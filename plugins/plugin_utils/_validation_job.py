# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The job: its identity and ports, and its training config (controller only, private; steps of
_validation.validate()).

identity() names the job (llamafactory_job, or the config's file name), derives its ports
(rendezvous, preflight, agents) and folders; training_config() reads the training YAML with
llamafactory_train_overrides over it, checks the options the collection or the nodes depend on
and plans what every node gets (_train_config.plan).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import os
import re

import yaml
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._train_config import (
    PlanError,
)
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._train_config import (
    plan as train_plan,
)
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._validation_values import (
    CONTROL_RE,
    JOB_RE,
)

# -- the job: its name, ports and folder ---------------------------------------------------


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


def identity(values, settings, purpose):
    """(the plan's job part, problems): the job's name (llamafactory_job, or derived from
    llamafactory_config's file name; admin needs one of them, train the config), its ports
    (derived when unset; none may be another's) and its folder and container."""
    problems = []
    config_path = values["llamafactory_config"]
    job = values["llamafactory_job"]
    given_job, given_config = settings.get("llamafactory_job"), settings.get("llamafactory_config")
    if purpose == "train" and not given_config:
        problems.append(
            "llamafactory_config must name a LLaMA-Factory training YAML on the controller (got "
            "nothing); for example llamafactory_config=configs/llama3_lora_sft_ds3.yaml."
        )
    if purpose == "admin" and not given_job and not given_config:
        problems.append(
            "llamafactory_job is not set: name the job to act on (-e llamafactory_job=NAME), or "
            "give its llamafactory_config; status, stop and cleanup act on one job only"
        )
    if not job and config_path:
        job = derive_job(config_path)
        if not JOB_RE.match(job):
            problems.append(
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
        problems.append(
            "preflight_port is %d, the same as llamafactory_master_port: give another port (or "
            "leave it unset: MASTER_PORT + 20000)" % preflight_port
        )
    agent_port = values["launch_agent_port"]
    if agent_port is None:
        agent_port = derive_agent_port(master_port)
    elif agent_port in (master_port, preflight_port):
        problems.append(
            "launch_agent_port is %d, the same as llamafactory_master_port or preflight_port: "
            "give another port (or leave it unset: MASTER_PORT + 10000)" % agent_port
        )
    jobs_root = (values["llamafactory_jobs_root"] or "").rstrip("/") or "/"
    job_dir = "%s/%s" % (jobs_root, job if job else ".doctor")
    plan = {
        "job": job,
        "purpose": purpose,
        "master_port": master_port,
        "preflight_port": preflight_port,
        "agent_port": agent_port,
        "jobs_root": jobs_root,
        "job_dir": job_dir,
        "output_dir": "%s/output" % job_dir,
        "output_uri": values["llamafactory_output_uri"] or "",
        "container": "llamafactory-%s" % job if job else "",
    }
    return plan, problems


# -- the training config -------------------------------------------------------------------

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
    "model_revision",
)
# A branch, tag or commit of the Hub (a file name in the nodes' cache: no "..").
REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,255}$")
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
    revision = merged.get("model_revision")
    if isinstance(revision, str) and (not REVISION_RE.match(revision) or ".." in revision):
        problems.append(
            "%s is %r: give a Hub branch, tag or commit (letters, digits, . _ - /)"
            % (where("model_revision"), revision)
        )
    if gpus == 0 and merged.get("ddp_backend") != "gloo":
        problems.append(
            "llamafactory_gpus_per_node is 0 (CPU nodes) but the training config sets no "
            "`ddp_backend: gloo` (NCCL needs GPUs): add it to %s or to "
            "llamafactory_train_overrides." % config_path
        )
    return problems


def training_config(values, job_dir, read_config):
    """(the plan's training part, problems): to train, the YAML llamafactory_config names, read
    with read_config(path), checked, and planned for job_dir ({} when it has problems)."""
    config_path = values["llamafactory_config"]
    overrides = values["llamafactory_train_overrides"] or {}
    path = os.path.abspath(os.path.expanduser(config_path))
    try:
        config = read_config(path)
    except (OSError, yaml.YAMLError) as exc:
        return {}, [
            "llamafactory_config must name a LLaMA-Factory training YAML on the controller "
            "(got %s: %s); for example llamafactory_config=configs/llama3_lora_sft_ds3.yaml."
            % (config_path, getattr(exc, "strerror", None) or exc)
        ]
    found = config_problems(config, overrides, config_path, values["llamafactory_gpus_per_node"])
    if found:
        return {}, found
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
        return {}, ["llamafactory_config: %s" % exc]
    keys = (
        "config",
        "copies",
        "digest",
        "notes",
        "warnings",
        "output_dir",
        "hub",
        "hub_offline",
        "files",
    )
    return dict((key, planned[key]) for key in keys), []
