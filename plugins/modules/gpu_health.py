#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpu_health
short_description: A GPU node's health - nvidia-smi, the kernel log's Xid errors, DCGM
version_added: 0.1.0
description:
  - Reads, on the node, C(nvidia-smi -q -x) (the C(--query-gpu) CSV when the XML does not
    parse), the kernel log (C(dmesg), else C(journalctl -k)) and, per O(dcgm), the result of
    C(dcgmi diag -r 1), and returns every GPU's state and the findings, each with its level
    (C(error), C(warning), C(note)) and its fix - the GPU count against O(expected_gpus), the
    driver's CUDA version against O(image_cuda), uncorrected ECC errors, a pending or failed row
    remap or page retirement, persistence mode off, Xid errors in the kernel log, a failed DCGM
    test.
  - A node without C(nvidia-smi), or whose C(nvidia-smi) fails or hangs, gets a finding
    (C(nvidia-smi-missing), C(driver-not-loaded), C(nvidia-smi-timeout)) with the fix, not a
    module failure. A kernel log that cannot be read (C(dmesg) not permitted and no readable
    C(journalctl -k)) is reported as unread (finding C(kernel-log-unread)), never as clean - run
    the module with become.
  - Every command is killed at its deadline - C(nvidia-smi) 60 s, the kernel log 30 s, C(dcgmi)
    whatever is left - and all of it ends within O(timeout).
  - The parsers and rules are in C(plugins/module_utils/_gpu_health.py), tested on real
    captures (C(tests/unit/fixtures/gpu_health/SOURCES.md)). Nothing on the node is changed.
author:
  - hostnet.llamafactory contributors (@hostnet)
options:
  expected_gpus:
    description: The GPUs the node must have (finding C(gpu-count) otherwise); unset - no check.
    type: int
  image_cuda:
    description:
      - The CUDA version the job's image is built for (C(12.4)); a driver that supports only an
        older major version is an error, an older minor version a warning. Unset - no check.
    type: str
  dcgm:
    description:
      - Whether to run C(dcgmi diag -r 1) (DCGM's deployment checks, seconds to tens of seconds)
        - V(auto) when C(dcgmi) is installed, V(always) (its absence is an error), V(never).
      - A failed test is an error finding C(dcgm-diag) naming the test; C(dcgmi) without a result
        (no host engine) a warning.
    type: str
    choices: [auto, always, never]
    default: auto
  timeout:
    description: Seconds all of it may take; what is left unrun then is reported as such.
    type: int
    default: 120
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
notes:
  - The preflight (role C(preflight)) runs it on every node with GPUs; its error findings stop
    the launch, warnings and notes are printed.
"""

EXAMPLES = r"""
- name: Check the GPUs of a node that should have 8
  hostnet.llamafactory.gpu_health:
    expected_gpus: 8
    image_cuda: "12.4"
  become: true
  register: health

- name: Stop on an error finding
  ansible.builtin.assert:
    that: health.errors == 0
    fail_msg: "{{ health.findings | selectattr('level', 'eq', 'error') | list }}"
"""

RETURN = r"""
driver_version:
  description: The NVIDIA driver's version; null when nvidia-smi did not answer.
  returned: always
  type: str
  sample: "535.54.03"
cuda_version:
  description: The newest CUDA version the driver supports; null when unknown.
  returned: always
  type: str
  sample: "12.2"
gpus:
  description: Every GPU nvidia-smi lists - C(index), C(pci_bus_id), C(name),
    C(persistence_mode), C(ecc_enabled), C(ecc_uncorrected_volatile),
    C(ecc_uncorrected_aggregate), C(retired_pages), C(retired_pages_pending), C(remap_pending),
    C(remap_failure) (null where the GPU does not report it).
  returned: always
  type: list
  elements: dict
  sample: [{index: 0, pci_bus_id: "00000000:00:1E.0", name: NVIDIA A10G, persistence_mode: false,
            ecc_enabled: true, ecc_uncorrected_volatile: 0, ecc_uncorrected_aggregate: 0,
            retired_pages: null, retired_pages_pending: null, remap_pending: false,
            remap_failure: false}]
findings:
  description: What is wrong - C(level) (error, warning, note), C(id), C(gpu) (its index, null
    for the node), C(detail) and C(fix).
  returned: always
  type: list
  elements: dict
  sample: [{level: error, id: xid-79, gpu: 3, detail: "Xid 79 on 0000:cb:00 (GPU 3): the GPU has
            fallen off the bus", fix: "stop and start the VM so that it moves to another host"}]
errors:
  description: How many of RV(findings) are errors.
  returned: always
  type: int
  sample: 0
kernel_log:
  description: V(read), or V(unread) when neither dmesg nor journalctl -k could be read.
  returned: always
  type: str
  sample: read
dcgm:
  description: V(ran), V(absent) (no dcgmi), V(skipped) (O(dcgm=never), no time left, or no
    working driver) or V(failed) (no result, or past its deadline).
  returned: always
  type: str
  sample: absent
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.hostnet.llamafactory.plugins.module_utils import (
    _gpu_health_host as gpu_health_host,
)


def main():
    module = AnsibleModule(argument_spec=gpu_health_host.OPTIONS, supports_check_mode=True)
    result = gpu_health_host.read(module.get_bin_path, module.params)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
