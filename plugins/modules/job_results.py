#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: job_results
short_description: Bring a finished job's results and its trained model to the controller
version_added: 0.1.0
description:
  - On the node, reads O(files) (the training log, the loss plot) and the trained model - every
    visible file at the top of O(output_dir), as LLaMA-Factory saves a LoRA adapter or a full
    model - with the SHA-256 of each; on the controller, writes to O(dest) the ones of O(files)
    whose content differs from the copy already there, and the model's files to
    O(dest)/O(model_dir), each checked against the node's SHA-256 before it takes the place of
    the one there, then C(SHA256SUMS) in that folder (C(sha256sum -c SHA256SUMS) checks it).
  - A model larger than O(model_max_mb) is not brought (RV(model.over_limit)); its files are
    listed with their sizes.
  - With O(model_fetch=false) nothing is written - RV(model.verified) says whether the
    controller's copy is the node's (before its outputs are removed).
  - Why not M(ansible.builtin.fetch), M(ansible.builtin.find) and M(ansible.builtin.copy) - they
    take a round trip per file and per step; a re-run of a finished job collects on every run and
    one call is what its time is made of (docs/benchmarks.md, the task profile). Here a file
    already on the controller crosses only as its checksum, a small model comes in the same call,
    and a large file in 32 MiB pieces read as root (the output folder is not the login user's to
    read, which rules out M(ansible.builtin.fetch)'s file transfer without become).
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
  model_dir:
    description: Name of the folder in O(dest) for the model; empty, the model is not looked at.
    type: str
    default: ""
  model_max_mb:
    description: The largest model (all its files together, in MB) that is brought; 0 brings none.
    type: float
    default: 2048
  model_fetch:
    description: Bring the model's files that differ; V(false) only compares them.
    type: bool
    default: true
  record:
    description:
      - What to record on the node that the job finished on every rank (the launch role's
        C(launch_record) - the job, rank 0's container, every node's rank and address), as JSON
        in O(record_path), mode 0600, rewritten only when it differs. A re-run reads it with
        rank 0's job (M(hostnet.llamafactory.node_facts)) and contacts no other node.
      - Unset, nothing is recorded.
    type: dict
  record_path:
    description: Where O(record) goes on the node; required with O(record).
    type: path
  known:
    description: Set by the action plugin - the SHA-256 of each of O(files) already in O(dest).
    type: dict
    default: {}
  model_known:
    description: Set by the action plugin - the SHA-256 of each file in O(dest)/O(model_dir).
    type: dict
    default: {}
  inline_bytes:
    description: Set by the action plugin - how much of the model's content comes in this call.
    type: int
    default: 0
  read:
    description: Set by the action plugin - one piece of a file of O(output_dir) to read
      (C(name), C(offset), C(length)) instead of everything else.
    type: dict
attributes:
  action:
    support: full
    description: The node is read in one module call (and one per 32 MiB of a large model's
      files); the action plugin writes on the controller.
  check_mode:
    support: full
    description: Says what would be written and writes nothing.
  diff_mode:
    support: none
    description: The files are binary or long; RV(written), RV(model.fetched) and RV(recorded)
      name them.
  idempotent:
    support: full
    description: A second run writes nothing when nothing changed on the node.
"""

EXAMPLES = r"""
- name: Bring the results and the adapter of rank 0 to the controller
  hostnet.llamafactory.job_results:
    output_dir: /var/lib/llamafactory/jobs/sft/output
    dest: "{{ playbook_dir }}/results/sft"
    files: [trainer_log.jsonl, training_loss.png, all_results.json]
    model_dir: adapter
    model_max_mb: 2048
  become: true
  register: results
"""

RETURN = r"""
model:
  description: The trained model - its files on the node, where it is on the controller and
    whether that copy is verified. Empty when O(model_dir) is.
  returned: always
  type: dict
  contains:
    path:
      description: O(dest)/O(model_dir).
      type: str
    files:
      description: The model's files on the node, sorted by name, with C(sha256) unless
        RV(model.over_limit).
      type: list
      elements: dict
      sample: [{name: adapter_model.safetensors, size: 8437024, sha256: 9f86d08...}]
    size:
      description: Their total size in bytes.
      type: int
    over_limit:
      description: The model is larger than O(model_max_mb) and was not brought.
      type: bool
    max_mb:
      description: O(model_max_mb), the limit the model was held to.
      type: float
    fetched:
      description: The files written to RV(model.path) (in check mode, the ones that would be).
      type: list
      elements: str
    verified:
      description: Every file of the model is in RV(model.path) with the node's SHA-256.
      type: bool
written:
  description: The ones of O(files) written to O(dest) (in check mode, the ones that would be).
  returned: always
  type: list
  elements: str
  sample: [trainer_log.jsonl, training_loss.png]
missing:
  description: The ones of O(files) that the node does not have.
  returned: always
  type: list
  elements: str
dest:
  description: O(dest).
  returned: always
  type: str
recorded:
  description: O(record) was written to O(record_path) (in check mode, would be).
  returned: always
  type: bool
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
            model_dir=dict(type="str", default=""),
            model_max_mb=dict(type="float", default=2048),
            model_fetch=dict(type="bool", default=True),
            known=dict(type="dict", default={}),
            model_known=dict(type="dict", default={}),
            inline_bytes=dict(type="int", default=0),
            read=dict(type="dict"),
            record=dict(type="dict"),
            record_path=dict(type="path"),
        ),
        required_by=dict(record=["record_path"]),
        supports_check_mode=True,
    )
    params = module.params
    folder = params["output_dir"]
    piece = params["read"]
    if piece:
        path = os.path.join(folder, os.path.basename(piece["name"]))
        try:
            module.exit_json(
                changed=False,
                **results.read_piece(path, int(piece["offset"]), int(piece["length"])),
            )
        except (IOError, OSError, ValueError) as exc:
            module.fail_json(msg="cannot read %s: %s" % (path, exc))
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
    model = None
    if params["model_dir"]:
        try:
            model = results.describe_model(
                folder,
                params["model_max_mb"] * 1e6,
                params["model_known"],
                params["inline_bytes"] if params["model_fetch"] else 0,
            )
        except (IOError, OSError) as exc:
            module.fail_json(msg="cannot read the model in %s: %s" % (folder, exc))
    recorded = False
    if params["record"] is not None:
        try:
            recorded = results.write_record(
                params["record_path"], params["record"], module.check_mode
            )
        except (IOError, OSError) as exc:
            module.fail_json(msg="cannot write %s: %s" % (params["record_path"], exc))
    module.exit_json(changed=recorded, files=files, missing=missing, model=model, recorded=recorded)


if __name__ == "__main__":
    main()
