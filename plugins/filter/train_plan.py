# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: train_plan
short_description: A LLaMA-Factory training config made node-local, with the files to copy
version_added: 0.1.0
description:
  - Takes a parsed LLaMA-Factory YAML config and returns the config every node trains with
    - C(output_dir) under the job folder, C(dataset_dir), C(deepspeed), C(model_name_or_path)
    and C(adapter_name_or_path) pointing into the job folder when the controller has them
    (relative paths are relative to the YAML's folder; they are then copied), C(save_on_each_node)
    on so that every node holds whole checkpoints next to its ZeRO shard - and a digest of all
    of it (files included) that tells whether the job changed.
  - Reads the files it copies on the controller (to check and hash them).
options:
  _input:
    description: The parsed config.
    type: dict
    required: true
  config_path:
    description: Where the YAML is on the controller.
    type: str
    required: true
  job_dir:
    description: The job folder on the nodes.
    type: str
    required: true
  overrides:
    description: Options set over the file's (C(llamafactory_train_overrides)).
    type: dict
  shared:
    description: Folders mounted on every node (C(llamafactory_shared_mounts)); config paths
      under them are used in place, not copied.
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: Plan the job's files
  ansible.builtin.set_fact:
    plan: >-
      {{ lookup('ansible.builtin.file', cfg) | from_yaml
         | hostnet.llamafactory.train_plan(config_path=cfg,
             job_dir='/var/lib/llamafactory/jobs/demo') }}
"""

RETURN = r"""
_value:
  description: config (the rendered options), copies (key, src, dest, directory), output_dir,
    notes (what was left as a path inside the image), digest.
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.hostnet.llamafactory.plugins.module_utils.train_config import (
    PlanError,
    plan,
)


def train_plan(config, config_path, job_dir, overrides=None, shared=None):
    try:
        return plan(config, config_path, job_dir, overrides, shared or ())
    except PlanError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule(object):
    def filters(self):
        return {"train_plan": train_plan}
