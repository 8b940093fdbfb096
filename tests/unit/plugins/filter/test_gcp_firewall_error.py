"""The filter gcp_firewall_error as roles/gcp_firewall/tasks/firewall.yml calls it: on the
failed result of google.cloud's real modules (run as Ansible runs them, against the fake Compute
Engine API) or of the role's deadline runner (files/bounded_python.py), with the context the
role gives (project, network, call, auth_kind, deadline, python)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import ansible_run
import pytest
from ansible_collections.hostnet.llamafactory.plugins.filter.gcp_firewall_error import (
    FilterModule,
    gcp_firewall_error,
)
from ansible_collections.hostnet.llamafactory.plugins.filter.gcp_firewall_plan import (
    gcp_firewall_plan,
)

COLLECTIONS = Path(ansible_run.ENV["ANSIBLE_COLLECTIONS_PATH"])
GOOGLE = COLLECTIONS / "ansible_collections" / "google" / "cloud" / "plugins" / "modules"
RUNNER = ansible_run.ROOT / "roles" / "gcp_firewall" / "files" / "bounded_python.py"


def google_module(module, tmp_path, fake_api, /, **args):
    """google.cloud's `module` run as Ansible runs it (its own process, the arguments as JSON),
    reaching the fake through its proxy; the result Ansible makes of it (of a crash: MODULE
    FAILURE with the module's stderr)."""
    (tmp_path / "args.json").write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(COLLECTIONS), "HOME": str(tmp_path)}
    env.update(fake_api["env"])
    done = subprocess.run(
        [sys.executable, str(GOOGLE / f"{module}.py"), str(tmp_path / "args.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    try:
        return json.loads(done.stdout)
    except ValueError:
        return {
            "failed": True,
            "msg": "MODULE FAILURE\nSee stdout/stderr for the exact error",
            "module_stdout": done.stdout,
            "module_stderr": done.stderr,
            "rc": done.returncode,
        }


def credentials(fake_api, project):
    """main.yml's module_defaults for group/google.cloud.gcp (llamafactory_gcp_auth_kind
    accesstoken)."""
    return {
        "project": project,
        "auth_kind": "accesstoken",
        "access_token": fake_api["token"],
        "scopes": ["https://www.googleapis.com/auth/compute"],
    }


def context(plan, call):
    """firewall.yml's gcp_firewall_failure_context."""
    return {
        "project": plan["project"],
        "network": plan["network"],
        "call": call,
        "auth_kind": "accesstoken",
        "deadline": 300,
        "python": sys.executable,
    }


def write(fake_api, tmp_path, plan):
    """firewall.yml's "Create or update rules" loop over the nodes rule: the loop's result."""
    rule = dict(plan["rules"][0], action="create", changes=[])
    result = google_module(
        "gcp_compute_firewall",
        tmp_path,
        fake_api,
        state="present",
        **rule["params"],
        **credentials(fake_api, plan["project"]),
    )
    item = dict(result, item=rule, ansible_loop_var="item")
    return {"failed": True, "msg": "One or more items failed", "results": [item], "changed": False}


def test_a_denied_write_names_the_permission_and_the_credentials(
    compute, fake_api, firewall_settings, tmp_path
):
    compute.session.post(f"{compute.control}/config", json={"deny": ["compute.firewalls.create"]})
    plan = gcp_firewall_plan(firewall_settings())
    message = gcp_firewall_error(write(fake_api, tmp_path, plan), context(plan, "present"))
    assert message.startswith(
        "Permission denied: the credentials (llamafactory_gcp_auth_kind=accesstoken) lack "
        "compute.firewalls.create in project hlf-test, needed for writing the firewall rule "
        "llamafactory-nodes (Google: Required 'compute.firewalls.create' permission for "
        "'projects/hlf-test/global/firewalls/llamafactory-nodes'). Grant the identity "
        "roles/compute.securityAdmin"
    )


def test_a_missing_network_and_a_missing_project_are_told_apart(
    compute, fake_api, firewall_settings, tmp_path
):
    plan = gcp_firewall_plan(firewall_settings(network="gpu-net"))
    message = gcp_firewall_error(write(fake_api, tmp_path, plan), context(plan, "present"))
    assert message.startswith(
        "The VPC network gpu-net (gcp_firewall_network=gpu-net) was not found in project hlf-test"
    )
    plan = gcp_firewall_plan(firewall_settings(project="hlf-gone"))
    message = gcp_firewall_error(write(fake_api, tmp_path, plan), context(plan, "present"))
    assert message.startswith("Project hlf-gone was not found (Google: The resource 'projects/")
    assert "Set llamafactory_gcp_project to the ID of an existing project" in message


def test_reading_the_rules_of_a_missing_project(compute, fake_api, firewall_settings, tmp_path):
    # gcp_compute_firewall_info crashes on the list call's 404: the role's read task.
    plan = gcp_firewall_plan(firewall_settings(project="hlf-gone"))
    result = google_module(
        "gcp_compute_firewall_info",
        tmp_path,
        fake_api,
        filters=[plan["list_filter"]],
        **credentials(fake_api, "hlf-gone"),
    )
    assert result["msg"].startswith("MODULE FAILURE")
    assert gcp_firewall_error(result, context(plan, "list")) == (
        "Project hlf-gone was not found: listing its firewall rules answered 404. Set "
        "llamafactory_gcp_project to the ID of an existing project that the credentials can see."
    )


def test_the_runners_deadline_names_the_rule_and_the_setting(firewall_settings):
    done = subprocess.run(
        [sys.executable, str(RUNNER), "-c", "import time; time.sleep(30)"],
        env=dict(os.environ, GCP_FIREWALL_DEADLINE="0.5"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    result = json.loads(done.stdout.splitlines()[-1])
    plan = gcp_firewall_plan(firewall_settings())
    item = dict(result, item=dict(plan["rules"][0], action="create"), ansible_loop_var="item")
    loop = {"failed": True, "msg": "One or more items failed", "results": [item]}
    assert gcp_firewall_error(loop, dict(context(plan, "present"), deadline=0.5)) == (
        "Compute Engine did not finish writing the firewall rule llamafactory-nodes within "
        "gcp_firewall_operation_timeout (0.5 s), and the module was stopped. GCP may still "
        "complete the operation: run the role again to converge, or raise "
        "gcp_firewall_operation_timeout."
    )


def test_nothing_known_still_gives_a_message():
    assert gcp_firewall_error(None, None) == (
        "google.cloud's module failed while changing the firewall rules: "
    )


def test_options_by_position_as_the_role_calls_it():
    with pytest.raises(TypeError):
        gcp_firewall_error({"failed": True})  # pylint: disable=no-value-for-parameter


def test_the_call_sites_bind(call_sites):
    assert FilterModule().filters()["gcp_firewall_error"] is gcp_firewall_error
    assert call_sites("gcp_firewall_error", gcp_firewall_error) == [
        ("roles/gcp_firewall/tasks/firewall.yml", 1, []),
        ("roles/gcp_firewall/tasks/firewall.yml", 1, []),
    ]
