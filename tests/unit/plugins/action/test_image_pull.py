"""The action image_pull's failure message: the daemon's error from a pull captured on the local
cluster (tests/unit/fixtures/image_pull), with the cause and fix of plugin_utils/_pull_report."""

import json
from pathlib import Path

from ansible_collections.hostnet.llamafactory.plugins.action.image_pull import (
    ARGUMENT_SPEC,
    ActionModule,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "image_pull"


def test_a_failed_pull_says_cause_and_fix():
    (event,) = [
        json.loads(line) for line in (FIXTURES / "wrong-password.jsonl").read_text().splitlines()
    ]
    report = {"state": "failed", "error": event["error"], "invocation": {"module_args": {}}}
    result = ActionModule._failed({}, report, "198.18.96.5:5000/team/blank:v1", 12.4)
    lines = result["msg"].splitlines()
    assert lines[0] == "pulling 198.18.96.5:5000/team/blank:v1 failed after 12 s: " + event["error"]
    assert lines[1].startswith("Cause: the registry 198.18.96.5:5000 refused the credentials")
    assert lines[2].startswith("Fix: ") and "invocation" not in result
    assert result["failed"] is True


def test_an_unknown_error_has_no_cause():
    result = ActionModule._failed({}, {"error": "something new"}, "img", 1)
    assert result["msg"] == "pulling img failed after 1 s: something new"


def test_each_phase_passes_the_docker_options_but_not_the_actions_own():
    action = ActionModule.__new__(ActionModule)  # only _call is used: no task or connection
    calls = []
    action._task_vars = {"inventory_hostname": "vm0"}
    action._execute_module = lambda **kwargs: calls.append(kwargs) or {"state": "pulling"}
    args = {key: spec.get("default") for key, spec in ARGUMENT_SPEC.items()}
    args.update(name="img:v1", docker_socket="/run/docker.sock", docker_timeout=7)
    action._call(args, "poll")
    (call,) = calls
    assert call["module_name"] == "hostnet.llamafactory.image_pull"
    sent = call["module_args"]
    assert sent["phase"] == "poll"
    assert (sent["docker_socket"], sent["docker_timeout"]) == ("/run/docker.sock", 7)
    assert "interval" not in sent and "progress_every" not in sent  # the action's own
    assert "username" not in sent  # not given: not sent
