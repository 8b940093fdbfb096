"""The local cluster differs from GCP by one setting: inventories/local/group_vars holds the demo
job's settings and llamafactory_local_cluster, nothing else, and that flag means exactly its four
documented things (roles/llamafactory/README.md)."""

import re
from pathlib import Path

import pytest
import role_defaults
import yaml

ROOT = Path(__file__).resolve().parents[3]
GROUP_VARS = ROOT / "inventories" / "local" / "group_vars" / "llamafactory.yml"
FLAG = "llamafactory_local_cluster"
# The demo job's own settings: what any GCP user of the job would set too.
JOB_SETTINGS = {
    "llamafactory_config",
    "llamafactory_job",
    "llamafactory_image",
    "llamafactory_gpus_per_node",
    "llamafactory_env",
    "launch_wait_timeout",
    "launch_stall_timeout",
    "launch_poll_interval",
    "llamafactory_progress_every",
    "launch_results_dir",
}
ROLES = ("llamafactory", "nccl_plugin", "discover_network")
GCP = {
    "llamafactory_ulimits": ["memlock:-1:-1", "stack:67108864:67108864", "nofile:1048576:1048576"],
    "nccl_plugin_rxdm_privileged": True,
    "discover_network_gcp_metadata": "auto",
}
LOCAL = {
    "llamafactory_ulimits": [],
    "nccl_plugin_rxdm_privileged": False,
    "discover_network_gcp_metadata": "always",
}


def test_the_local_group_vars_are_the_jobs_settings_and_the_one_flag():
    settings = yaml.safe_load(GROUP_VARS.read_text())
    box_only = sorted(set(settings) - JOB_SETTINGS)
    assert box_only == [FLAG], (
        f"{GROUP_VARS.relative_to(ROOT)} holds {box_only}: the local cluster's differences from "
        f"GCP follow from {FLAG} alone (roles/llamafactory/README.md); make a new one follow it "
        "too, or add a job setting to JOB_SETTINGS"
    )
    assert settings[FLAG] is True
    assert set(settings) >= JOB_SETTINGS


@pytest.mark.parametrize(
    ("given", "expected"),
    [({}, GCP), ({FLAG: False}, GCP), ({FLAG: True}, LOCAL)],
    ids=["unset", "false", "true"],
)
def test_the_flag_selects_the_gcp_or_the_local_defaults(given, expected):
    defaults = role_defaults.rendered(ROLES, given)
    assert defaults[FLAG] is given.get(FLAG, False)
    assert {name: defaults[name] for name in expected} == expected


def test_a_value_set_explicitly_wins_over_the_flag():
    given = {FLAG: True, "llamafactory_ulimits": ["nofile:1024:1024"]}
    assert role_defaults.rendered(ROLES, given)["llamafactory_ulimits"] == ["nofile:1024:1024"]


def test_nccl_plugin_on_its_own_is_gcps():
    # nccl_plugin does not depend on role llamafactory: without the flag defined it is GCP's.
    assert role_defaults.rendered(["nccl_plugin"])["nccl_plugin_rxdm_privileged"] is True


def uses_of_the_flag():
    """(file, line) of every non-comment line of the roles' and playbooks' YAML that reads or
    sets the flag, outside the docs (meta/argument_specs.yml)."""
    found = []
    for path in sorted([*ROOT.glob("roles/**/*.yml"), *ROOT.glob("playbooks/**/*.yml")]):
        if path.parent.name == "meta":
            continue
        for line in path.read_text().splitlines():
            if FLAG in line and not line.lstrip().startswith("#"):
                found.append((str(path.relative_to(ROOT)), line.strip()))
    return found


def test_the_flag_means_exactly_its_four_things():
    # 1 ulimits, 2 RxDM privileged, 3 the metadata server, 4 PCI addresses from NIC names (both
    # discovery calls: rank 0's with the master's value); and the flag's own default.
    uses = uses_of_the_flag()
    assert [(path, line.split(":")[0]) for path, line in uses] == [
        ("roles/discover_network/defaults/main.yml", "discover_network_gcp_metadata"),
        ("roles/discover_network/tasks/nodes.yml", "pci_slots_from_names"),
        ("roles/discover_network/tasks/rank0.yml", "pci_slots_from_names"),
        ("roles/llamafactory/defaults/main.yml", FLAG),
        ("roles/llamafactory/defaults/main.yml", "llamafactory_ulimits"),
        ("roles/nccl_plugin/defaults/main.yml", "nccl_plugin_rxdm_privileged"),
    ], uses
    own, master = [line for path, line in uses if "discover_network/tasks/" in path]
    assert re.search(rf"master\.{FLAG} \| default\({FLAG}\)", master), master
    assert "master." not in own
