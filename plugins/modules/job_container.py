#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: job_container
short_description: Start a training job's container (a rank) on a node, replacing any of its name
version_added: 0.1.0
description:
  - Removes any container named O(name) (killed if it runs), creates one of O(image) running
    O(command) with the options below, named as M(community.docker.docker_container) names
    them, and starts it detached - what C(docker run -d) does, and what that module does with
    C(recreate=true) and C(state=started).
  - O(env_file) is read on the node as C(docker run --env-file) reads it; its values go to the
    daemon, never to the controller.
  - Why not M(community.docker.docker_container) - the launch starts one container per node
    that it always replaces (the ranks were stopped before, and the job's digest label says
    whether a re-run keeps them); that module's comparison of every option costs its calls and
    its large payload on each node, 12 s of a 32-node launch with Ansible's default forks
    against 7 s for this module (docs/benchmarks.md). It uses the collection's own Engine API
    client (C(plugins/module_utils/_docker_api.py), standard library only).
author:
  - hostnet.llamafactory contributors (@hostnet)
options:
  name:
    description: The container's name.
    type: str
    required: true
  image:
    description: The image; the daemon must have it (the launch pulled it).
    type: str
    required: true
  command:
    description: The command line.
    type: list
    elements: str
    required: true
  working_dir:
    description: The working folder inside the container.
    type: str
  network_mode:
    description: The network mode (C(host), or C(bridge)).
    type: str
    default: host
  ipc_mode:
    description: The IPC mode (C(host) lets the ranks share memory as NCCL expects).
    type: str
  env_file:
    description: An env file on the node (C(KEY=VALUE) lines).
    type: path
  volumes:
    description: Binds, C(SOURCE:DEST[:ro]).
    type: list
    elements: str
    default: []
  published_ports:
    description: Ports published on the host, C(HOST:CONTAINER) (bridge networking).
    type: list
    elements: str
    default: []
  ulimits:
    description: Limits, C(NAME:SOFT:HARD) (C(-1) for unlimited).
    type: list
    elements: str
    default: []
  device_requests:
    description: GPU requests, as M(community.docker.docker_container) takes them (C(driver),
      C(count), C(device_ids), C(capabilities), C(options)).
    type: list
    elements: dict
    default: []
  devices:
    description: Host devices, C(HOST[:CONTAINER][:PERMISSIONS]).
    type: list
    elements: str
    default: []
  labels:
    description: The container's labels.
    type: dict
    default: {}
  script:
    description:
      - Also write this container's C(docker run) here (mode 0750, owned by root), to start the
        same container by hand - written from the options above as the container is started,
        and only where its content differs (the rest of the job's files are written before,
        by M(hostnet.llamafactory.job_files) or the preflight's probe).
    type: path
  remove:
    description: Other containers removed first, where there are any (the preflight's probe,
      ended on this node after rank 0 read its report), in the same call.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - hostnet.llamafactory.docker
attributes:
  check_mode:
    support: full
    description: Reports the change; removes, creates and starts nothing.
  diff_mode:
    support: none
    description: Reports no diff.
  idempotent:
    support: none
    description: Always replaces the container; the caller decides whether a start is due.
"""

EXAMPLES = r"""
- name: Start the rank
  hostnet.llamafactory.job_container:
    name: llamafactory-demo
    image: registry.example/llamafactory:0.9.5
    command: [llamafactory-cli, train, /var/lib/llamafactory/jobs/demo/config.yaml]
    working_dir: /var/lib/llamafactory/jobs/demo
    ipc_mode: host
    env_file: /var/lib/llamafactory/jobs/demo/env
    volumes: [/var/lib/llamafactory/jobs/demo:/var/lib/llamafactory/jobs/demo]
    ulimits: ["memlock:-1:-1"]
    device_requests: [{driver: nvidia, count: -1, capabilities: [[gpu]]}]
    labels: {hostnet.llamafactory.job: demo}
    script: /var/lib/llamafactory/jobs/demo/launch.sh
  become: true
"""

RETURN = r"""
container_id:
  description: The new container's ID (null in check mode).
  returned: always
  type: str
script_changed:
  description: Whether O(script) was written (or would be, in check mode).
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _container as container
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _job_files as files
from ansible_collections.hostnet.llamafactory.plugins.module_utils._docker_api import (
    OPTIONS as DOCKER_OPTIONS,
)
from ansible_collections.hostnet.llamafactory.plugins.module_utils._docker_api import (
    DockerAPI,
    DockerError,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            container.OPTIONS,
            name=dict(type="str", required=True),
            image=dict(type="str", required=True),
            command=dict(type="list", elements="str", required=True),
            working_dir=dict(type="str"),
            ipc_mode=dict(type="str"),
            env_file=dict(type="path"),
            ulimits=dict(type="list", elements="str", default=[]),
            devices=dict(type="list", elements="str", default=[]),
            script=dict(type="path"),
            remove=dict(type="list", elements="str", default=[]),
            **DOCKER_OPTIONS,
        ),
        supports_check_mode=True,
    )
    params = module.params
    env = None
    try:
        if params["env_file"]:
            with open(params["env_file"], encoding="utf-8") as handle:
                env = container.env_file_lines(handle.read())
        body = container.create_body(params, env)
        script = {}
        if params["script"]:
            entry = dict(
                path=params["script"],
                state="file",
                content=container.docker_run_script(params["name"], params),
                content_base64=None,
                mode="0750",
                json=False,
            )
            script = files.write([entry], "root", "root", module.check_mode)
    except (IOError, OSError, container.ContainerSpecError, files.EntryError) as exc:
        module.fail_json(msg="container %s: %s" % (params["name"], exc))
    if module.check_mode:
        module.exit_json(changed=True, container_id=None, script_changed=bool(script))
    try:
        docker = DockerAPI.from_params(params)
        for other in params["remove"]:
            docker.remove_container(other)
        found = container.replace(docker, params["name"], body)
    except DockerError as exc:
        module.fail_json(msg="container %s: %s" % (params["name"], exc))
    module.exit_json(changed=True, container_id=found, script_changed=bool(script))


if __name__ == "__main__":
    main()
