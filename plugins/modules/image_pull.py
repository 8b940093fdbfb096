#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: image_pull
short_description: Pull a (multi-GB) image on every node with a deadline and progress
version_added: 0.1.0
description:
  - Pulls an image into the node's Docker daemon through the Engine API and reports how far it
    got while it runs (bytes downloaded of the bytes known, layers done, throughput). An action
    plugin on the controller starts the pull in the background on each node, polls it, prints
    progress and fails at O(timeout) with how far the pull got, cancelling it.
  - Credentials given as O(username)/O(password) travel only inside the module's arguments and
    the pull request; they are never written to the node (no C(docker login)) and never on a
    command line. Without them the node's own Docker client config is used as the docker CLI
    would use it (C(credHelpers), C(auths), C(credsStore)), so a node set up with
    C(gcloud auth configure-docker) pulls from Artifact Registry with its service account.
  - A failed pull is explained (bad credentials, unknown image, untrusted certificate,
    unreachable registry, full disk) with the variable to change.
  - Why not C(community.docker.docker_image_pull) - it blocks until the pull ends and reports
    nothing before; a multi-GB pull over a slow link then looks like a hang, and a deadline is
    only possible with C(async), which cannot say how far the pull got.
  - Why not community.docker's API client either - its module_utils (C(plugins/module_utils/_api))
    are private to that collection in its current releases and need the Python package
    C(requests) on the node; the pull runs in a process detached from the module, folding the
    daemon's event stream into a progress record, and needs only the standard library. The
    collection's own client (C(plugins/module_utils/_docker_api.py), shared with
    M(hostnet.llamafactory.job_status)) talks to the daemon's socket directly.
  - The module itself runs in three phases (O(phase)); use the action, which drives them.
author:
  - hostnet.llamafactory contributors (@hostnet)
options:
  name:
    description: The image reference (C(registry/repository:tag) or C(...@sha256:digest)).
    type: str
    required: true
  pull:
    description:
      - V(not_present) pulls only when the daemon does not have the image; V(always) asks the
        registry every time (changed only when the image changed); V(never) never contacts a
        registry and fails, saying so, when the image is not on the node (nodes without a path
        to the registry, loaded by hand).
    type: str
    choices: [always, not_present, never]
    default: not_present
  username:
    description: Registry user name (for Artifact Registry C(oauth2accesstoken) or C(_json_key)).
    type: str
  password:
    description: Registry password or access token; given only with O(username).
    type: str
  timeout:
    description: Seconds the whole pull may take; the pull is cancelled when it is reached.
    type: int
    default: 3600
  interval:
    description: Seconds between two looks at the pull's progress (action only).
    type: float
    default: 2
  phase:
    description:
      - Internal, set by the action. V(start) starts the pull in the background (or finds the
        image present, or attaches to a pull of the same image already running); V(poll)
        reports its progress; V(cancel) stops it.
    type: str
    choices: [start, poll, cancel]
    default: start
extends_documentation_fragment:
  - hostnet.llamafactory.docker
  - hostnet.llamafactory.docker.progress
attributes:
  check_mode:
    support: full
    description: Reports whether the image would be pulled; pulls nothing.
  diff_mode:
    support: none
    description: Reports no diff.
  idempotent:
    support: full
    description: With O(pull=not_present) a second run finds the image and changes nothing; with
      O(pull=always) it asks the registry again and reports a change only when the image changed.
  action:
    support: full
    description: Runs through the action plugin of the same name.
  async:
    support: none
    description: Runs its own background pull with its own deadline; do not add C(async).
notes:
  - Needs forks >= the number of nodes for the nodes to pull at the same time.
"""

EXAMPLES = r"""
- name: Pull the training image from Artifact Registry, at most 40 minutes
  hostnet.llamafactory.image_pull:
    name: us-docker.pkg.dev/my-project/train/llamafactory:0.9.5
    username: oauth2accesstoken
    password: "{{ lookup('ansible.builtin.pipe', 'gcloud auth print-access-token') }}"
    timeout: 2400
  become: true
"""

RETURN = r"""
image_id:
  description: The image's ID on the node after the pull.
  returned: success
  type: str
  sample: sha256:3f1b2c0d9e8a7f6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b
state:
  description: V(present) (nothing to pull), V(pulled), or while running V(pulling).
  returned: always
  type: str
  sample: pulled
progress:
  description: Bytes downloaded and known, layers done and seen, at the end of the pull.
  returned: when pulled
  type: dict
  sample: {downloaded: 2100000000, total: 2100000000, layers: 9, layers_done: 9}
elapsed:
  description: Seconds the pull took.
  returned: when pulled
  type: float
  sample: 55.2
credentials:
  description: Where the credentials came from (module arguments, the node's docker config,
    anonymous); never the credentials themselves.
  returned: when pulled
  type: str
  sample: arguments
"""

import hashlib
import json
import os
import pwd
import signal
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _image_pull as pull
from ansible_collections.hostnet.llamafactory.plugins.module_utils._docker_api import (
    OPTIONS as DOCKER_OPTIONS,
)
from ansible_collections.hostnet.llamafactory.plugins.module_utils._docker_api import (
    DockerAPI,
    DockerError,
)

RECORDS = "/run/hostnet-llamafactory/pulls"
GRACE_S = 60


def record_path(name):
    return os.path.join(RECORDS, hashlib.sha256(name.encode("utf-8")).hexdigest()[:20] + ".json")


def read_record(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (IOError, OSError, ValueError):
        return None


def write_record(path, record):
    record["updated"] = time.time()
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".pull.")
    with os.fdopen(fd, "w") as handle:
        json.dump(record, handle)
    os.rename(temporary, path)


def alive(pid):
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError):
        return False
    # A zombie is not alive; /proc says so on Linux.
    try:
        with open("/proc/%d/stat" % int(pid)) as handle:
            return handle.read().split(") ", 1)[1][:1] != "Z"
    except (IOError, OSError, IndexError):
        return True


def node_auth(module, registry):
    params = module.params
    if params["username"]:
        auth = {
            "username": params["username"],
            "password": params["password"] or "",
            "serveraddress": registry,
        }
        return auth, "arguments"
    home = os.environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
    config_dir = os.environ.get("DOCKER_CONFIG") or os.path.join(home, ".docker")
    config = read_record(os.path.join(config_dir, "config.json"))
    return pull.config_auth(
        config,
        registry,
        lambda name, server: pull.credential_helper(module.run_command, name, server),
    )


def work(path, record, docker, auth):
    """The background pull: folds the event stream into the record, rewritten twice a second."""
    progress = pull.PullProgress()
    deadline = record["deadline"]
    record["pid"] = os.getpid()
    write_record(path, record)
    written = 0.0
    try:
        # The action cancels the pull at the deadline; this margin only ends a pull whose
        # controller went away (the daemon cancels a pull whose client disconnects).
        limit = deadline + GRACE_S
        events = pull.pull(docker, record["image"], auth, max(1.0, limit - time.time()))
        for event in events:
            progress.feed(event)
            now = time.time()
            if now - written >= 0.5:
                record.update(progress=progress.snapshot())
                write_record(path, record)
                written = now
            if now > limit:
                raise IOError("no controller cancelled the pull at its deadline")
        record.update(progress=progress.snapshot())
        if progress.error:
            record.update(state="failed", error=progress.error)
        else:
            record.update(state="pulled", image_id=docker.image_id(record["image"]))
    except Exception as exc:  # noqa: BLE001 (reported to the controller, whatever it is)
        record.update(state="failed", error=str(exc) or type(exc).__name__)
    record["ended"] = time.time()
    write_record(path, record)


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


def start(module, params):
    name = params["name"]
    registry = pull.split_reference(name)[0]
    docker = DockerAPI.from_params(params)
    try:
        before = docker.image_id(name)
    except DockerError as exc:
        module.fail_json(msg="cannot ask the Docker daemon about %s: %s" % (name, exc))
    if before and params["pull"] in ("not_present", "never"):
        module.exit_json(changed=False, state="present", image_id=before)
    if params["pull"] == "never":
        module.fail_json(
            msg="%s is not on this node and pull is never (llamafactory_pull): load it "
            "(docker load) or set llamafactory_pull=not_present" % name,
            state="absent",
        )
    if module.check_mode:
        module.exit_json(
            changed=before is None,
            state="present" if before else "absent",
            image_id=before,
            msg="check mode: would pull %s" % name,
        )
    path = record_path(name)
    if not os.path.isdir(RECORDS):
        os.makedirs(RECORDS, 0o700)
    running = read_record(path)
    if running and running.get("state") == "pulling" and alive(running.get("pid")):
        module.exit_json(changed=False, state="pulling", attached=True, record=path)
    try:
        auth, source = node_auth(module, registry)
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    now = time.time()
    record = dict(
        image=name,
        state="pulling",
        before_id=before,
        started=now,
        deadline=now + params["timeout"],
        credentials=source,
        progress={},
    )
    write_record(path, record)
    pid = spawn(lambda: work(path, record, docker, auth))
    module.exit_json(changed=False, state="pulling", record=path, pid=pid, credentials=source)


def poll(module, params):
    path = record_path(params["name"])
    record = read_record(path)
    if not record:
        module.fail_json(msg="no pull of %s was started on this node" % params["name"])
    young = time.time() - record.get("started", 0) < 10  # the worker has not written its PID yet
    pid = record.get("pid")
    lost = not alive(pid) if pid else not young
    if record["state"] == "pulling" and lost:
        time.sleep(0.5)  # it may have written its result just now
        record = read_record(path) or record
        if record["state"] == "pulling":
            record.update(state="failed", error="the background pull ended without a result")
    changed = record["state"] == "pulled" and record.get("image_id") != record.get("before_id")
    module.exit_json(changed=changed, **record)


def cancel(module, params):
    path = record_path(params["name"])
    record = read_record(path) or {}
    stopped = False
    if record.get("state") == "pulling" and alive(record.get("pid")):
        os.kill(int(record["pid"]), signal.SIGTERM)  # the daemon cancels a pull whose client left
        stopped = True
        record.update(state="failed", error="cancelled")
        write_record(path, record)
    module.exit_json(changed=stopped, **record)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            pull=dict(
                type="str", choices=["always", "not_present", "never"], default="not_present"
            ),
            username=dict(type="str"),
            password=dict(type="str", no_log=True),
            timeout=dict(type="int", default=3600),
            interval=dict(type="float", default=2),
            progress_every=dict(type="float", default=30),
            phase=dict(type="str", choices=["start", "poll", "cancel"], default="start"),
            **DOCKER_OPTIONS,
        ),
        required_by={"password": "username"},
        supports_check_mode=True,
    )
    {"start": start, "poll": poll, "cancel": cancel}[module.params["phase"]](module, module.params)


if __name__ == "__main__":
    main()
