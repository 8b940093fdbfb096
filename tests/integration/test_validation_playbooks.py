"""The playbooks refuse bad input before any node is contacted: every problem in one message,
through the role hostnet.llamafactory.llamafactory (the catalogue of bad inputs, one per variable
and injection class, is in tests/unit/plugins/plugin_utils/test_validation.py).

The inventory's hosts point at a closed port on loopback: any task that tried to reach a node
would show up as unreachable. No Docker needed.
"""

import json
from pathlib import Path

import ansible_run
import yaml

DEMO = ansible_run.ROOT / "examples" / "local-demo" / "llama3_lora_sft_ds3.yaml"


def good_config(folder: Path) -> Path:
    config = yaml.safe_load(DEMO.read_text())
    (folder / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    config.update(deepspeed="ds.json", model_name_or_path="org/tiny-llama")
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run(
    tmp_path: Path, playbook="playbooks/train.yml", host_vars=None, group="llamafactory", **options
):
    """`playbook` on two unreachable GCP nodes with a good job, changed by `extravars`."""
    hosts = {
        "trainer-0": {"ansible_host": "127.0.0.1", "ansible_port": 9},
        "trainer-1": {"ansible_host": "127.0.0.1", "ansible_port": 9},
    }
    for host, values in (host_vars or {}).items():
        hosts[host].update(values)
    tmp_path.mkdir(parents=True, exist_ok=True)
    extravars = {
        "llamafactory_config": str(good_config(tmp_path)),
        "llamafactory_platform": "gcp",
        "llamafactory_gcp_project": "hlf-test",
        **options.pop("extravars", {}),
    }
    extravars = {k: v for k, v in extravars.items() if v is not None}
    inventory = {"all": {"children": {group: {"hosts": hosts}}}}
    return ansible_run.run(
        tmp_path / "runner",
        inventory,
        playbook=playbook,
        extravars=extravars,
        timeout=120,
        **options,
    )


def message(result) -> str:
    return " ".join(" ".join(m.split()) for m in result.messages())


def test_every_problem_is_reported_at_once_before_any_node_is_touched(tmp_path):
    result = run(
        tmp_path,
        extravars={
            "llamafactory_master_port": 80,
            "llamafactory_env": {"OMP_NUM_THREADS": "1\nMASTER_ADDR=203.0.113.9"},
            "launch_hf_token": "hf_x",
            "launch_wait_timout": 60,
        },
        host_vars={"trainer-1": {"llamafactory_interface": "eth0; reboot"}},
    )
    assert result.rc != 0
    assert result.unreachable() == [], "a node was contacted before the input was checked"
    failures = list(result.failures().values())
    assert len(failures) == 1, failures  # one failure, on the controller
    text = " ".join(failures[0]["msg"].split())
    for fragment in [
        "5 problems",
        "llamafactory_master_port",
        "llamafactory_env",
        "launch_hf_token was renamed llamafactory_hf_token",
        "launch_wait_timout (did you mean launch_wait_timeout?)",
        "llamafactory_interface",
    ]:
        assert fragment in text, text
    assert "hf_x" not in json.dumps(result.events)  # a secret's value is never shown


def test_status_without_a_job_is_refused(tmp_path):
    """status, stop and cleanup given no job (no llamafactory_job, no config to name one) stop
    before any node, rather than act on a job of a made-up name."""
    for playbook in ("status", "stop", "cleanup"):
        result = run(
            tmp_path / playbook,
            f"playbooks/{playbook}.yml",
            extravars={"llamafactory_config": None},
        )
        assert result.rc != 0 and result.unreachable() == [], playbook
        assert "llamafactory_job is not set: name the job to act on" in message(result), playbook


def test_a_limit_that_leaves_out_a_node_is_refused(tmp_path):
    result = run(tmp_path, limit="trainer-0")
    assert result.rc != 0 and result.unreachable() == []
    assert "--limit leaves out trainer-1" in message(result)


def test_too_few_forks_without_agents(tmp_path):
    """Bridge networking runs the ranks without their agents: the wait needs a fork per node.
    (With host networking one fork waits for every node: test_launch.py runs with forks 1.)"""
    bridge = {"llamafactory_network_mode": "bridge", "llamafactory_allow_bridge": True}
    result = run(tmp_path, forks=1, extravars=bridge)
    assert result.rc != 0 and result.unreachable() == []
    assert "forks is 1 but the job has 2 nodes and llamafactory_network_mode bridge" in (
        message(result)
    )


def test_good_input_passes_the_checks_and_then_reaches_for_the_nodes(tmp_path):
    """The control case: the same inventory with good input gets past validation (and then
    fails reaching the nodes, which are a closed port), so the refusals are the checks' doing."""
    result = run(tmp_path)
    assert result.rc != 0 and result.failures() == {}
    assert "trainer-0" in result.unreachable()  # rank 0's discovery is the first task on a node


def test_deleting_the_vms_that_hold_the_only_copy_of_the_model_is_refused(tmp_path):
    """when_done: delete with the model kept off the controller would delete the trained model
    with the VMs' disks: refused before any node is contacted."""
    result = run(
        tmp_path,
        extravars={"gcp_instances_when_done": "delete", "launch_fetch_model_max_mb": 0},
    )
    assert result.rc != 0 and result.unreachable() == []
    assert (
        "gcp_instances_when_done is delete but llamafactory_output_uri is empty and "
        "launch_fetch_model_max_mb is 0" in message(result)
    )


PLAYBOOKS = ["train", "status", "stop", "cleanup", "wait", "doctor", "discover"]


def test_every_playbook_fails_when_the_inventory_has_no_llamafactory_group(tmp_path):
    """An inventory that names its group otherwise would skip every play and end green: each
    playbook fails first, naming the groups and hosts it found."""
    for name in PLAYBOOKS:
        result = run(
            tmp_path / name,
            f"playbooks/{name}.yml",
            group="trainers",
            extravars={"llamafactory_job": "sft"},
        )
        assert result.rc != 0 and result.unreachable() == [], name
        text = message(result)
        assert "The inventory has no host in the group 'llamafactory'" in text, (name, text)
        assert "(groups found: trainers; hosts: trainer-0, trainer-1)" in text, (name, text)


# The playbooks for which an empty group is the normal case: they create or delete the VMs, on
# the controller (train.yml imports up.yml, then the guard).
VM_PLAYBOOKS = ["up", "down"]


def test_every_playbook_of_the_collection_requires_the_group_first():
    """The guard above, for a playbook added later: each imports require_nodes.yml first (after
    up.yml, for train.yml); up.yml and down.yml start on the controller."""
    folder = ansible_run.ROOT / "playbooks"
    names = sorted(p.stem for p in folder.glob("*.yml") if p.stem != "require_nodes")
    assert names == sorted(PLAYBOOKS + VM_PLAYBOOKS)
    for name in PLAYBOOKS:
        plays = yaml.safe_load((folder / f"{name}.yml").read_text())
        imports = [p.get("ansible.builtin.import_playbook") for p in plays[:2]]
        first = imports[1] if imports[0] == "up.yml" else imports[0]
        assert first == "require_nodes.yml", name
    for name in VM_PLAYBOOKS:
        plays = yaml.safe_load((folder / f"{name}.yml").read_text())
        assert plays[0]["hosts"] == "localhost", name
