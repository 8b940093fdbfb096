# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: doctor_report
short_description: playbooks/doctor.yml's report, one line per problem with its fix
version_added: 0.1.0
description:
  - Joins the preflight's findings (M(hostnet.llamafactory.preflight_findings)), a smoke test's
    failure or result and the diagnosis of a job's logs (M(hostnet.llamafactory.diagnose)).
  - Every option but the input is given by name.
options:
  _input:
    description: The preflight's findings.
    type: list
    elements: dict
    required: true
  log_findings:
    description: The diagnosis of the job's logs.
    type: list
    elements: dict
  smoke_failure:
    description: Why the smoke test failed, if it did.
    type: str
  smoke:
    description: The smoke test's result (C(world_size), C(backend), C(busbw_GBps)).
    type: dict
  running:
    description: Whether the job runs (the probes were then skipped).
    type: bool
    default: false
  container:
    description: The job's container name, for the report.
    type: str
"""

EXAMPLES = r"""
- name: Report
  ansible.builtin.debug:
    msg: "{{ (findings | hostnet.llamafactory.doctor_report(log_findings=logs)).lines }}"
"""

RETURN = r"""
_value:
  description: C(problems) (how many) and C(lines) (the report).
  type: dict
"""

from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _preflight as preflight


def doctor_report(
    probe_findings,
    *,
    log_findings=None,
    smoke_failure=None,
    smoke=None,
    running=False,
    container="",
):
    return preflight.doctor_report(
        probe_findings,
        log_findings,
        smoke_failure=smoke_failure,
        smoke=smoke,
        running=running,
        container=container,
    )


class FilterModule(object):
    def filters(self):
        return {"doctor_report": doctor_report}
