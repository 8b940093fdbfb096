#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: primary_nic
short_description: Find the NIC that NCCL and Gloo must use, and the settings that go with it
version_added: 0.1.0
description:
  - Finds the network interface that carries a node's training traffic and returns it with the
    C(NCCL_SOCKET_IFNAME), C(GLOO_SOCKET_IFNAME) and C(NCCL_IB_DISABLE) values for it. It is
    also set as the fact C(primary_nic).
  - "The choice, in order: O(interface) when given (it must exist and be up); else the interface
    the kernel routes O(peer) through (C(ip route get PEER)); else, on a GCE VM, the NIC whose MAC
    the metadata server gives for nic0; else the interface of the IPv4 default route."
  - "How MASTER_ADDR is found with it: rank 0 runs it without O(peer) (GCE metadata on GCP, else
    C(llamafactory_master_interface) as O(interface), else its default route) and its address
    becomes MASTER_ADDR; every other rank runs it with O(peer=MASTER_ADDR); rank 0 then checks
    back with O(peer) set to rank 1's address. An asymmetric answer means the nodes do not talk
    over one network: set the interface."
  - Virtual interfaces are excluded by name (O(exclude)), not by driver, since on some hosts
    (containers, some clouds) real NICs are veth devices underneath.
  - Why not C(ansible.builtin.setup)'s C(ansible_default_ipv4) - it follows the route to
    8.8.8.8, which can leave through a VPN or a second NIC, and knows neither the peers nor GCE
    metadata nor the NCCL settings.
  - Read-only; runs C(ip -j) and reads C(/sys/class/net). Needs iproute2 with JSON output.
author:
  - hostnet.llamafactory contributors (@hostnet)
options:
  peer:
    description:
      - Address (or name) the node must reach, normally MASTER_ADDR. The NIC is the one the
        kernel routes it through.
    type: str
  interface:
    description:
      - Use this interface, after checking that it exists, is up and has an IPv4 address.
    type: str
  exclude:
    description:
      - Interface name patterns (shell globs) never chosen without O(interface).
    type: list
    elements: str
    default: [lo, docker*, br-*, veth*, virbr*, cni*, flannel*, cali*, vxlan*, cilium*, kube-*,
              weave*, tun*, tap*, wg*]
  include_tunnels:
    description:
      - Allow tunnel interfaces (C(tun*), C(tap*), C(wg*)), for nodes that really talk over a VPN.
    type: bool
    default: false
  gcp_metadata:
    description:
      - V(auto) asks the GCE metadata server for nic0's IP and MAC only on a GCE VM (DMI product
        name C(Google Compute Engine)) and only when neither O(peer) nor O(interface) is given;
        elsewhere nothing is sent.
      - V(always) asks it in any case and fails when it does not answer; V(never) does not ask.
    type: str
    choices: [auto, always, never]
    default: auto
  metadata_url:
    description:
      - Base URL of the metadata server's v1 API.
    type: str
    default: http://metadata.google.internal/computeMetadata/v1
  metadata_timeout:
    description:
      - Seconds to wait for each metadata request.
    type: float
    default: 2.0
  network_profile:
    description:
      - The NCCL transport to find the NICs for (see RV(network_profile)). V(auto) takes it from
        the machine type, which it asks the GCE metadata server for, also to check a V(tcpxo) or
        V(gib) that is set (on a GCE VM, or anywhere with O(gcp_metadata=always); never with
        O(gcp_metadata=never)); machine types without
        GPU NICs, and hosts whose machine type is unknown, get V(socket).
      - V(tcpxo) (GPUDirect-TCPXO, A3 High and A3 Mega) and V(gib) (RDMA with Google's gIB
        plugin, A3 Ultra and A4) also find the control and GPU NICs, as Google's scripts do (by
        PCI address, then by name; RDMA NICs by their RDMA device).
    type: str
    choices: [auto, socket, tcpxo, gib]
    default: auto
  pci_slots_from_names:
    description:
      - Give each NIC that has no PCI device in sysfs the PCI address its systemd predictable
        name encodes - C(enp<bus>s<slot>) or C(enp<bus>s<slot>f<function>), decimal numbers, as
        C(DOMAIN:BUS:SLOT.FUNCTION) in hex (C(enp6s0) is C(0000:06:00.0), C(enp0s12)
        C(0000:00:0c.0), C(enp192s20) C(0000:c0:14.0)); names of other shapes (C(gpu0rdma0),
        C(eth0), C(ens4)) get none, and a NIC with a PCI device always keeps its own address.
      - Only for the local cluster (tools/localcluster; role llamafactory's
        C(llamafactory_local_cluster)), whose VMs' NICs are veth pairs without PCI devices,
        named as the GPU VM's NICs they stand in for. GCP's scripts find a GPU VM's NICs by PCI
        address, and on GCP the NICs' systemd names encode the addresses they have. Leave it off
        on GCP.
    type: bool
    default: false
  fact:
    description:
      - Set the fact C(primary_nic) to the result. Turn it off for a check that must not replace
        the node's own choice (rank 0's route back to rank 1).
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    description: Read-only; runs the same in check mode.
  diff_mode:
    support: none
    description: Changes nothing, so there is no diff.
  idempotent:
    support: full
    description: Read-only; a second run reports the same NIC when the network did not change.
  facts:
    support: full
    description: Sets the fact C(primary_nic) to the module's result (unless O(fact=false)).
notes:
  - The machine types, recipes and values of the profiles, with their sources, are in
    C(plugins/module_utils/_network_profile.py).
seealso:
  - name: NCCL environment variables
    description: NCCL_SOCKET_IFNAME and NCCL_IB_DISABLE.
    link: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html
"""

EXAMPLES = r"""
- name: Rank 0 finds its own training NIC (GCE metadata on GCP, else the default route)
  hostnet.llamafactory.primary_nic:
  register: master_nic

- name: Every other rank finds the NIC that reaches the master
  hostnet.llamafactory.primary_nic:
    peer: "{{ hostvars[groups['llamafactory'][0]].primary_nic.address }}"

- name: Use a given NIC (it must exist, be up and have IPv4)
  hostnet.llamafactory.primary_nic:
    interface: enp0s12
"""

RETURN = r"""
interface:
  description: The chosen interface.
  returned: success
  type: str
  sample: ens4
address:
  description: Its IPv4 address (the source address towards O(peer) when given).
  returned: success
  type: str
  sample: 10.128.0.5
prefix:
  description: The address's prefix length.
  returned: success
  type: int
  sample: 32
network:
  description: The address's network in CIDR form.
  returned: success
  type: str
  sample: 10.128.0.5/32
mtu:
  description: The interface's MTU.
  returned: success
  type: int
  sample: 1460
mac:
  description: The interface's MAC address.
  returned: success
  type: str
  sample: 42:01:0a:80:00:05
driver:
  description: The kernel driver of the interface's device, when it has one.
  returned: success
  type: str
  sample: gve
speed_mbps:
  description: Link speed in Mb/s, when the driver reports it.
  returned: success
  type: int
  sample: 100000
method:
  description: How the interface was chosen.
  returned: success
  type: str
  sample: peer route
  choices: [override, peer route, metadata, default route, sole candidate]
private:
  description: Whether the address is private (RFC 1918, 100.64.0.0/10 or 198.18.0.0/15).
  returned: success
  type: bool
  sample: true
default_route_interface:
  description: The interface of the IPv4 default route (what C(ansible_default_ipv4) shows).
  returned: success
  type: str
  sample: ens4
gce:
  description: Whether the host is a GCE VM (by DMI product name).
  returned: success
  type: bool
  sample: true
metadata:
  description:
    - What the metadata server said of nic0 (C(ip), C(mac)) or C(error); null when not asked.
  returned: success
  type: dict
  sample: {ip: 10.128.0.5, mac: "42:01:0a:80:00:05"}
peer:
  description: The peer address that was routed, after name resolution.
  returned: success
  type: str
  sample: 10.128.0.6
candidates:
  description:
    - Every interface, with its IPv4 addresses and why it was not chosen (null for the chosen one).
  returned: success
  type: list
  elements: dict
  sample:
    - name: docker0
      ipv4: [172.17.0.1/16]
      rejected: excluded by name (virtual, bridge or tunnel interface)
infiniband:
  description: InfiniBand/RDMA devices present (C(/sys/class/infiniband)).
  returned: success
  type: list
  elements: str
  sample: [mlx5_0]
nccl_env:
  description: Environment for the training processes.
  returned: success
  type: dict
  sample: {NCCL_SOCKET_IFNAME: "=ens4", GLOO_SOCKET_IFNAME: ens4, NCCL_IB_DISABLE: "1"}
network_profile:
  description:
    - The node's NCCL transport and what its ranks need. C(profile) (V(socket), V(tcpxo) or
      V(gib)) and C(why) (V(set) or the machine type), C(machine_type) (null when unknown),
      C(control) and C(gpu) (the NICs found; empty for V(socket)), C(candidates) (every NIC
      with its C(role) and C(reason)), C(problems) (C(id), C(detail); the GPU NICs' count, MTU
      and state; C(gpu-nics-missing) when V(auto) fell back to V(socket)) and C(setup)
      (C(env), C(env_script) to source before it, C(library_path), C(volumes), C(devices), and
      C(paths) - the files and devices the node needs for them).
  returned: success
  type: dict
  sample:
    profile: socket
    why: machine type n2-standard-4 has no GPU NICs
    machine_type: n2-standard-4
    control: []
    gpu: []
    candidates: []
    problems: []
    setup:
      env: {NCCL_SOCKET_IFNAME: "=ens4", GLOO_SOCKET_IFNAME: ens4}
      env_script: null
      library_path: []
      volumes: []
      devices: []
      paths: []
warnings_found:
  description: Disagreements noticed (metadata versus route); also shown as warnings.
  returned: success
  type: list
  elements: str
  sample: ["the default route uses ens5, GCE metadata names ens4 as nic0; using ens4"]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _nic_host as nic_host
from ansible_collections.hostnet.llamafactory.plugins.module_utils._nic import NicError


def main():
    module = AnsibleModule(
        argument_spec=dict(nic_host.OPTIONS, fact=dict(type="bool", default=True)),
        supports_check_mode=True,
    )
    try:
        result = nic_host.discover(module, module.params)
    except NicError as exc:
        module.fail_json(msg=str(exc))
    for warning in result["warnings_found"]:
        module.warn(warning)
    facts = {"primary_nic": result} if module.params["fact"] else {}
    module.exit_json(changed=False, ansible_facts=facts, **result)


if __name__ == "__main__":
    main()
