# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for hostnet.llamafactory.job_status: with O(survey) - the fact of
hostnet.llamafactory.node_survey - holding this playbook run's answer to the same read, that
answer (RV(surveyed) true) without contacting the node; otherwise the module's."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _survey as survey


class ActionModule(survey.SurveyedRead):
    MODULE = "hostnet.llamafactory.job_status"
    ANSWER = staticmethod(survey.job_answer)
