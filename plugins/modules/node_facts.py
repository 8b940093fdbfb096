#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: node_facts
short_description: A node's facts for a training job - its NIC, Docker host and job - in one call
version_added: 0.1.0
description:
  - Makes, in one round trip, the reads of M(hostnet.llamafactory.primary_nic) (O(nic)),
    M(hostnet.llamafactory.docker_host_facts) (O(docker_host)) and
    M(hostnet.llamafactory.job_status) without a stop (O(job)), each only when asked, and sets
    them as facts, as M(ansible.builtin.setup) sets C(ansible_facts) - C(primary_nic),
    C(docker_host) and C(job_state).
  - The roles that come after it read those facts by name instead of calling the node again;
    C(docker_host) and C(job_state) each say what was read (C(read)), so that a role asks the node
    itself when it needs more. A role that changes the node reads again what it changed
    (docker_engine - M(hostnet.llamafactory.docker_host_facts), which sets C(docker_host) too).
    C(job_state) carries C(docker_since), when Docker's unit was last started as C(docker_host)
    saw it - a job state read before Docker was restarted is not taken for the present one.
  - Why a module of its own - Ansible runs one module per task; the three reads belong to three
    roles (discover_network, docker_engine, launch) that run in that order, and a re-run is made
    of these round trips (docs/benchmarks.md).
author:
  - hostnet.llamafactory contributors (@hostnet)
options:
  nic:
    description:
      - The options of M(hostnet.llamafactory.primary_nic) (without C(fact)); the NIC found is
        also the fact C(primary_nic).
    type: dict
    suboptions:
      peer:
        description: Address (or name) the node must reach, normally MASTER_ADDR.
        type: str
      interface:
        description: Use this interface, after checking that it exists, is up and has an IPv4
          address.
        type: str
      exclude:
        description: Interface name patterns never chosen without O(nic.interface).
        type: list
        elements: str
        default: [lo, docker*, br-*, veth*, virbr*, cni*, flannel*, cali*, vxlan*, cilium*,
                  kube-*, weave*, tun*, tap*, wg*]
      include_tunnels:
        description: Allow tunnel interfaces (C(tun*), C(tap*), C(wg*)).
        type: bool
        default: false
      gcp_metadata:
        description: Whether to ask the GCE metadata server (see primary_nic).
        type: str
        choices: [auto, always, never]
        default: auto
      metadata_url:
        description: Base URL of the metadata server's v1 API.
        type: str
        default: http://metadata.google.internal/computeMetadata/v1
      metadata_timeout:
        description: Seconds to wait for each metadata request.
        type: float
        default: 2.0
      network_profile:
        description: The NCCL transport to find the NICs for (see primary_nic).
        type: str
        choices: [auto, socket, tcpxo, gib]
        default: auto
      pci_slots_from_names:
        description: Give each NIC without a PCI device the PCI address its systemd name encodes
          (C(enp6s0) is C(0000:06:00.0)) - the local cluster's veth NICs, which stand in for a GPU
          VM's NICs that GCP's scripts find by PCI address; see primary_nic. Off on GCP.
        type: bool
        default: false
  docker_host:
    description: The options of M(hostnet.llamafactory.docker_host_facts); its defaults here are
      what the docker_engine role reads with its own defaults.
    type: dict
    suboptions:
      packages:
        description: Debian package names to look up.
        type: list
        elements: str
        default: [ca-certificates, gnupg, python3-requests, docker.io, docker-ce, docker-ce-cli,
                  containerd.io]
      service:
        description: A systemd unit whose state to read.
        type: str
        default: docker
      daemon_json:
        description: A file to read as text, with its owner, group and mode.
        type: path
        default: /etc/docker/daemon.json
      pending_marker:
        description: A file whose existence to report.
        type: path
        default: /etc/docker/.hostnet-llamafactory-restart-pending
      dockerd:
        description: Read the dockerd version.
        type: bool
        default: true
  job:
    description:
      - The options of M(hostnet.llamafactory.job_status) that read (no C(stop), no C(labels)).
      - A Docker daemon that does not answer (not installed yet) is not an error here -
        C(job_state) is null and RV(job_error) says why.
    type: dict
    suboptions:
      name:
        description: The container's name.
        type: str
        required: true
      output_dir:
        description: The job's output folder on the node.
        type: path
      agent_state:
        description: The state file of the rank's agent.
        type: path
      record:
        description: The finished job's record (see job_status).
        type: path
      tail:
        description: How many of the newest log lines to return.
        type: int
        default: 40
      docker_socket:
        description: The Docker daemon's unix socket on the node.
        type: path
        default: /var/run/docker.sock
      docker_timeout:
        description: Seconds one Engine API call may wait for the daemon.
        type: int
        default: 60
      image:
        description:
          - An image whose local ID to read with the job (C(job_state.image_id), null when the
            daemon lacks it) - a launch then pulls only where the image is missing.
        type: str
attributes:
  check_mode:
    support: full
    description: Only reads.
  diff_mode:
    support: none
    description: Reports no diff.
  idempotent:
    support: full
    description: Only reads.
notes:
  - The task usually needs C(become) when O(docker_host) or O(job) is given (the Docker daemon's
    socket, daemon.json).
  - With a persistent fact cache (C(fact_caching) other than memory) the facts outlive the run;
    the collection's playbooks gather them again at every run before any role reads them.
"""

EXAMPLES = r"""
- name: Find the NIC towards MASTER_ADDR, and read the Docker host and the job in the same call
  hostnet.llamafactory.node_facts:
    nic:
      peer: 10.128.0.2
      gcp_metadata: never
    docker_host: {}
    job:
      name: llamafactory-demo
      output_dir: /srv/llamafactory/jobs/demo/output
      tail: 5
  become: true

- name: Later, a role reads them by name
  ansible.builtin.debug:
    msg: >-
      {{ primary_nic.interface }}, Docker {{ docker_host.dockerd_version }},
      job {{ job_state.container.state }}
"""

RETURN = r"""
job_error:
  description: Why C(job_state) is null although O(job) was given.
  returned: always
  type: str
  sample: "cannot query container llamafactory-demo: [Errno 2] No such file or directory"
ansible_facts:
  description: The facts set, each only when asked.
  returned: always
  type: dict
  contains:
    primary_nic:
      description: What M(hostnet.llamafactory.primary_nic) returns.
      type: dict
    docker_host:
      description: What M(hostnet.llamafactory.docker_host_facts) returns, and C(read) - the
        options it was read with.
      type: dict
    job_state:
      description: What M(hostnet.llamafactory.job_status) returns (without C(labels_match)),
        C(read) - the options it was read with - and C(docker_since) (C(docker_host.service.since)
        of the same call), and C(image_id) when O(job.image) is given; null when the Docker
        daemon did not answer.
      type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _docker_host as host
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _job_status as job_status
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _nic_host as nic_host
from ansible_collections.hostnet.llamafactory.plugins.module_utils._docker_api import (
    DockerAPI,
    DockerError,
)
from ansible_collections.hostnet.llamafactory.plugins.module_utils._nic import NicError

DOCKER_HOST_OPTIONS = dict(
    host.OPTIONS,
    packages=dict(type="list", elements="str", default=list(host.DOCKER_ENGINE_PACKAGES)),
    service=dict(type="str", default="docker"),
    daemon_json=dict(type="path", default="/etc/docker/daemon.json"),
    pending_marker=dict(type="path", default=host.DOCKER_ENGINE_PENDING_MARKER),
    dockerd=dict(type="bool", default=True),
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nic=dict(type="dict", options=nic_host.OPTIONS),
            docker_host=dict(type="dict", options=DOCKER_HOST_OPTIONS),
            job=dict(type="dict", options=dict(job_status.OPTIONS, image=dict(type="str"))),
        ),
        supports_check_mode=True,
    )
    params = module.params
    facts = {}
    result = dict(changed=False, job_error=None)
    if params["nic"] is not None:
        try:
            facts["primary_nic"] = nic_host.discover(module, params["nic"])
        except NicError as exc:
            module.fail_json(msg=str(exc))
        for warning in facts["primary_nic"]["warnings_found"]:
            module.warn(warning)
    if params["docker_host"] is not None:
        try:
            facts["docker_host"] = host.read(module, params["docker_host"])
        except host.HostReadError as exc:
            module.fail_json(msg=str(exc))
        facts["docker_host"].pop("changed", None)
        facts["docker_host"]["read"] = params["docker_host"]
    if params["job"] is not None:
        read = params["job"]
        docker = DockerAPI.from_params(read)
        try:
            state = job_status.read(docker, read, module.check_mode)
            if read["image"]:
                state["image_id"] = docker.image_id(read["image"])
        except DockerError as exc:
            facts["job_state"] = None
            result["job_error"] = "cannot query container %s: %s" % (read["name"], exc)
        else:
            state.pop("labels_match", None)
            state.pop("changed", None)
            service = (facts.get("docker_host") or {}).get("service") or {}
            state.update(read=read, docker_since=service.get("since"))
            facts["job_state"] = state
    module.exit_json(ansible_facts=facts, **result)


if __name__ == "__main__":
    main()
