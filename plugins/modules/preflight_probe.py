#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: preflight_probe
short_description: The preflight's probe container on a node - started, then its report read
version_added: 0.1.0
description:
  - O(state=started) replaces any container named O(name) with a new one of O(image) running
    O(command) (the preflight's probe, C(roles/preflight/files/preflight_probe.py probe)) in
    O(network_mode), with O(volumes), O(published_ports), O(device_requests) and O(labels),
    and returns at once. The role runs it on every node before it reads any. O(files) are
    written first (the probe's script, and the job's files when the launch has not written
    them yet), in the same call.
  - O(state=started) also looks on the host for what the probe's container does not show
    (RV(host_checks)) - the O(host_paths) that are missing and the O(rxdm) container - in the
    same call, before anything is written or started; a failed start returns them too. A
    loop of M(ansible.builtin.stat) took a round trip per path and node (a GPU VM of the gib
    profile has a dozen - the plugin's script, its RDMA devices and folders).
  - O(state=collected) signals the probe (SIGUSR1 - every node's probe runs now, a refused
    connection is final), waits at most O(wait) seconds for its JSON report, and removes the
    container - after at most 2 s more when every target answered (it ends as soon as its
    peers reached it), at once when it found a problem (the preflight stops).
  - Rank 0's probe may gather the others' reports (the probe's C(--collect); the others'
    C(--collector) take their go from it) - its read returns them in RV(gathered), and the role
    reads by itself only the nodes rank 0 did not hear from. The probe of a node rank 0 heard
    from ends on its own; the rank's start removes it
    (O(hostnet.llamafactory.job_container#module:remove)).
  - Why not M(community.docker.docker_container) - the preflight ran a listener and a probe
    container per node, started, waited for and removed in four tasks; on 32 nodes with
    Ansible's default forks they were half of the time until a fault was named
    (docs/benchmarks.md). This module takes one light call per node for each step, over the
    collection's own Engine API client (C(plugins/module_utils/_docker_api.py), standard
    library only).
author:
  - hostnet.llamafactory contributors (@hostnet)
options:
  name:
    description: The probe container's name.
    type: str
    required: true
  state:
    description: C(started) - a new probe started; C(collected) - its report read, the
      container removed once it ended.
    type: str
    choices: [started, collected]
    required: true
  image:
    description: The image (the job's; it needs python3). Required with O(state=started).
    type: str
  command:
    description: The probe's command line. Required with O(state=started).
    type: list
    elements: str
  network_mode:
    description: The job's network mode (C(host), or C(bridge) to reproduce its failure).
    type: str
    default: host
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
  device_requests:
    description: GPU requests, as M(community.docker.docker_container) takes them (C(driver),
      C(count), C(device_ids), C(capabilities), C(options)).
    type: list
    elements: dict
    default: []
  labels:
    description: The container's labels.
    type: dict
    default: {}
  files:
    description:
      - With O(state=started), folders and files made before the probe starts, as
        M(hostnet.llamafactory.job_files) makes its O(hostnet.llamafactory.job_files#module:entries)
        (owner and group root, only what differs changed). One wrong as given, or one that
        cannot be made, fails the call and starts nothing.
      - The launch's files come here when nothing before the probe needs them (one round trip
        per node less, docs/benchmarks.md).
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path.
        type: path
        required: true
      state:
        description: C(directory) or C(file).
        type: str
        choices: [directory, file]
        default: file
      content:
        description: The file's text (C(state=file)); or O(files[].content_base64).
        type: str
      content_base64:
        description: The file's bytes, base64-encoded (C(state=file)).
        type: str
      mode:
        description: Octal mode, as a string (C("0640")).
        type: str
        required: true
      json:
        description: Refuse the entry unless its content is valid JSON (nothing is written).
        type: bool
        default: false
  host_paths:
    description: With O(state=started), paths the node must have (the shared mounts, the
      network profile's script, devices and folders); those missing come back in
      RV(host_checks.missing_paths) as given (a missing one fails nothing here - the preflight
      names it).
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path, looked for as C(lstat) finds it (a link is there even when
          dangling).
        type: path
        required: true
      kind:
        description: What the path is for, returned as given (the network profile's
          C(env_script), C(device) or C(volume); none for a shared mount).
        type: str
  rxdm:
    description: With O(state=started), the name of a container to look at on the host
      (TCPXO's receive-datapath-manager) - its state and last 5 log lines in
      RV(host_checks.rxdm).
    type: str
  auto_remove:
    description: With O(state=started), Docker removes the container when it ends (a probe
      whose report rank 0 gathers; one that could not send it stays until it is read).
    type: bool
    default: false
  wait:
    description: With O(state=collected), the most seconds to wait for the report.
    type: int
    default: 30
  tail:
    description: How many of the container's last log lines to return.
    type: int
    default: 20
extends_documentation_fragment:
  - hostnet.llamafactory.docker
attributes:
  check_mode:
    support: full
    description: Writes, starts, signals and removes nothing; C(collected) reads what is there.
  diff_mode:
    support: none
    description: Reports no diff.
  idempotent:
    support: none
    description: Each O(state=started) starts a new probe; it runs only when a launch is due.
"""

EXAMPLES = r"""
- name: Write the probe's script, then start the probe on every node
  hostnet.llamafactory.preflight_probe:
    name: llamafactory-demo-preflight
    state: started
    files:
      - path: /var/lib/llamafactory/jobs/demo/preflight_probe.py
        content: "{{ lookup('ansible.builtin.file', 'preflight_probe.py', rstrip=false) }}"
        mode: "0644"
    image: registry.example/llamafactory:0.9.5
    command: [python3, /probe.py, probe, --name, vm0, --ports, "49949", --expect, "1",
              --bind, 10.128.0.2, --targets,
              '[{"node": "vm1", "address": "10.128.0.3", "port": 49949}]']
    volumes: [/var/lib/llamafactory/jobs/demo/preflight_probe.py:/probe.py:ro]
  become: true

- name: Read every node's report (after every node's probe started)
  hostnet.llamafactory.preflight_probe:
    name: llamafactory-demo-preflight
    state: collected
  become: true
  register: probe
"""

RETURN = r"""
changes:
  description: Each path of O(files) that changed, with what changed (C(create), C(content),
    C(owner), C(mode)).
  returned: state=started
  type: dict
  sample: {/var/lib/llamafactory/jobs/demo/preflight_probe.py: [content]}
host_checks:
  description: What the start looked at on the host. Returned by a failed start too.
  returned: state=started
  type: dict
  sample: {missing_paths: [{path: /mnt/data}], rxdm: null}
  contains:
    missing_paths:
      description: The entries of O(host_paths) not there, as given.
      returned: always
      type: list
      elements: dict
    rxdm:
      description: The container O(rxdm) - C(container), as RV(container), and C(log_lines);
        null when not asked.
      returned: always
      type: dict
report:
  description: The probe's JSON report (every target reached or not, the source address, disk,
    GPUs, packages, listen_error), or null when it printed none (see RV(error)).
  returned: state=collected
  type: dict
error:
  description: Why there is no report (empty when there is one).
  returned: state=collected
  type: str
listener:
  description: The listener as the preflight's findings read it - C(state), C(exit_code),
    C(log_lines) (a port it could not listen on), C(error).
  returned: state=collected
  type: dict
gathered:
  description: The reports rank 0's probe gathered, by node, each shaped as that node's own read
    (RV(report), RV(error), RV(listener), RV(container) C({state - gathered}), RV(log_lines));
    empty when it gathered none.
  returned: state=collected
  type: dict
container:
  description: The container's state when it was read (V(missing) when there was none).
  returned: state=collected
  type: dict
log_lines:
  description: The container's last log lines.
  returned: state=collected
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.hostnet.llamafactory.plugins.module_utils import (
    _job_files as files,
)
from ansible_collections.hostnet.llamafactory.plugins.module_utils import (
    _preflight_probe as probe,
)
from ansible_collections.hostnet.llamafactory.plugins.module_utils._container import (
    OPTIONS as CONTAINER_OPTIONS,
)
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
            name=dict(type="str", required=True),
            state=dict(type="str", choices=["started", "collected"], required=True),
            **CONTAINER_OPTIONS,
            files=dict(type="list", elements="dict", default=[], options=files.ENTRY_OPTIONS),
            host_paths=dict(
                type="list",
                elements="dict",
                default=[],
                options=dict(path=dict(type="path", required=True), kind=dict(type="str")),
            ),
            rxdm=dict(type="str"),
            auto_remove=dict(type="bool", default=False),
            wait=dict(type="int", default=30),
            tail=dict(type="int", default=20),
            **DOCKER_OPTIONS,
        ),
        required_if=[("state", "started", ("image", "command"))],
        supports_check_mode=True,
    )
    params = module.params
    docker = DockerAPI.from_params(params)
    checked = {}
    try:
        if params["state"] == "started":
            checked = dict(host_checks=probe.host_checks(docker, params))
        result = probe.run(docker, params, module.check_mode)
    except files.EntryError as exc:
        module.fail_json(
            msg="preflight probe %s: %s" % (params["name"], exc), changes=exc.changes, **checked
        )
    except DockerError as exc:
        module.fail_json(msg="preflight probe %s: %s" % (params["name"], exc), **checked)
    module.exit_json(**dict(result, **checked))


if __name__ == "__main__":
    main()
