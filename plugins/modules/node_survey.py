#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: node_survey
short_description: A node's NIC, Docker host and training job, read in one call
version_added: 0.1.0
description:
  - Makes, in one round trip, the reads of M(hostnet.llamafactory.primary_nic) (O(nic)),
    M(hostnet.llamafactory.docker_host_facts) (O(docker_host)) and
    M(hostnet.llamafactory.job_status) without a stop (O(job)), each only when asked, and returns
    each as that module would.
  - The answers are kept in the fact C(node_survey) with the question each answered. The modules
    docker_host_facts and job_status, given that fact as their C(survey) option, return the answer
    when the survey asked the same question in this playbook run, without contacting the node. A
    re-run then costs one module call per node for the three reads instead of three (each call
    costs the node about 0.15 s of CPU before it reads anything; see docs/benchmarks.md).
  - The fact is only as fresh as the node. Whatever changes the node's Docker afterwards (the
    docker_engine role's install and restart) drops it, and a rank's state is read again after a
    restart of the job.
  - Why a module of its own - Ansible runs one module per task; the three reads belong to three
    roles (discover_network, docker_engine, launch) that run in that order, and only the first
    one's call can carry the others.
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
    description: The options of M(hostnet.llamafactory.docker_host_facts).
    type: dict
    suboptions:
      packages:
        description: Debian package names to look up.
        type: list
        elements: str
        default: []
      service:
        description: A systemd unit whose state to read.
        type: str
      daemon_json:
        description: A file to read as text, with its owner, group and mode.
        type: path
      pending_marker:
        description: A file whose existence to report.
        type: path
      dockerd:
        description: Read the dockerd version.
        type: bool
        default: false
  job:
    description:
      - The options of M(hostnet.llamafactory.job_status) that read (no C(stop); C(labels) are
        matched by job_status when it takes the answer, from the container's labels returned
        here).
      - A Docker daemon that does not answer (not installed yet) is not an error here -
        RV(job) is null and RV(job_error) says why.
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
  action:
    support: full
    description: The action plugin marks the fact with this playbook run, so that a fact kept
      by a fact cache from an earlier run is never taken for an answer.
notes:
  - The task usually needs C(become) when O(job) is given (the Docker daemon's socket).
"""

EXAMPLES = r"""
- name: Find the NIC towards MASTER_ADDR, and read the Docker host and the job in the same call
  hostnet.llamafactory.node_survey:
    nic:
      peer: 10.128.0.2
      gcp_metadata: never
    docker_host:
      packages: [docker.io]
      service: docker
      daemon_json: /etc/docker/daemon.json
    job:
      name: llamafactory-demo
      output_dir: /srv/llamafactory/jobs/demo/output
      tail: 5
  become: true

- name: Later, the same read of the Docker host answered from the survey
  hostnet.llamafactory.docker_host_facts:
    packages: [docker.io]
    service: docker
    daemon_json: /etc/docker/daemon.json
    survey: "{{ node_survey | default(omit) }}"
  register: host
"""

RETURN = r"""
nic:
  description: What M(hostnet.llamafactory.primary_nic) returns; null when O(nic) is not given.
  returned: always
  type: dict
docker_host:
  description: What M(hostnet.llamafactory.docker_host_facts) returns; null when O(docker_host)
    is not given.
  returned: always
  type: dict
job:
  description: What M(hostnet.llamafactory.job_status) returns (C(labels_match) aside); null when
    O(job) is not given or the daemon did not answer.
  returned: always
  type: dict
job_error:
  description: Why RV(job) is null although O(job) was given.
  returned: always
  type: str
  sample: "cannot reach /var/run/docker.sock: [Errno 2] No such file or directory"
ansible_facts:
  description: C(primary_nic) (with O(nic)) and C(node_survey) - for each part read, its
    question (the options after defaults) and answer.
  returned: always
  type: dict
  sample:
    node_survey:
      docker_host: {question: {packages: [docker.io], service: docker}, answer: {missing: []}}
      run: "4242:1796024741"
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


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nic=dict(type="dict", options=nic_host.OPTIONS),
            docker_host=dict(type="dict", options=host.OPTIONS),
            job=dict(type="dict", options=job_status.OPTIONS),
        ),
        supports_check_mode=True,
    )
    params = module.params
    result = dict(changed=False, nic=None, docker_host=None, job=None, job_error=None)
    facts = {}
    survey = {}
    if params["nic"]:
        try:
            result["nic"] = nic_host.discover(module, params["nic"])
        except NicError as exc:
            module.fail_json(msg=str(exc))
        for warning in result["nic"]["warnings_found"]:
            module.warn(warning)
        facts["primary_nic"] = result["nic"]
    if params["docker_host"]:
        try:
            result["docker_host"] = host.read(module, params["docker_host"])
        except host.HostReadError as exc:
            module.fail_json(msg=str(exc))
        survey["docker_host"] = dict(question=params["docker_host"], answer=result["docker_host"])
    if params["job"]:
        question = params["job"]
        docker = DockerAPI(question["docker_socket"], question["docker_timeout"])
        try:
            result["job"] = job_status.read(docker, question, module.check_mode)
        except DockerError as exc:
            result["job_error"] = "cannot query container %s: %s" % (question["name"], exc)
        else:
            survey["job"] = dict(question=question, answer=result["job"])
    facts["node_survey"] = survey
    module.exit_json(ansible_facts=facts, **result)


if __name__ == "__main__":
    main()
