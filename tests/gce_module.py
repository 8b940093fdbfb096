"""Run one of the collection's Compute Engine modules with `ansible localhost -m` against the
fake Compute Engine API (tools/localcluster/compute_api.py): its result for localhost."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANSIBLE = Path(sys.executable).parent / "ansible"


def ansible_env(info):
    """The environment of an ansible command that reaches the fake (its proxy and CA) with the
    repository's ansible.cfg and the json callback, no GCP_ variable of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GCP_")}
    env.update(info["env"])
    env.update(
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_STDOUT_CALLBACK="json",
    )
    return env


def run_module(module, info, args, check=False, timeout=180):
    """`info`: the fake's client.json (token, env); `args`: the module's, given the fake's token
    and a short poll interval unless they say otherwise."""
    args = {"auth_kind": "accesstoken", **args}
    args.setdefault("access_token", info["token"])
    args.setdefault("poll_interval", 0.1)
    env = ansible_env(info)
    command = [str(ANSIBLE), "localhost", "-m", f"hostnet.llamafactory.{module}"]
    command += ["-a", json.dumps(args), "-e", f"ansible_python_interpreter={sys.executable}"]
    result = subprocess.run(
        command + (["--check"] if check else []),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = json.loads(result.stdout)
    return output["plays"][0]["tasks"][0]["hosts"]["localhost"]
