# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The per-node form of a LLaMA-Factory training config (controller only, private).

A user's YAML names paths as seen from where it was written. Every node needs them as node-local
paths under the job directory: outputs (with ZeRO-3 every node writes its own shard), the
dataset folder, the DeepSpeed JSON and a local model folder. A path found on the controller
(relative paths are taken relative to the YAML's folder) is copied to every node; one that is
not found is left alone: it names a file inside the image (such as LLaMA-Factory's own
examples/) or a model on the Hugging Face Hub.

A `model_name_or_path` that is neither on the controller nor on a shared mount and reads as a
Hub id (ORG/NAME or NAME) is listed in `hub` with its revision (`model_revision`, default
main): the launch fetches it once into the nodes' Hugging Face cache and the ranks load it
offline (roles/launch/tasks/hub.yml). So are the datasets the config uses whose entry in a
dataset_dir copied from the controller names `hf_hub_url`: the nodes then read a rewritten
dataset_info.json (`files`, in JOB/dataset_info) that points them at the fetched snapshot and
every other entry's file at its copy. `hub_offline` says whether the ranks can run offline
(not with dataset_dir ONLINE or REMOTE:, which name Hub datasets the launch does not fetch).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json
import os
import re

# config key -> name under the job directory
COPIED_KEYS = (
    ("model_name_or_path", "model"),
    ("adapter_name_or_path", "adapter"),
    ("dataset_dir", "data"),
    ("deepspeed", "deepspeed.json"),
)
# A Hub repository id: ORG/NAME or NAME (huggingface_hub's validate_repo_id, stricter).
HUB_ID_RE = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
# The ranks' HF_HOME (roles/llamafactory/vars/main.yml), where the fetched repositories are.
RANK_HF_HOME = "/root/.cache/huggingface"
# Options that send LLaMA-Factory to another hub than Hugging Face's.
OTHER_HUBS = ("use_modelscope_hub", "use_openmind_hub")
# Files up to this size are hashed by content; larger ones (model weights) by name and size.
HASH_CONTENT_LIMIT = 64 * 1024 * 1024
# Copies up to this size in all go to every node inside the launch's one file-writing call
# (inline); larger ones, or trees with links, go by ansible.builtin.copy, several round trips
# per file and node.
INLINE_COPY_LIMIT = 16 * 1024 * 1024


class PlanError(ValueError):
    """A config the launch cannot use; the message names the key and the fix."""


def _on_shared(value, shared):
    """The shared mount (an absolute folder mounted on every node) that holds `value`, or None."""
    if not os.path.isabs(value):
        return None
    path = os.path.normpath(value)
    for mount in shared or ():
        mount = os.path.normpath(mount)
        if path == mount or path.startswith(mount.rstrip("/") + "/"):
            return mount
    return None


def plan(user_config, config_path, job_dir, overrides=None, shared=(), collective_timeout_max=None):
    """{config, copies, output_dir, notes, warnings, digest} for one job; see the module
    docstring. A ddp_timeout above collective_timeout_max is lowered to it, with a warning."""
    if not isinstance(user_config, dict):
        raise PlanError(
            "%s is not a LLaMA-Factory config: it must be a YAML mapping of options "
            "(model_name_or_path, stage, dataset, output_dir, ...)" % config_path
        )
    config = dict(user_config)
    config.update(overrides or {})
    for key in ("model_name_or_path", "stage"):
        if key not in config:
            raise PlanError(
                "%s has no '%s': set it in the file or in llamafactory_train_overrides"
                % (config_path, key)
            )
    base = os.path.dirname(os.path.abspath(config_path))
    job_dir = job_dir.rstrip("/")
    copies, notes, hub = [], [], []
    for key, name in COPIED_KEYS:
        value = config.get(key)
        if not isinstance(value, str) or not value:
            continue
        mount = _on_shared(value, shared)
        if mount:
            notes.append(
                "%s %s is on the shared mount %s: every node reads it there" % (key, value, mount)
            )
            continue
        source = os.path.normpath(os.path.join(base, os.path.expanduser(value)))
        if not os.path.exists(source):
            repo = hub_repo(key, value, config)
            if repo:
                hub.append(repo)
                notes.append(
                    "%s %s is a Hugging Face Hub model: fetched once (revision %s) into every "
                    "node's cache, the ranks load it offline" % (key, value, repo["revision"])
                )
            if key in ("dataset_dir", "deepspeed"):
                notes.append(
                    "%s %s is not on the controller: the nodes use it as a path inside the image"
                    % (key, value)
                )
            continue
        if key == "deepspeed":
            _check_json(source, key)
        dest = "%s/%s" % (job_dir, name)
        copies.append({"key": key, "src": source, "dest": dest, "directory": os.path.isdir(source)})
        config[key] = dest
    inline_left = INLINE_COPY_LIMIT
    for copy in copies:
        size = inline_size(copy["src"])
        copy["inline"] = size is not None and size <= inline_left
        if copy["inline"]:
            inline_left -= size
    files, hub_offline = _hub_datasets(config, copies, job_dir, hub, notes)
    if config.get("output_dir") not in (None, "%s/output" % job_dir):
        notes.append(
            "output_dir %s becomes %s/output on every node" % (config.get("output_dir"), job_dir)
        )
    config["output_dir"] = "%s/output" % job_dir
    # Without a shared disk each node must hold a whole checkpoint (trainer state, scheduler,
    # adapter) next to its own ZeRO shard, or a resumed run fails on the other nodes.
    config.setdefault("save_on_each_node", True)
    warnings = []
    ddp_timeout = config.get("ddp_timeout")
    if (
        collective_timeout_max
        and isinstance(ddp_timeout, (int, float))
        and not isinstance(ddp_timeout, bool)
        and ddp_timeout > collective_timeout_max
    ):
        # Upstream's examples set 180000000 s: a rank whose peer hangs would wait for years.
        warnings.append(
            "ddp_timeout %s in %s is lowered to %d s (llamafactory_collective_timeout_max): a "
            "collective that hangs longer fails the job instead of waiting for years; raise "
            "llamafactory_collective_timeout_max if a single step or save really takes longer"
            % (ddp_timeout, os.path.basename(config_path), collective_timeout_max)
        )
        config["ddp_timeout"] = collective_timeout_max
    digest = hashlib.sha256()
    digest.update(json.dumps(config, sort_keys=True, default=str).encode())
    for copy in copies:
        digest.update(copy["dest"].encode())
        digest.update(tree_digest(copy["src"]).encode())
    return {
        "config": config,
        "copies": copies,
        "output_dir": config["output_dir"],
        "notes": notes,
        "warnings": warnings,
        "digest": digest.hexdigest()[:16],
        "hub": hub,
        "hub_offline": hub_offline,
        "files": files,
    }


def _names(value):
    return [n.strip() for n in value.split(",") if n.strip()] if isinstance(value, str) else []


def snapshot_link(repo_id, repo_type, revision):
    """The ranks' path of a fetched repository's snapshot (a link the fetch makes beside its
    manifest: roles/launch/files/hub_download.py)."""
    folder = "%ss--%s" % (repo_type, repo_id.replace("/", "--"))
    return "%s/hub/%s/hostnet/%s.snapshot" % (RANK_HF_HOME, folder, revision.replace("/", "%2F"))


def _hub_datasets(config, copies, job_dir, hub, notes):
    """(files, offline): the Hub datasets of a dataset_dir copied from the controller added to
    `hub`, and the rewritten dataset_info.json the nodes read instead (config's dataset_dir and,
    unless set, media_dir changed); whether the ranks can run offline."""
    where = str(config.get("dataset_dir") or "")
    if where.upper() == "ONLINE" or where.startswith("REMOTE:"):
        notes.append(
            "dataset_dir %s names datasets on the Hub by name: the ranks download them "
            "themselves (not offline)" % where
        )
        return [], False
    data = next((c for c in copies if c["key"] == "dataset_dir" and c["directory"]), None)
    if data is None or any(str(config.get(o)).lower() == "true" for o in OTHER_HUBS):
        return [], True
    try:
        with open(os.path.join(data["src"], "dataset_info.json")) as handle:
            info = json.load(handle)
    except (OSError, ValueError):
        return [], True
    if not isinstance(info, dict):
        return [], True
    used = _names(config.get("dataset")) + _names(config.get("eval_dataset"))
    fetched = {}
    for name in used:
        entry = info.get(name)
        url = entry.get("hf_hub_url") if isinstance(entry, dict) else None
        if isinstance(url, str) and HUB_ID_RE.match(url) and url not in fetched:
            fetched[url] = {
                "key": "dataset_%d" % (len(fetched) + 1),
                "repo_id": url,
                "repo_type": "dataset",
                "revision": "main",
            }
            notes.append(
                "dataset %s is on the Hugging Face Hub (%s): fetched once into every node's "
                "cache, the ranks read it offline" % (name, url)
            )
    if not fetched:
        return [], True
    hub.extend(fetched.values())
    rewritten = {}
    for name, entry in info.items():
        if isinstance(entry, dict):
            entry = dict(entry)
            url = entry.get("hf_hub_url")
            if name in used and url in fetched:
                entry["hf_hub_url"] = snapshot_link(url, "dataset", "main")
            for key in ("file_name", "script_url"):
                value = entry.get(key)
                if isinstance(value, str) and value and not os.path.isabs(value):
                    entry[key] = "%s/%s" % (data["dest"], value)
        rewritten[name] = entry
    folder = "%s/dataset_info" % job_dir
    config["dataset_dir"] = folder
    config.setdefault("media_dir", data["dest"])
    content = json.dumps(rewritten, indent=2, sort_keys=True) + "\n"
    return [
        {"path": folder, "state": "directory", "mode": "0750"},
        {"path": folder + "/dataset_info.json", "content": content, "mode": "0640", "json": True},
    ], True


def hub_repo(key, value, config):
    """{key, repo_id, repo_type, revision} when the config's `key` names a Hugging Face Hub
    model (not found on the controller, not a path, no other hub asked for), else None."""
    if key != "model_name_or_path" or not HUB_ID_RE.match(value) or value in (".", ".."):
        return None
    if any(str(config.get(option)).lower() == "true" for option in OTHER_HUBS):
        return None
    revision = config.get("model_revision") or "main"
    return {"key": key, "repo_id": value, "repo_type": "model", "revision": str(revision)}


def _check_json(path, key):
    if os.path.isdir(path):
        raise PlanError("%s %s is a folder: point it at the DeepSpeed JSON file" % (key, path))
    try:
        with open(path) as handle:
            json.load(handle)
    except ValueError as exc:
        raise PlanError("%s %s is not valid JSON: %s" % (key, path, exc)) from exc


def inline_size(path):
    """The bytes of a file or a folder's files, or None when the folder holds a link (such a
    tree goes by ansible.builtin.copy, which follows links as it always did)."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            if os.path.islink(os.path.join(folder, name)):
                return None
        total += sum(os.path.getsize(os.path.join(folder, name)) for name in files)
    return total


def tree_digest(path):
    """A digest of a file or a folder's files (names, sizes, and contents up to the limit)."""
    digest = hashlib.sha256()
    if os.path.isfile(path):
        entries = [("", path)]
    else:
        entries = []
        for folder, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                full = os.path.join(folder, name)
                entries.append((os.path.relpath(full, path), full))
    for relative, full in entries:
        size = os.path.getsize(full)
        digest.update(("%s\0%d\0" % (relative, size)).encode())
        if size <= HASH_CONTENT_LIMIT:
            with open(full, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()
