#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: job_results
short_description: Bring a finished job's results to the controller, in one round trip
version_added: 0.1.0
description:
  - On the node, lists the files of O(output_dir) whose names match O(patterns) (the adapter)
    and reads O(files); on the controller, writes to O(dest) the ones of O(files) whose content
    differs from the copy already there (SHA-256), and the list of the adapter's files as
    O(listing).
  - Why not M(ansible.builtin.find), M(ansible.builtin.file), M(ansible.builtin.fetch) and
    M(ansible.builtin.copy) - they take a round trip per file and per step (five or more); the
    playbook's re-run of a finished job does this on every run, and one call is what its time
    is made of (docs/benchmarks.md, the task profile). A file that is already on the controller
    crosses the network only as its checksum.
author:
  - hostnet.llamafactory contributors (@hostnet)
options:
  output_dir:
    description: The job's output folder on the node.
    type: path
    required: true
  dest:
    description: The folder on the controller for the results (created, mode 0755).
    type: path
    required: true
  files:
    description: Names of files in O(output_dir) to bring to O(dest); the ones missing on the
      node are left out (RV(missing)).
    type: list
    elements: str
    default: []
  patterns:
    description: Shell patterns of the names listed in O(listing) (files only, not recursive).
    type: list
    elements: str
    default: []
  listing:
    description: Name of the file in O(dest) that lists the matching files, one C(NAME SIZE)
      line each, sorted; none is written when empty.
    type: str
    default: ""
  header:
    description: The first line of O(listing) (a C(#) is put before it).
    type: str
    default: ""
  known:
    description: Set by the action plugin - the SHA-256 of each of O(files) already in O(dest).
    type: dict
    default: {}
attributes:
  action:
    support: full
    description: The node is read in one module call; the action plugin writes on the controller.
  check_mode:
    support: full
    description: Says what would be written and writes nothing.
  diff_mode:
    support: none
    description: The files are binary or long; RV(written) names them.
  idempotent:
    support: full
    description: A second run writes nothing when nothing changed on the node.
"""

EXAMPLES = r"""
- name: Bring the results of rank 0 to the controller
  hostnet.llamafactory.job_results:
    output_dir: /var/lib/llamafactory/jobs/sft/output
    dest: "{{ playbook_dir }}/results/sft"
    files: [trainer_log.jsonl, training_loss.png, all_results.json]
    patterns: ["adapter_*", "*.safetensors"]
    listing: adapter-files.txt
    header: "vm0:/var/lib/llamafactory/jobs/sft/output (rank 0)"
  become: true
  register: results
"""

RETURN = r"""
matching:
  description: The files of O(output_dir) that match O(patterns), sorted by name.
  returned: always
  type: list
  elements: dict
  sample: [{name: adapter_model.safetensors, size: 8437024}]
written:
  description: The files written to O(dest) (in check mode, the ones that would be).
  returned: always
  type: list
  elements: str
  sample: [trainer_log.jsonl, adapter-files.txt]
missing:
  description: The ones of O(files) that the node does not have.
  returned: always
  type: list
  elements: str
dest:
  description: O(dest).
  returned: always
  type: str
"""

import base64
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _results as results


def main():
    module = AnsibleModule(
        argument_spec=dict(
            output_dir=dict(type="path", required=True),
            dest=dict(type="path", required=True),
            files=dict(type="list", elements="str", default=[]),
            patterns=dict(type="list", elements="str", default=[]),
            listing=dict(type="str", default=""),
            header=dict(type="str", default=""),
            known=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    params = module.params
    folder = params["output_dir"]
    try:
        names = os.listdir(folder)
    except OSError as exc:
        module.fail_json(msg="cannot list %s: %s" % (folder, exc))
    matching = [
        {"name": name, "size": os.path.getsize(os.path.join(folder, name))}
        for name in results.matching(names, params["patterns"])
        if os.path.isfile(os.path.join(folder, name))
    ]
    files, missing = {}, []
    for name in params["files"]:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            missing.append(name)
            continue
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except (IOError, OSError) as exc:
            module.fail_json(msg="cannot read %s: %s" % (path, exc))
        entry = {"size": len(data), "checksum": results.checksum(data)}
        if params["known"].get(name) != entry["checksum"]:
            entry["content"] = base64.b64encode(data).decode("ascii")
        files[name] = entry
    module.exit_json(changed=False, matching=matching, files=files, missing=missing)


if __name__ == "__main__":
    main()
