#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: job_files
short_description: A job's folders and text files on a node, in one call
version_added: 0.1.0
description:
  - Makes each of O(entries) what it says - a folder, or a file with the given text - with
    O(owner), O(group) and the entry's mode, in order; changes only what differs. A file is
    written whole (a temporary file with its owner and mode set first, renamed over the old one).
  - Why not M(ansible.builtin.file) and M(ansible.builtin.copy) - they take one round trip per
    folder and two or three per file (the small files a job's config names, its dataset and a
    small model, come in the same call); a launch writes five folders and four or five files on
    every node, which on 32 nodes with Ansible's default forks is most of the launch's time
    (docs/benchmarks.md). Secrets stay with M(ansible.builtin.copy) and C(no_log).
author:
  - hostnet.llamafactory contributors (@hostnet)
options:
  entries:
    description: What to make, in order (a folder before what it holds).
    type: list
    elements: dict
    required: true
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
        description: The file's text (C(state=file)); or O(entries[].content_base64).
        type: str
      content_base64:
        description: The file's bytes, base64-encoded (C(state=file)), for files that are not
          text (a model's weights, copied with the job when small).
        type: str
      mode:
        description: Octal mode, as a string (C("0640")).
        type: str
        required: true
      json:
        description: Refuse the entry unless its content is valid JSON (nothing is written).
        type: bool
        default: false
  owner:
    description: The owner of every entry (name or id).
    type: str
    default: root
  group:
    description: The group of every entry (name or id).
    type: str
    default: root
attributes:
  check_mode:
    support: full
    description: Reports what would change; writes nothing.
  diff_mode:
    support: full
    description: Names each change (created, content, owner, mode), not the (maybe secret) text.
  idempotent:
    support: full
    description: Changes only what differs; a second run reports no change.
"""

EXAMPLES = r"""
- name: The job's folders and files
  hostnet.llamafactory.job_files:
    entries:
      - {path: /var/lib/llamafactory/jobs/sft, state: directory, mode: "0750"}
      - {path: /var/lib/llamafactory/jobs/sft/config.yaml, content: "{{ config }}", mode: "0640"}
  become: true
"""

RETURN = r"""
changes:
  description: Each changed path with what changed (C(create), C(content), C(owner), C(mode)).
  returned: always
  type: dict
  sample: {/var/lib/llamafactory/jobs/sft/config.yaml: [content]}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _job_files as files


def main():
    module = AnsibleModule(
        argument_spec=dict(
            entries=dict(type="list", elements="dict", required=True, options=files.ENTRY_OPTIONS),
            owner=dict(type="str", default="root"),
            group=dict(type="str", default="root"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        changes = files.write(
            params["entries"], params["owner"], params["group"], module.check_mode
        )
    except files.EntryError as exc:
        module.fail_json(msg=str(exc), changes=exc.changes)
    result = dict(changed=bool(changes), changes=changes)
    if module._diff:
        result["diff"] = dict(
            before="".join("%s: as it was\n" % p for p in sorted(changes)),
            after="".join("%s: %s\n" % (p, ", ".join(c)) for p, c in sorted(changes.items())),
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
