# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for hostnet.llamafactory.node_survey (see plugins/modules/node_survey.py).

Runs the module once on the node and marks the fact node_survey with this playbook run, so that
docker_host_facts and job_status take its answers in this run only (never from a fact cache)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.plugins.action import ActionBase
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _survey as survey


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        node = self._execute_module(
            module_name="hostnet.llamafactory.node_survey",
            module_args=self._task.args,
            task_vars=task_vars,
        )
        result.update(node)
        facts = result.get("ansible_facts") or {}
        if "node_survey" in facts:
            facts["node_survey"]["run"] = survey.run_identity()
        return result
