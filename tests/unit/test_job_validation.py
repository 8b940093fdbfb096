"""train.yml's up-front checks: a catalogue of bad inventories and configs, each refused with its
own message (naming the variable and the fix) before any node is contacted.

The inventory's hosts point at a closed port on loopback: any task that tried to reach a node
would show up as unreachable. No Docker needed.
"""

import json
import os
import sys
from pathlib import Path

import ansible_runner
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
os.environ.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
DEMO = ROOT / "examples" / "local-demo" / "llama3_lora_sft_ds3.yaml"


def good_config(folder: Path, **changes) -> Path:
    config = yaml.safe_load(DEMO.read_text())
    config.update(changes)
    for key, value in list(config.items()):
        if value is None:
            del config[key]
    (folder / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    config.setdefault("deepspeed", "ds.json")
    if config["deepspeed"] == "ds_z3_config.json":  # the demo's, next to the demo's YAML
        config["deepspeed"] = "ds.json"
    config["model_name_or_path"] = config.get("model_name_or_path", "org/tiny-llama")
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run(tmp_path: Path, host_vars=None, forks=None, **extravars):
    """(rc, failure messages, unreachable hosts) of train.yml with `extravars`."""
    hosts = {
        "trainer-0": {"ansible_host": "127.0.0.1", "ansible_port": 9},
        "trainer-1": {"ansible_host": "127.0.0.1", "ansible_port": 9},
    }
    for host, values in (host_vars or {}).items():
        hosts[host].update(values)
    inventory = {"all": {"children": {"llamafactory": {"hosts": hosts}}}}
    if "llamafactory_config" not in extravars:
        extravars["llamafactory_config"] = str(good_config(tmp_path))
    settings = {
        "llamafactory_platform": "gcp",
        "llamafactory_gpus_per_node": 1,
        **extravars,
    }
    settings = {k: v for k, v in settings.items() if v is not None}
    (tmp_path / "runner").mkdir(parents=True, exist_ok=True)
    runner = ansible_runner.run(
        private_data_dir=str(tmp_path / "runner"),
        inventory=inventory,
        playbook=str(ROOT / "playbooks" / "train.yml"),
        extravars=settings,
        quiet=True,
        timeout=120,
        forks=forks,
    )
    failures, unreachable = [], []
    for event in runner.events:
        data = event.get("event_data", {})
        if event.get("event") == "runner_on_failed":
            failures.append(str(data["res"].get("msg", "")))
            failures.extend(str(item.get("msg", "")) for item in data["res"].get("results", []))
        if event.get("event") == "runner_on_unreachable":
            unreachable.append(data["host"])
    return runner.rc, failures, unreachable


CATALOGUE = [
    # (id, extravars, host_vars, expected fragments of the message)
    (
        "no-config",
        {"llamafactory_config": None},
        None,
        ["llamafactory_config must name a LLaMA-Factory training YAML"],
    ),
    (
        "config-missing",
        {"llamafactory_config": "/nonexistent/job.yaml"},
        None,
        ["llamafactory_config", "/nonexistent/job.yaml"],
    ),
    (
        "job-name",
        {"llamafactory_job": "My Job"},
        None,
        ["llamafactory_job 'My Job' is not usable", "lower-case letters"],
    ),
    (
        "port-low",
        {"llamafactory_master_port": 80},
        None,
        ["llamafactory_master_port (80) must be 1024-65535"],
    ),
    (
        "port-text",
        {"llamafactory_master_port": "rendezvous"},
        None,
        ["llamafactory_master_port (rendezvous) must be 1024-65535"],
    ),
    (
        "gpus-text",
        {"llamafactory_gpus_per_node": "two"},
        None,
        ["llamafactory_gpus_per_node (two) a whole number"],
    ),
    ("wait-timeout", {"launch_wait_timeout": 0}, None, ["launch_wait_timeout"]),
    (
        "pull-timeout",
        {"llamafactory_pull_timeout": "1h"},
        None,
        ["llamafactory_pull_timeout (1h) positive seconds"],
    ),
    (
        "shared-mount-relative",
        {"llamafactory_shared_mounts": ["data"]},
        None,
        ["llamafactory_shared_mounts must list absolute folders"],
    ),
    (
        "registry-password-alone",
        {"llamafactory_registry_password": "token"},
        None,
        ["llamafactory_registry_password is set but llamafactory_registry_username is empty"],
    ),
    (
        "registry-typo",
        {"launch_registry_user": "oauth2accesstoken"},
        None,
        ["launch_registry_user (did you mean llamafactory_registry_username?)"],
    ),
    (
        "bridge",
        {"llamafactory_network_mode": "bridge"},
        None,
        ["llamafactory_network_mode is 'bridge'", "Set llamafactory_network_mode=host"],
    ),
    (
        "network-none",
        {"llamafactory_network_mode": "none"},
        None,
        ["llamafactory_network_mode is 'none'", "Set llamafactory_network_mode=host"],
    ),
    (
        "secret-env",
        {"llamafactory_env": {"HF_TOKEN": "hf_abc"}},
        None,
        ["llamafactory_env sets HF_TOKEN", "llamafactory_hf_token"],
    ),
    (
        "reserved-env",
        {"llamafactory_env": {"NNODES": "4", "RANK": "1"}},
        None,
        ["llamafactory_env sets NNODES, RANK", "llamafactory_node_rank"],
    ),
    (
        "env-not-mapping",
        {"llamafactory_env": ["OMP_NUM_THREADS=1"]},
        None,
        ["llamafactory_env and llamafactory_train_overrides must be mappings"],
    ),
    (
        "duplicate-rank",
        {},
        {"trainer-0": {"llamafactory_node_rank": 0}, "trainer-1": {"llamafactory_node_rank": 0}},
        ["llamafactory_node_rank must be unique", "hang at the rendezvous"],
    ),
    (
        "rank-gap",
        {},
        {"trainer-0": {"llamafactory_node_rank": 0}, "trainer-1": {"llamafactory_node_rank": 2}},
        ["llamafactory_node_rank must run from 0 to 1 without gaps"],
    ),
    (
        "rank-on-one-host",
        {},
        {"trainer-1": {"llamafactory_node_rank": 1}},
        ["llamafactory_node_rank is set on trainer-1 but not on trainer-0"],
    ),
    (
        "uneven-gpus",
        {"llamafactory_gpus_per_node": None},
        {
            "trainer-0": {"llamafactory_gpus_per_node": 8},
            "trainer-1": {"llamafactory_gpus_per_node": 4},
        },
        ["llamafactory_gpus_per_node differs between the nodes (8, 4)"],
    ),
    (
        "cpu-without-gloo",
        {"llamafactory_gpus_per_node": 0, "llamafactory_train_overrides": {"ddp_backend": "nccl"}},
        None,
        ["llamafactory_gpus_per_node is 0", "ddp_backend: gloo"],
    ),
    (
        "public-master",
        {"llamafactory_master_addr": "34.120.0.5"},
        None,
        ["llamafactory_master_addr 34.120.0.5 is a public address", "rank 0's internal address"],
    ),
    (
        "bridge-master",
        {"llamafactory_master_addr": "172.17.0.2"},
        None,
        ["llamafactory_master_addr 172.17.0.2 is a Docker bridge address"],
    ),
    (
        "loopback-master",
        {"llamafactory_master_addr": "127.0.0.1"},
        None,
        ["llamafactory_master_addr 127.0.0.1 is a loopback address"],
    ),
    (
        "image-name",
        {"llamafactory_image": "Hiyouga/LlamaFactory:latest"},
        None,
        ["llamafactory_image 'Hiyouga/LlamaFactory:latest' is not an image reference"],
    ),
    (
        "typo",
        {"llamafactory_gpu_per_node": 0},
        None,
        ["Unknown variables: llamafactory_gpu_per_node (did you mean llamafactory_gpus_per_node?)"],
    ),
    (
        "typo-launch",
        {"launch_wait_timout": 60},
        None,
        ["launch_wait_timout (did you mean launch_wait_timeout?)"],
    ),
    (
        "platform",
        {"llamafactory_platform": "aws"},
        None,
        ["llamafactory_platform is 'aws'", "'gcp'"],
    ),
]


@pytest.mark.parametrize(
    ("extravars", "host_vars", "expected"),
    [pytest.param(e, h, x, id=i) for i, e, h, x in CATALOGUE],
)
def test_bad_input_is_refused_before_any_node_is_touched(tmp_path, extravars, host_vars, expected):
    rc, failures, unreachable = run(tmp_path, host_vars=host_vars, **extravars)
    assert rc != 0
    assert unreachable == [], "a node was contacted before the input was checked"
    message = " ".join(" ".join(f.split()) for f in failures)
    for fragment in expected:
        assert fragment in message, message


@pytest.mark.parametrize(
    ("config_changes", "expected"),
    [
        ({"stage": None}, "has no 'stage'"),
        ({"model_name_or_path": ""}, None),  # replaced below: a config without the key
        ({"deepspeed": "missing-folder/"}, None),
    ],
    ids=["no-stage", "no-model", "deepspeed-folder"],
)
def test_bad_training_configs(tmp_path, config_changes, expected):
    config = good_config(tmp_path, **config_changes)
    data = yaml.safe_load(config.read_text())
    if "model_name_or_path" in config_changes:
        del data["model_name_or_path"]
        expected = "has no 'model_name_or_path'"
    if "deepspeed" in config_changes:
        (tmp_path / "dsdir").mkdir()
        data["deepspeed"] = "dsdir"
        expected = "is a folder: point it at the DeepSpeed JSON file"
    config.write_text(yaml.safe_dump(data))
    rc, failures, unreachable = run(tmp_path, llamafactory_config=str(config))
    assert rc != 0 and unreachable == []
    assert expected in " ".join(" ".join(f.split()) for f in failures)


def test_a_config_that_is_not_a_mapping_and_broken_json(tmp_path):
    listing = tmp_path / "list.yaml"
    listing.write_text("- stage: sft\n")
    rc, failures, unreachable = run(tmp_path, llamafactory_config=str(listing))
    assert rc != 0 and unreachable == []
    assert "is not a LLaMA-Factory config" in " ".join(failures)
    config = good_config(tmp_path)
    (tmp_path / "ds.json").write_text("{not json")
    (tmp_path / "second").mkdir()
    rc, failures, unreachable = run(tmp_path / "second", llamafactory_config=str(config))
    assert rc != 0 and unreachable == []
    assert "deepspeed" in " ".join(failures) and "is not valid JSON" in " ".join(failures)


def test_too_few_forks(tmp_path):
    rc, failures, unreachable = run(tmp_path, forks=1)
    assert rc != 0 and unreachable == []
    assert "forks is 1 but the job has 2 nodes" in " ".join(failures)


def test_good_input_passes_the_checks_and_then_reaches_for_the_nodes(tmp_path):
    """The control case: the same inventory with good input gets past validation (and then
    fails reaching the nodes, which are a closed port), so the catalogue's refusals are the
    checks' doing."""
    rc, failures, unreachable = run(tmp_path)
    assert rc != 0 and failures == []
    assert "trainer-0" in unreachable  # rank 0's discovery is the first task on a node
