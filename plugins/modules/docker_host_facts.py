#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: docker_host_facts
short_description: Read what the docker_engine role checks on a host, in one call
version_added: 0.1.0
description:
  - Returns the operating system (C(/etc/os-release)) and what is asked - which of
    O(packages) are installed (C(dpkg-query)), the state of the systemd unit O(service)
    (C(systemctl show)), the text of O(daemon_json), whether O(pending_marker) exists, and the
    dockerd version (O(dockerd)).
  - Why not M(ansible.builtin.package_facts), M(ansible.builtin.slurp),
    M(ansible.builtin.stat) and M(ansible.builtin.command) - they answer the same questions in
    one round trip each, and a re-run of the collection's playbooks asks them of every node; one
    call per node instead of five is what a re-run's time is made of (docs/benchmarks.md, the
    task profile). The operating system it returns spares the role a fact gathering (one more
    round trip). Nothing is changed on the host.
  - Without C(dpkg-query) (not a Debian-family host) RV(missing) is null instead of a failure;
    the role names the unsupported system from RV(os).
author:
  - hostnet.llamafactory contributors (@hostnet)
options:
  packages:
    description: Debian package names to look up.
    type: list
    elements: str
    default: []
  service:
    description: A systemd unit whose state to read (its C(.service) suffix optional).
    type: str
  daemon_json:
    description: A file to read as text (Docker's C(daemon.json)), with its owner, group and mode;
      absent - RV(daemon_json) and RV(daemon_json_attributes) are null.
    type: path
  pending_marker:
    description: A file whose existence to report (RV(pending)).
    type: path
  dockerd:
    description:
      - Read the dockerd version - from the dpkg version of the package of O(packages) that
        installed the C(dockerd) on the PATH, else from C(dockerd --version) (starting the
        binary costs the node more CPU than the rest of this module's reads together).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Reads only; runs the same in check mode.
  diff_mode:
    support: none
    description: Changes nothing.
  idempotent:
    support: full
    description: Reads only.
"""

EXAMPLES = r"""
- name: Look at the host
  hostnet.llamafactory.docker_host_facts:
    packages: [docker.io, python3-requests]
    service: docker
    daemon_json: /etc/docker/daemon.json
    pending_marker: /var/lib/hostnet-llamafactory/docker-restart-pending
    dockerd: true
  register: host
"""

RETURN = r"""
ansible_facts:
  description: C(docker_host) - everything below, and C(read) (the options it was read with). The
    docker_engine role reads this fact (set by M(hostnet.llamafactory.node_facts) at the start of
    the collection's playbooks) and calls this module to read it again after it changed the host.
  returned: always
  type: dict
os:
  description: The operating system - C(family) (Debian for Debian and its derivatives),
    C(distribution) (ID), C(version) (VERSION_ID), C(release) (VERSION_CODENAME),
    C(architecture) (uname -m) and C(name) (PRETTY_NAME).
  returned: always
  type: dict
  sample: {family: Debian, distribution: debian, version: "12", release: bookworm,
           architecture: x86_64, name: "Debian GNU/Linux 12 (bookworm)"}
packages:
  description: The installed ones of O(packages), with their versions.
  returned: always
  type: dict
  sample: {docker.io: "20.10.24+dfsg1-1+deb12u1+b6"}
missing:
  description: The ones of O(packages) that are not installed, in the order asked; null on a
    host without C(dpkg-query).
  returned: always
  type: list
  elements: str
  sample: [python3-requests]
service:
  description: The unit's state - C(loaded), C(active), C(enabled) (bools), C(state)
    (systemd's ActiveState) and C(since) (when it last became active, microseconds of the monotonic
    clock - another value means it was started again; null while it never was); null without
    O(service).
  returned: always
  type: dict
  sample: {loaded: true, active: true, enabled: true, state: active, since: "5421873361"}
daemon_json:
  description: The text of O(daemon_json); null when it does not exist.
  returned: always
  type: str
daemon_json_attributes:
  description: The owner and group (names, else ids) and the mode (4 octal digits) of
    O(daemon_json), to compare with what the file should have without another round trip;
    null when it does not exist.
  returned: always
  type: dict
  sample: {owner: root, group: root, mode: "0644"}
pending:
  description: Whether O(pending_marker) exists.
  returned: always
  type: bool
dockerd_version:
  description: The dockerd version (major.minor.patch); null when O(dockerd) is false or dockerd
    is missing.
  returned: always
  type: str
  sample: 20.10.24
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _docker_host as host


def main():
    module = AnsibleModule(
        argument_spec=dict(host.OPTIONS),
        supports_check_mode=True,
    )
    try:
        result = host.read(module, module.params)
    except host.HostReadError as exc:
        module.fail_json(msg=str(exc))
    fact = dict((k, v) for k, v in result.items() if k != "changed")
    result["ansible_facts"] = {"docker_host": dict(fact, read=module.params)}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
