# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The job's validation and plan (controller only, private; used by the validate_job action).

validate() takes the job's settings as plain data and returns (plan, problems): every problem
at once, each naming its variable and the fix, or the job plan that every role then reads. It
runs before any node is contacted, so every value that reaches a node (a file, a command line,
a container or folder name) is checked for its syntax here.

Each variable is declared once, in its role's meta/argument_specs.yml: its type, default,
choices, elements and no_log (a secret, never shown). schema() reads the specs of ROLES, the
roles whose settings validate_job checks, and merges in RULES: what a spec cannot say (bounds,
null, syntax checks, per-host values, one value on every node). validate() runs its steps in
this order, each in the module of its concern:

- the variables' names (renamed, removed, unknown) and the play's values: here;
- the inventory, each node's own values, their agreement across the nodes and the node ranks:
  _validation_nodes.py;
- the platform and the credentials (network mode and profile, MASTER_ADDR, the VMs' state,
  registry and GCP credentials, deleting VMs, forks): _validation_platform.py;
- the job's identity and ports, then the training config: _validation_job.py.

_validation_values.py checks one value of one variable: its type, choices, bounds and syntax
(the check= functions of RULES).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import functools
import os

import yaml
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import (
    _validation_job as job_checks,
)
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import (
    _validation_nodes as node_checks,
)
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import (
    _validation_platform as platform_checks,
)
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import (
    _validation_values as checks,
)
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._unknown_vars import (
    PREFIXES,
    unknown_vars,
)

GROUP = "llamafactory"
PURPOSES = ("train", "admin", "doctor")
PLAN_FACT = "llamafactory_job_plan"
ROLES_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "roles"
)
# The roles whose settings validate_job checks (llamafactory and the roles that depend on it),
# in the order their problems are reported.
ROLES = (
    "llamafactory",
    "preflight",
    "launch",
    "job_admin",
    "gcp_instances",
    "gcp_firewall",
    "discover_network",
)

# A variable's name in an older release -> its name now. Setting an old name is refused, naming
# the new one.
RENAMED = {
    "launch_registry_username": "llamafactory_registry_username",
    "launch_registry_password": "llamafactory_registry_password",
    "launch_pull": "llamafactory_pull",
    "launch_pull_timeout": "llamafactory_pull_timeout",
    "launch_hf_token": "llamafactory_hf_token",
    "launch_nccl_ib_disable": "llamafactory_nccl_ib_disable",
    "launch_nccl_debug": "llamafactory_nccl_debug",
    "launch_ulimits": "llamafactory_ulimits",
    "launch_progress_every": "llamafactory_progress_every",
    "launch_stop_timeout": "llamafactory_stop_timeout",
    "launch_allow_bridge": "llamafactory_allow_bridge",
    "launch_allow_public_master_addr": "llamafactory_allow_public_master_addr",
    "launch_allow_uneven_gpus": "llamafactory_allow_uneven_gpus",
    "gcp_firewall_project": "llamafactory_gcp_project",
    "gcp_firewall_auth_kind": "llamafactory_gcp_auth_kind",
    "gcp_firewall_service_account_file": "llamafactory_gcp_service_account_file",
    "gcp_firewall_access_token": "llamafactory_gcp_access_token",
    "launch_preflight": "preflight_enabled",
    "launch_preflight_timeout": "preflight_timeout",
    "launch_preflight_port": "preflight_port",
    "launch_min_free_gb": "preflight_min_free_gb",
    "launch_smoke_test": "preflight_smoke_test",
    "launch_smoke_size_mb": "preflight_smoke_size_mb",
    "launch_doctor_container": "preflight_doctor_container",
    "launch_cleanup_outputs": "job_admin_cleanup_outputs",
}
REMOVED = {
    "gcp_firewall_group": (
        "gcp_firewall_group was removed: the job's nodes are always the inventory group "
        "'llamafactory'. Put the training VMs in that group and drop the variable."
    ),
}


# -- what a spec cannot say, by variable ----------------------------------------------------
#
# low/high: bounds of a number. nullable: null (or "") means "derive it" (validate() does).
# check: a syntax check, check(label, value) -> problems (_validation_values.py). per_host: a
# value per host (not taken from the play's vars). same: one value on every node. multiline: a
# string that may hold line breaks. choices=None: the spec's choices are not checked alone
# (validate() judges the value with a fuller message).

RULES = {
    "llamafactory_config": dict(nullable=True, check=checks.controller_path, same=True),
    "llamafactory_job": dict(nullable=True, check=checks.job_name, same=True),
    "llamafactory_master_port": dict(nullable=True, low=1024, high=65535, same=True),
    "llamafactory_image": dict(check=checks.image, same=True),
    "llamafactory_gpus_per_node": dict(low=0),
    "llamafactory_network_mode": dict(choices=None, same=True),
    "llamafactory_platform": dict(choices=None, same=True),
    "llamafactory_local_cluster": dict(same=True),
    "llamafactory_jobs_root": dict(check=checks.node_path, same=True),
    "llamafactory_hf_cache": dict(check=checks.node_path),
    "llamafactory_output_uri": dict(check=checks.output_uri, same=True),
    "llamafactory_shared_mounts": dict(check=checks.shared_mounts),
    "llamafactory_env": dict(check=checks.env),
    "llamafactory_train_overrides": dict(check=checks.overrides),
    "llamafactory_registry_username": dict(check=checks.registry_username),
    # Only in the pull request (a _json_key password is a multi-line JSON key).
    "llamafactory_registry_password": dict(multiline=True),
    "llamafactory_hf_token": dict(check=checks.hf_token),
    "llamafactory_hf_endpoint": dict(nullable=True, check=checks.url, same=True),
    "llamafactory_hub_fetch": dict(same=True),
    "llamafactory_hub_timeout": dict(low=1),
    "llamafactory_pull_timeout": dict(low=1),
    "llamafactory_progress_every": dict(low=1),
    "llamafactory_stop_timeout": dict(low=0),
    "llamafactory_collective_timeout_max": dict(low=60),
    "llamafactory_rendezvous_timeout": dict(low=30),
    "llamafactory_network_profile": dict(same=True),
    "llamafactory_ulimits": dict(check=checks.ulimits),
    "llamafactory_gcp_project": dict(check=checks.gcp_project),
    "llamafactory_gcp_service_account_file": dict(check=checks.controller_path),
    "llamafactory_node_rank": dict(nullable=True, low=0, per_host=True),
    "llamafactory_interface": dict(check=checks.interface, per_host=True),
    "llamafactory_master_interface": dict(check=checks.interface, per_host=True),
    "llamafactory_master_addr": dict(check=checks.master_addr, per_host=True),
    "preflight_timeout": dict(low=1),
    "preflight_port": dict(nullable=True, low=1024, high=65535, same=True),
    "preflight_min_free_gb": dict(low=0),
    "preflight_smoke_size_mb": dict(low=0.001),
    "preflight_doctor_container": dict(check=checks.container),
    "launch_wait_timeout": dict(low=1),
    "launch_stall_timeout": dict(low=0),
    "launch_poll_interval": dict(low=1),
    "launch_max_restarts": dict(low=0, high=100),
    "launch_peer_timeout": dict(low=0),
    "launch_agent_port": dict(nullable=True, low=1024, high=65535, same=True),
    # nullable: null passes, as it did before the default moved into the spec.
    "launch_results_dir": dict(nullable=True, check=checks.controller_path),
    "launch_fetch_model_max_mb": dict(low=0),
    "gcp_instances_label": dict(check=checks.label_key),
    "gcp_instances_timeout": dict(low=1),
    "gcp_instances_capacity_retries": dict(low=0),
    "gcp_instances_max_duration": dict(low=0),
    "gcp_firewall_cluster_name": dict(check=checks.gce_name(63 - len("-nodes"))),
    "gcp_firewall_network": dict(check=checks.gce_name(63)),
    "gcp_firewall_priority": dict(low=0, high=65535),
    "gcp_firewall_tag": dict(check=checks.gce_name(63)),
    "gcp_firewall_ranges": dict(check=checks.cidrs),
    "gcp_firewall_target_tags": dict(check=checks.gce_names),
    "gcp_firewall_ssh_source_ranges": dict(check=checks.cidrs),
    "gcp_firewall_operation_timeout": dict(low=1),
    # nullable: null passes, as it did before the default moved into the spec.
    "gcp_firewall_python": dict(nullable=True, check=checks.controller_path),
    "discover_network_metadata_url": dict(check=checks.url),
    "discover_network_metadata_timeout": dict(low=0.001),
}
RULE_FIELDS = ("low", "high", "nullable", "check", "per_host", "same", "multiline", "choices")


class Var(object):
    """One variable as validate() checks it.

    From its spec: kind (the argument spec type), role (whose spec declares it), default (None
    when the spec gives none, null or a templated one: validate() cannot know it), has_default
    (the spec gives one, templated included), elements, choices, secret (no_log). From RULES:
    low, high, nullable, check, per_host, same, multiline.
    """

    def __init__(
        self,
        name,
        kind,
        role,
        default=None,
        has_default=False,
        elements=None,
        choices=None,
        low=None,
        high=None,
        nullable=False,
        secret=False,
        check=None,
        per_host=False,
        same=False,
        multiline=False,
    ):
        self.name, self.kind, self.role, self.default = name, kind, role, default
        self.has_default, self.elements, self.choices = has_default, elements, choices
        self.low, self.high, self.nullable, self.secret = low, high, nullable, secret
        self.check, self.per_host, self.same, self.multiline = check, per_host, same, multiline


# -- the schema: the roles' specs with RULES merged in ----------------------------------------


# libyaml's loader where PyYAML was built with it (about 10x faster on the specs and task files
# the validation reads), else PyYAML's own: the same documents either way.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(path):
    with open(path) as handle:
        return yaml.load(handle, Loader=_LOADER)  # noqa: S506 - both loaders are safe ones


def templated(value):
    """Whether a spec default is an expression Ansible evaluates (not known to validate())."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


@functools.lru_cache(maxsize=None)
def _specs(roles_dir):
    """{role: its argument_specs} of every role under roles_dir that has one (read once per
    process)."""
    specs = {}
    for role in sorted(os.listdir(roles_dir)):
        path = os.path.join(roles_dir, role, "meta", "argument_specs.yml")
        if os.path.isfile(path):
            specs[role] = read_yaml(path).get("argument_specs") or {}
    return specs


def role_options(specs):
    """(name, option) of every entry point's options of one role's specs, each name once."""
    seen = set()
    for entry in specs.values():
        for name, option in ((entry or {}).get("options") or {}).items():
            if name not in seen:
                seen.add(name)
                yield name, option or {}


@functools.lru_cache(maxsize=None)
def schema(roles_dir=ROLES_DIR):
    """{name: Var} of every setting of ROLES, in their specs' order: each option of their specs
    (but the required ones: parameters the roles pass to an entry point, not settings) with its
    RULES entry merged in. Read once per process; do not change what it returns."""
    variables = {}
    specs = _specs(roles_dir)
    for role in ROLES:
        for name, option in role_options(specs.get(role) or {}):
            if option.get("required") or name in variables:
                continue
            default = option.get("default")
            fields = dict(
                default=None if templated(default) else default,
                has_default=default is not None,
                elements=option.get("elements"),
                choices=tuple(option["choices"]) if option.get("choices") else None,
                secret=bool(option.get("no_log")),
            )
            fields.update(RULES.get(name) or {})
            variables[name] = Var(name, option.get("type", "str"), role, **fields)
    return variables


def spec_options(roles_dir):
    """{name: option} of every option in every roles/*/meta/argument_specs.yml."""
    options = {}
    for specs in _specs(roles_dir).values():
        for name, option in role_options(specs):
            options.setdefault(name, option)
    return options


def role_value_names(roles_dir):
    """Names the roles define in defaults/ and vars/ main.yml (not user settings)."""
    defaults, fixed = set(), set()
    for role in sorted(os.listdir(roles_dir)):
        for folder, into in (("defaults", defaults), ("vars", fixed)):
            path = os.path.join(roles_dir, role, folder, "main.yml")
            if not os.path.isfile(path):
                continue
            data = read_yaml(path) or {}
            into.update(data)
    return defaults, fixed


SET_FACT = ("set_fact", "ansible.builtin.set_fact", "ansible.legacy.set_fact")


def _task_set_names(tasks, into):
    for task in tasks if isinstance(tasks, list) else []:
        if not isinstance(task, dict):
            continue
        if isinstance(task.get("register"), str):
            into.add(task["register"])
        for action in SET_FACT:
            if isinstance(task.get(action), dict):
                into.update(k for k in task[action] if k != "cacheable")
        for block in ("block", "rescue", "always", "tasks"):
            _task_set_names(task.get(block), into)


@functools.lru_cache(maxsize=None)
def task_set_names(roles_dir=ROLES_DIR):
    """Names the collection's own tasks set on a host (register, set_fact), read from the task
    files of the roles and of the playbooks beside them: a host's variable of such a name is the
    collection's, not a user's setting. Read once per process."""
    names = set()
    folders = [os.path.join(roles_dir, role, "tasks") for role in sorted(os.listdir(roles_dir))]
    for folder in [*folders, os.path.join(os.path.dirname(roles_dir), "playbooks")]:
        for root, _dirs, files in os.walk(folder):
            for name in files:
                if name.endswith((".yml", ".yaml")):
                    _task_set_names(read_yaml(os.path.join(root, name)), names)
    return frozenset(names)


# -- the steps that are not another module's ------------------------------------------------


def _names_problems(play_names, per_host, known, ignore, variables):
    """Renamed, removed and unknown variables, each with where it was set."""
    where = {}
    for name in play_names:
        where.setdefault(name, []).append("play vars")
    for host in sorted(per_host):
        for name in per_host[host]:
            where.setdefault(name, []).append(host)

    def at(name):
        places = where[name]
        shown = places if len(places) <= 3 else [*places[:3], "%d more" % (len(places) - 3)]
        return "set in: %s" % ", ".join(shown)

    problems = []
    for name in sorted(where):
        if name in RENAMED:
            problems.append(
                "%s was renamed %s (%s): set %s instead"
                % (name, RENAMED[name], at(name), RENAMED[name])
            )
        elif name in REMOVED:
            problems.append("%s (%s)" % (REMOVED[name], at(name)))
    accepted = set(known) | set(variables) | {PLAN_FACT}
    typos = unknown_vars(
        [n for n in where if n not in RENAMED and n not in REMOVED], accepted, ignore=ignore
    )
    for name, close in sorted(typos.items()):
        problems.append(
            "unknown variable %s%s (%s): no role reads it; fix the name (the roles' READMEs list "
            "every variable)" % (name, " (did you mean %s?)" % close if close else "", at(name))
        )
    return problems


def _play_values(variables, settings):
    """({name: value}, problems): each variable's play-level value, checked, or its default."""
    values, problems = {}, []
    for name, var in variables.items():
        if name in settings:
            value, found = checks.check_value(var, settings[name])
            problems.extend(found)
            values[name] = value
        else:
            values[name] = var.default
    return values, problems


def validate(
    settings,
    per_host,
    play_hosts,
    group_hosts,
    purpose="train",
    forks=None,
    known=(),
    read_config=read_yaml,
    play_names=(),
    ignore=(),
    instances=None,
    roles_dir=ROLES_DIR,
):
    """(plan, problems) of one job, computed once on the controller.

    settings: the play-level value of each variable (role defaults included), already templated.
    per_host: host -> {name: value} of the variables set for that host (inventory, extra vars),
    not facts or registered results. play_hosts: ansible_play_hosts_all. group_hosts:
    groups['llamafactory']. purpose: train, admin or doctor. forks: ansible_forks. known: every
    variable the roles' argument specs name. read_config: path -> parsed YAML. play_names:
    variables set at play level (play vars, vars files; not role defaults) for the name checks.
    ignore: names never reported as unknown (values the roles keep in vars/main.yml).
    instances: host -> {status, zone} of the VMs the gcp_compute inventory lists (its gcp_status
    and gcp_zone): a node that is not RUNNING is refused by name. roles_dir: the roles whose
    specs declare the variables (the collection's own).
    plan is None when there are problems.
    """
    variables = schema(roles_dir)
    problems = []

    def add(found):
        for problem in found:
            if problem not in problems:
                problems.append(problem)

    if purpose not in PURPOSES:
        add(["llamafactory_purpose is %r: use one of train, admin, doctor" % (purpose,)])
    per_host = dict((h, dict(per_host.get(h) or {})) for h in set(per_host) | set(play_hosts))
    add(_names_problems(play_names, per_host, known, ignore, variables))
    group_hosts = list(group_hosts or [])
    play_hosts = list(play_hosts or [])

    # The inventory; the play's values, then each node's own where it has one.
    add(node_checks.membership(group_hosts, play_hosts, purpose))
    values, found = _play_values(variables, settings)
    add(found)
    nodes, effective, found = node_checks.host_values(
        variables, settings, per_host, values, group_hosts, play_hosts
    )
    add(found)

    # Agreement across the nodes; the platform and the credentials; the ranks.
    add(node_checks.agreement(variables, nodes, per_host, effective, values))
    add(platform_checks.problems(nodes, effective, values, purpose, forks, instances))
    ranks, found = node_checks.ranks(group_hosts, effective)
    add(found)

    # The job's identity and ports, then its training config.
    plan, found = job_checks.identity(values, settings, purpose)
    add(found)
    plan.update(
        nodes=nodes,
        ranks=ranks,
        master=next((h for h, r in ranks.items() if r == 0), None),
        nproc=max(values["llamafactory_gpus_per_node"] or 0, 1),
        platform=values["llamafactory_platform"],
        gpus_per_node=dict((h, effective[h]["llamafactory_gpus_per_node"] or 0) for h in nodes),
    )
    if purpose == "train" and values["llamafactory_config"]:
        planned, found = job_checks.training_config(values, plan["job_dir"], read_config)
        add(found)
        plan.update(planned)

    if problems:
        return None, problems
    return plan, []


__all__ = ["PREFIXES", "ROLES", "RULES", "schema", "validate"]
