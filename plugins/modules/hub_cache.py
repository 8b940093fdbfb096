#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: hub_cache
short_description: A Hugging Face Hub repository fetched once per job and copied node to node
version_added: 0.1.0
description:
  - Keeps a Hub repository (the training config's C(model_name_or_path)) in the node's Hugging
    Face cache, in huggingface_hub's own layout, so that the ranks load it with
    C(HF_HUB_OFFLINE=1).
  - V(look) says whether the node's cache holds the whole repository at the revision (its
    manifest, written last, lists every file at its size); nothing is contacted.
  - V(download) runs the job's image's huggingface_hub (C(hub_download.py), in O(work)) in a
    container with host networking, the cache mounted as the ranks mount it, C(HF_ENDPOINT)
    and the token file (C(HF_TOKEN_PATH), 0600, never on a command line); the container
    writes its progress and result to O(work).
  - V(serve) starts, detached, an HTTP server of the repository's folder on O(address):O(port)
    (only the files the manifest lists) for O(timeout) seconds; V(pull) copies the folder
    from O(source) (another node's V(serve)), resuming a partial file, each file checked
    against the manifest's SHA-256 and a blob against its name, the manifest written last.
  - V(poll) reads the state of a V(download), V(serve) or V(pull) that runs; V(stop) ends
    it. The action plugin drives the phases, prints progress every O(progress_every) seconds
    and stops at O(timeout) with how far it got.
author:
  - hostnet.llamafactory contributors (@hostnet)
options:
  step:
    description: What to do (see the description).
    type: str
    choices: [look, download, serve, pull]
    required: true
  phase:
    description: V(start) it, V(poll) it or V(stop) it (the action plugin does; V(look) has none).
    type: str
    choices: [start, poll, stop]
    default: start
  cache:
    description: The node's hub cache folder (C(HF_HUB_CACHE), C(llamafactory_hf_cache)/hub).
    type: path
    required: true
  repos:
    description: The repositories, each C(key), C(repo_id), C(repo_type) and C(revision).
    type: list
    elements: dict
    required: true
  work:
    description: Folder for the script, the arguments and the state files (the job's folder).
    type: path
  image:
    description: The image whose huggingface_hub downloads (V(download)).
    type: str
  endpoint:
    description: C(HF_ENDPOINT) for the download (empty - huggingface_hub's default).
    type: str
    default: ''
  token_file:
    description: The token file on the node (0600), mounted read-only for C(HF_TOKEN_PATH).
    type: path
  address:
    description: The address V(serve) binds (the node's training NIC's).
    type: str
  port:
    description: The port V(serve) binds.
    type: int
  source:
    description: The serving node's URL (C(http://ADDRESS:PORT)) for V(pull).
    type: str
  timeout:
    description: Seconds the step may take (V(serve) serves this long at most).
    type: int
    default: 3600
  progress_every:
    description: Seconds between progress lines (the action plugin).
    type: float
    default: 30
  interval:
    description: Seconds between polls (the action plugin).
    type: float
    default: 1
  docker_socket:
    description: The Docker daemon's socket.
    type: path
    default: /var/run/docker.sock
attributes:
  check_mode:
    support: full
    description: V(look) runs; the others report what they would do and change nothing.
  diff_mode:
    support: none
    description: No diff.
notes:
  - One repository per call for V(download), V(serve) and V(pull) (the first of O(repos)).
"""

EXAMPLES = r"""
- name: Look for the model in the node's cache
  hostnet.llamafactory.hub_cache:
    step: look
    cache: /var/lib/llamafactory/hf-cache/hub
    repos:
      - key: model_name_or_path
        repo_id: meta-llama/Meta-Llama-3-8B-Instruct
        repo_type: model
        revision: main
  register: found

- name: Download it on rank 0's node (progress every 30 s)
  hostnet.llamafactory.hub_cache:
    step: download
    cache: /var/lib/llamafactory/hf-cache/hub
    repos: "{{ found.repos_wanted }}"
    work: /var/lib/llamafactory/jobs/llama3/hub
    image: hiyouga/llamafactory:0.9.5
    token_file: /var/lib/llamafactory/jobs/llama3/secrets/hf_token
"""

RETURN = r"""
repos:
  description: V(look) - per key, C(complete), C(commit), C(bytes), C(folder) and C(why) not.
  returned: step=look
  type: dict
complete:
  description: V(look) - every repository is complete on this node.
  returned: step=look
  type: bool
state:
  description: The step's state (V(downloading), V(serving), V(pulling), V(done), V(failed)...).
  returned: step is not look
  type: str
kind:
  description: Why it failed (V(not-found), V(gated), V(revision), V(token), V(unreachable),
    V(disk), V(source), V(copy), V(failed)).
  returned: when failed
  type: str
received:
  description: Bytes in the cache's copy so far.
  returned: download, pull
  type: int
total:
  description: Bytes of the files to fetch.
  returned: download, pull (once known)
  type: int
"""

import contextlib
import os
import re
import signal
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _hub_cache as hub
from ansible_collections.hostnet.llamafactory.plugins.module_utils._docker_api import (
    DockerAPI,
    DockerError,
)

CONTAINER_CACHE = "/root/.cache/huggingface/hub"
CONTAINER_WORK = "/hostnet-hub"
CONTAINER_TOKEN = "/run/secrets/hf_token"  # noqa: S105 - a path, not a secret


def spawn(function):
    """Run `function` in a detached grandchild (new session, no stdio); return its PID."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child:
        os.close(write_end)
        pid = int(os.read(read_end, 32) or 0)
        os.close(read_end)
        os.waitpid(child, 0)
        return pid
    try:
        os.close(read_end)
        os.setsid()
        grandchild = os.fork()
        if grandchild:
            os.write(write_end, str(grandchild).encode("ascii"))
            os._exit(0)
        os.close(write_end)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, 1024)
        function()
    finally:
        os._exit(0)


def alive(pid):
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError):
        return False
    try:  # a zombie is not alive
        with open("/proc/%d/stat" % int(pid)) as handle:
            return handle.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IOError, IndexError):
        return True


def container_name(params, repo, action):
    """The download's container: one per job (the job's folder holds `work`) and repository."""
    job = os.path.basename(os.path.dirname(os.path.normpath(params["work"])))
    key = re.sub(r"[^a-z0-9.-]+", "-", repo["key"].lower())
    return "llamafactory-hub-%s-%s-%s" % (action, job, key)


def state_path(params, repo, action):
    """The step's state file (one server for every repository)."""
    if action == "serve":
        return os.path.join(params["work"], "serve.json")
    return os.path.join(params["work"], "%s-%s.json" % (action, repo["key"]))


def folder_of(params, repo):
    return os.path.join(
        params["cache"], hub.repo_folder(repo["repo_id"], repo.get("repo_type") or "model")
    )


def look(module, params):
    found = hub.look(params["cache"], params["repos"])
    module.exit_json(
        changed=False, repos=found, complete=all(r["complete"] for r in found.values())
    )


def start(module, params, repo, action):
    if module.check_mode:
        module.exit_json(
            changed=True, state="check", msg="check mode: would %s %s" % (action, repo["repo_id"])
        )
    if not os.path.isdir(params["work"]):
        os.makedirs(params["work"], 0o700)
    path = state_path(params, repo, action)
    before = (hub.read_json(path) or {}).get("pid") or (hub.read_json(path + ".pid") or {}).get(
        "pid"
    )
    if action != "download" and before and alive(before):  # an earlier run's, left over
        os.kill(int(before), signal.SIGTERM)
        time.sleep(0.5)
    if os.path.exists(path):
        os.remove(path)
    folder = folder_of(params, repo)
    if action == "download":
        start_download(module, params, repo, path)
    if action == "serve":
        repos = dict((folder_of(params, r), r["revision"]) for r in params["repos"])
        pid = spawn(
            lambda: hub.serve(repos, params["address"], params["port"], path, params["timeout"])
        )
    else:
        if not os.path.isdir(folder):
            os.makedirs(folder, 0o755)
        pid = spawn(lambda: hub.pull(params["source"], folder, repo["revision"], path))
    hub.write_json(path + ".pid", {"pid": pid, "started": time.time()})
    module.exit_json(changed=True, state="started", pid=pid)


def start_download(module, params, repo, path):
    docker = DockerAPI(params["docker_socket"])
    name = container_name(params, repo, "download")
    args = {
        "repo_id": repo["repo_id"],
        "repo_type": repo.get("repo_type") or "model",
        "revision": repo["revision"],
        "cache": CONTAINER_CACHE,
        "state": "%s/%s" % (CONTAINER_WORK, os.path.basename(path)),
    }
    hub.write_json(os.path.join(params["work"], "download-args.json"), args)
    env = ["HF_HUB_DISABLE_TELEMETRY=1", "HF_HUB_CACHE=%s" % CONTAINER_CACHE]
    binds = [
        "%s:%s" % (params["cache"], CONTAINER_CACHE),
        "%s:%s" % (params["work"], CONTAINER_WORK),
    ]
    if params["endpoint"]:
        env.append("HF_ENDPOINT=%s" % params["endpoint"])
    if params["token_file"] and os.path.isfile(params["token_file"]):
        env.append("HF_TOKEN_PATH=%s" % CONTAINER_TOKEN)
        binds.append("%s:%s:ro" % (params["token_file"], CONTAINER_TOKEN))
    try:
        docker.delete("/containers/%s" % name, query={"force": "true"})
        created = docker.post_json(
            "/containers/create",
            query={"name": name},
            body={
                "Image": params["image"],
                "Cmd": [
                    "python3",
                    CONTAINER_WORK + "/hub_download.py",
                    CONTAINER_WORK + "/download-args.json",
                ],
                "Env": env,
                "Labels": {"hostnet.llamafactory.hub": repo["repo_id"]},
                "HostConfig": {"NetworkMode": "host", "Binds": binds},
            },
        )
        docker.post_json("/containers/%s/start" % created["Id"], ok=(204, 304))
    except DockerError as exc:
        module.fail_json(
            msg="cannot start the download of %s in a container of %s: %s"
            % (repo["repo_id"], params["image"], exc)
        )
    module.exit_json(changed=True, state="started", container=name)


def poll(module, params, repo, action):
    path = state_path(params, repo, action)
    record = hub.read_json(path) or {}
    if action == "download":
        docker = DockerAPI(params["docker_socket"])
        try:
            info = docker.inspect_container(container_name(params, repo, action))
        except DockerError as exc:
            module.fail_json(msg="cannot look at the download's container: %s" % exc)
        running = bool(info and info["State"]["Running"])
        if not running and record.get("state") not in ("done", "failed"):
            time.sleep(0.5)
            record = hub.read_json(path) or {}
            if record.get("state") not in ("done", "failed"):
                logs = ""
                with contextlib.suppress(DockerError):
                    logs = docker.container_logs(
                        container_name(params, repo, action), tail=20, timestamps=False
                    )
                record.update(
                    state="failed",
                    kind="failed",
                    error="the download's container exited without a result: %s"
                    % "".join(logs)[-1500:],
                )
        if not running and info is not None and record.get("state") == "done":
            docker.delete(
                "/containers/%s" % container_name(params, repo, action), query={"force": "true"}
            )
    else:
        started = hub.read_json(path + ".pid") or {}
        pid = record.get("pid") or started.get("pid")
        young = time.time() - started.get("started", 0) < 10
        if (
            record.get("state") in (None, "starting", "pulling", "serving")
            and not alive(pid)
            and not young
        ):
            time.sleep(0.5)
            record = hub.read_json(path) or record
            if record.get("state") in (None, "starting", "pulling", "serving"):
                record.update(
                    state="failed",
                    kind="failed",
                    error="the %s process ended without a result" % action,
                )
    record.setdefault("state", "starting")
    module.exit_json(changed=record["state"] == "done", **record)


def stop(module, params, repo, action):
    stopped = False
    if action == "download":
        docker = DockerAPI(params["docker_socket"])
        try:
            stopped = docker.delete(
                "/containers/%s" % container_name(params, repo, action), query={"force": "true"}
            )
        except DockerError as exc:
            module.fail_json(msg="cannot remove the download's container: %s" % exc)
    else:
        path = state_path(params, repo, action)
        record = hub.read_json(path) or {}
        pid = record.get("pid") or (hub.read_json(path + ".pid") or {}).get("pid")
        if pid and alive(pid):
            os.kill(int(pid), signal.SIGTERM)
            stopped = True
    module.exit_json(changed=False, stopped=stopped)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            step=dict(type="str", choices=["look", "download", "serve", "pull"], required=True),
            phase=dict(type="str", choices=["start", "poll", "stop"], default="start"),
            cache=dict(type="path", required=True),
            repos=dict(type="list", elements="dict", required=True),
            work=dict(type="path"),
            image=dict(type="str"),
            endpoint=dict(type="str", default=""),
            token_file=dict(type="path"),
            address=dict(type="str"),
            port=dict(type="int"),
            source=dict(type="str"),
            timeout=dict(type="int", default=3600),
            progress_every=dict(type="float", default=30),
            interval=dict(type="float", default=1),
            docker_socket=dict(type="path", default="/var/run/docker.sock"),
        ),
        required_if=[
            ("step", "download", ("work", "image")),
            ("step", "serve", ("work", "address", "port")),
            ("step", "pull", ("work", "source")),
        ],
        supports_check_mode=True,
    )
    params = module.params
    if params["step"] == "look":
        look(module, params)
    repo = params["repos"][0]
    phases = {"start": start, "poll": poll, "stop": stop}
    phases[params["phase"]](module, params, repo, params["step"])


if __name__ == "__main__":
    main()
