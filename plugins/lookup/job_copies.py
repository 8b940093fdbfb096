# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: job_copies
short_description: The job plan's small copies as entries of M(hostnet.llamafactory.job_files)
version_added: 0.1.0
description:
  - Reads each copy of the job plan (validate_job's C(copies) with C(inline) true - a file or
    a folder, on the controller) and returns the folders and files it makes on a node, as
    entries of M(hostnet.llamafactory.job_files) - the bytes base64-encoded, files 0640 and
    folders 0750, as the launch's M(ansible.builtin.copy) makes them.
  - Why - the launch writes them in the same call as the job's config, on every node; a copy
    loop takes two or three round trips per file and node, most of a launch's time on 32
    nodes with Ansible's default forks (docs/benchmarks.md).
author:
  - hostnet.llamafactory contributors (@hostnet)
options:
  _terms:
    description: The copies (dicts with C(src), C(dest), C(directory)).
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
- name: The small copies, read once on the controller
  ansible.builtin.set_fact:
    copies: "{{ query('hostnet.llamafactory.job_copies', *(plan.copies | selectattr('inline'))) }}"
  run_once: true
"""

RETURN = r"""
_raw:
  description: Entries - C(path), C(state) (directory or file), C(mode), C(content_base64).
  type: list
  elements: dict
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _job_copies


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        try:
            return _job_copies.entries(terms)
        except (OSError, KeyError) as exc:
            raise AnsibleLookupError("job_copies: %s" % exc) from exc
