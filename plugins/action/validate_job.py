# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for hostnet.llamafactory.validate_job (documented in plugins/modules/).

Runs on the controller and never contacts a node. It gathers the job's variables and hands them
to plugin_utils/_validation.py's validate(), a pure function; the variables are those the
collection's roles declare in their meta/argument_specs.yml (_validation.schema()).

Which variables count as set by the user (for the renamed, removed and unknown-name checks):
every host's hostvars (inventory, group_vars/host_vars, extra vars, include_vars) minus what
tasks set on it (set_fact, register, gathered facts: the variable manager's fact caches), plus
the play's own variables (play vars, vars_files, role params: task_vars minus the host's vars,
minus the defaults and vars of the collection's roles). Facts are left out because the roles set
facts with their own prefixes (discover_network_rank, launch_*, preflight_*, and
llamafactory_job_plan itself); a typo in a set_fact of the user's own is not caught.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import yaml
from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _validation

COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLES_DIR = os.path.join(COLLECTION_ROOT, "roles")

ARGUMENT_SPEC = dict(
    purpose=dict(type="str", choices=list(_validation.PURPOSES), default="train"),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        task_vars = task_vars or {}
        _valid, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        hostvars = task_vars.get("hostvars") or {}
        play_hosts = list(task_vars.get("ansible_play_hosts_all") or [])
        group_hosts = list((task_vars.get("groups") or {}).get(_validation.GROUP) or [])
        defaults, fixed = _validation.role_value_names(ROLES_DIR)
        # Facts and results of the collection's own tasks, should the validation run again later
        # in a playbook (a role of a broader purpose): not settings of the user's.
        set_by_tasks = _validation.task_set_names(ROLES_DIR)
        variables = _validation.schema(ROLES_DIR)

        problems, per_host, instances = [], {}, {}
        for host in group_hosts + [h for h in play_hosts if h not in group_hosts]:
            raw = self._raw_hostvars(hostvars, host)
            if "gcp_status" in raw:  # google.cloud.gcp_compute's host variables (vars_prefix gcp_)
                instances[host] = {"status": raw.get("gcp_status"), "zone": raw.get("gcp_zone")}
            names = set(raw) - set_by_tasks
            per_host[host] = {}
            for name in sorted(names):
                if name in variables:
                    per_host[host][name] = self._host_value(hostvars, host, name, problems)
                elif name.startswith(_validation.PREFIXES):
                    per_host[host][name] = None  # only the name is checked

        current = task_vars.get("inventory_hostname")
        own = set(self._raw_hostvars(hostvars, current)) if current else set()
        play_names = sorted(
            n
            for n in task_vars
            if n.startswith(_validation.PREFIXES) and n not in own and n not in defaults | fixed
        )
        settings = {}
        for name, var in variables.items():
            if name not in task_vars or (var.per_host and name not in play_names):
                continue
            try:
                settings[name] = self._templar.template(task_vars[name])
            except AnsibleError as exc:
                problems.append("%s cannot be resolved: %s" % (name, exc))

        plan, found = _validation.validate(
            settings,
            per_host,
            play_hosts,
            group_hosts,
            purpose=args["purpose"],
            forks=task_vars.get("ansible_forks"),
            known=_validation.spec_options(ROLES_DIR),
            read_config=self._read_config,
            play_names=play_names,
            ignore=fixed,
            instances=instances,
            roles_dir=ROLES_DIR,
        )
        problems.extend(found)
        if problems:
            result.update(
                failed=True,
                problems=problems,
                msg="The job cannot run as set up (%d problem%s; nothing was done on any node):\n"
                "%s"
                % (
                    len(problems),
                    "" if len(problems) == 1 else "s",
                    "\n".join("- %s" % p for p in problems),
                ),
            )
            return result
        result.update(
            changed=False,
            plan=plan,
            msg="job %r (%s): %d node%s, master %s, MASTER_PORT %d, job folder %s"
            % (
                plan["job"],
                plan["purpose"],
                len(plan["nodes"]),
                "" if len(plan["nodes"]) == 1 else "s",
                plan["master"],
                plan["master_port"],
                plan["job_dir"],
            ),
            notes=plan.get("notes", []),
        )
        if plan.get("warnings"):
            result["warnings"] = list(plan["warnings"])
        return result

    @staticmethod
    def _raw_hostvars(hostvars, host):
        raw_get = getattr(hostvars, "raw_get", None)
        data = raw_get(host) if raw_get else hostvars.get(host)
        return data if isinstance(data, dict) else {}

    @staticmethod
    def _host_value(hostvars, host, name, problems):
        try:
            return hostvars[host][name]
        except AnsibleError as exc:
            problems.append("%s of %s cannot be resolved: %s" % (name, host, exc))
            return None

    def _read_config(self, path):
        """The training YAML (vault-encrypted files too)."""
        if not os.path.isfile(path):
            raise OSError(2, "no such file" if not os.path.exists(path) else "not a file", path)
        return yaml.safe_load(self._loader.get_text_file_contents(path))
