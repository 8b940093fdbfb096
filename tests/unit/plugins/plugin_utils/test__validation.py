"""validate_job's pure logic (plugins/plugin_utils/_validation.py): a catalogue of bad inputs,
each refused with a problem that names the variable and says the fix; all problems at once; the
good defaults' plan; the schema read from the roles' meta/argument_specs.yml with the Python
rules merged in, each rule naming a declared variable, and a variable declared in a spec alone."""

import json
import shutil
from pathlib import Path

import pytest
import role_defaults as defaults_of
import role_docs
import yaml
from ansible_collections.hostnet.llamafactory.plugins.module_utils import (
    _network_profile as network_profile,
)
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _validation as v
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _validation_job as job
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import (
    _validation_values as values,
)

ROOT = Path(__file__).resolve().parents[4]
DEMO = ROOT / "examples" / "local-demo" / "llama3_lora_sft_ds3.yaml"
HOSTS = ["vm0", "vm1"]
KNOWN = v.spec_options(str(ROOT / "roles"))


# The roles whose templated defaults the good settings render as a play would.
SCHEMA_ROLES = ("llamafactory", "discover_network")


def local_inventory():
    """inventories/local/group_vars/llamafactory.yml, templated as the play would."""
    data = yaml.safe_load((ROOT / "inventories/local/group_vars/llamafactory.yml").read_text())
    data["llamafactory_config"] = str(DEMO)
    data["launch_results_dir"] = str(ROOT / "results")
    data["llamafactory_platform"] = "local"  # tools/localcluster sets it on every host
    return data


def good_settings(**changes):
    """The local inventory's settings (and `changes`) over the roles' defaults, the templated
    ones rendered with them (validate_job receives templated values)."""
    given = {**local_inventory(), **changes}
    settings = {n: var.default for n, var in v.schema().items() if var.default is not None}
    settings.update(defaults_of.rendered(SCHEMA_ROLES, given))
    settings["llamafactory_gcp_project"] = given.get("llamafactory_gcp_project", "")
    return settings


def check(changes=None, per_host=None, purpose="train", hosts=None, group=None, forks=25, **kw):
    settings = good_settings(**(changes or {}))
    hosts = HOSTS if hosts is None else hosts
    group = HOSTS if group is None else group
    kw.setdefault("known", KNOWN)
    return v.validate(settings, per_host or {}, hosts, group, purpose=purpose, forks=forks, **kw)


INJECTIONS = {
    "line-break": "a\nb",
    "space": "a b",
    "semicolon": "a;b",
    "subshell": "$(id)",
    "backtick": "`id`",
    "traversal": "../x",
}


def injected(variable, fix, make, per_host=False):
    """One case per injection class for a value that reaches a node."""
    cases = []
    var = v.schema()[variable]
    one_line = var.kind in ("str", "path") and var.choices is None
    for kind, text in INJECTIONS.items():
        value = make(text)
        wanted = "must be one line" if one_line and kind == "line-break" else fix
        changes, hosts = ({}, {"vm1": {variable: value}}) if per_host else ({variable: value}, None)
        cases.append(
            pytest.param(changes, hosts, "train", variable, wanted, id=f"{variable}-{kind}")
        )
    return cases


def case(id_, changes, variable, fix, per_host=None, purpose="train"):
    return pytest.param(changes, per_host, purpose, variable, fix, id=id_)


INTERFACE_FIX = "Use the NIC's name as `ip link` shows it"
PATH_FIX = "a path on the nodes may hold only letters"
CATALOGUE = [
    # -- the job-wide variables, one or more bad values each --------------------------------
    case("purpose", {"llamafactory_purpose": "deploy"}, "llamafactory_purpose", "use one of"),
    case("no-config", {"llamafactory_config": None}, "llamafactory_config", "for example"),
    case(
        "config-missing",
        {"llamafactory_config": "/nonexistent/job.yaml"},
        "llamafactory_config",
        "must name a LLaMA-Factory training YAML",
    ),
    case("job-name", {"llamafactory_job": "My Job"}, "llamafactory_job", "lower-case letters"),
    case("job-too-long", {"llamafactory_job": "a" * 49}, "llamafactory_job", "1-48"),
    case(
        "port-low",
        {"llamafactory_master_port": 80},
        "llamafactory_master_port",
        "from 1024 to 65535",
    ),
    case(
        "port-text",
        {"llamafactory_master_port": "rendezvous"},
        "llamafactory_master_port",
        "must be a whole number",
    ),
    case(
        "image-case",
        {"llamafactory_image": "Hiyouga/LlamaFactory:latest"},
        "llamafactory_image",
        "[REGISTRY/]REPOSITORY[:TAG]",
    ),
    case(
        "gpus-text",
        {"llamafactory_gpus_per_node": "two"},
        "llamafactory_gpus_per_node",
        "must be a whole number",
    ),
    case(
        "gpus-negative",
        {"llamafactory_gpus_per_node": -1},
        "llamafactory_gpus_per_node",
        "at least 0",
    ),
    case(
        "bridge",
        {"llamafactory_network_mode": "bridge"},
        "llamafactory_network_mode",
        "Set llamafactory_network_mode=host",
    ),
    case(
        "network-none",
        {"llamafactory_network_mode": "none"},
        "llamafactory_network_mode",
        "Set llamafactory_network_mode=host",
    ),
    case("platform", {"llamafactory_platform": "aws"}, "llamafactory_platform", "set it to 'gcp'"),
    case(
        "jobs-root-relative",
        {"llamafactory_jobs_root": "jobs"},
        "llamafactory_jobs_root",
        "use an absolute path",
    ),
    case("hf-cache-root", {"llamafactory_hf_cache": "/"}, "llamafactory_hf_cache", "name a folder"),
    case(
        "shared-relative",
        {"llamafactory_shared_mounts": ["data"]},
        "llamafactory_shared_mounts",
        "must list absolute folders",
    ),
    case(
        "shared-string",
        {"llamafactory_shared_mounts": "/mnt/shared"},
        "llamafactory_shared_mounts",
        "must be a list",
    ),
    case(
        "env-list",
        {"llamafactory_env": ["OMP_NUM_THREADS=1"]},
        "llamafactory_env",
        "must be a mapping",
    ),
    case(
        "env-secret",
        {"llamafactory_env": {"HF_TOKEN": "hf_abc"}},
        "llamafactory_env",
        "llamafactory_hf_token",
    ),
    case(
        "env-reserved",
        {"llamafactory_env": {"NNODES": "4", "RANK": "1"}},
        "llamafactory_env",
        "remove them",
    ),
    case(
        "env-nested",
        {"llamafactory_env": {"A": {"b": 1}}},
        "llamafactory_env",
        "give a string or a number",
    ),
    case(
        "overrides-list",
        {"llamafactory_train_overrides": ["lr=1"]},
        "llamafactory_train_overrides",
        "must be a mapping",
    ),
    case(
        "overrides-nested",
        {"llamafactory_train_overrides": {"lora": {"rank": 8}}},
        "llamafactory_train_overrides",
        "a list of them",
    ),
    case(
        "registry-user-colon",
        {"llamafactory_registry_username": "me:pw"},
        "llamafactory_registry_username",
        "has no ':'",
    ),
    case(
        "registry-password-alone",
        {"llamafactory_registry_password": "token"},
        "llamafactory_registry_password",
        "set both",
    ),
    case("pull", {"llamafactory_pull": "sometimes"}, "llamafactory_pull", "use one of"),
    case(
        "hf-endpoint",
        {"llamafactory_hf_endpoint": "hf-mirror.com"},
        "llamafactory_hf_endpoint",
        "give an http:// or https:// URL",
    ),
    case("hub-fetch", {"llamafactory_hub_fetch": "all"}, "llamafactory_hub_fetch", "use one of"),
    case("hub-timeout", {"llamafactory_hub_timeout": 0}, "llamafactory_hub_timeout", "at least 1"),
    case(
        "model-revision",
        {"llamafactory_train_overrides": {"model_revision": "../main"}},
        "llamafactory_train_overrides.model_revision",
        "give a Hub branch, tag or commit",
    ),
    case(
        "pull-timeout",
        {"llamafactory_pull_timeout": "1h"},
        "llamafactory_pull_timeout",
        "must be a whole number",
    ),
    case(
        "pull-timeout-zero",
        {"llamafactory_pull_timeout": 0},
        "llamafactory_pull_timeout",
        "at least 1",
    ),
    case(
        "progress-every",
        {"llamafactory_progress_every": 0},
        "llamafactory_progress_every",
        "at least 1",
    ),
    case(
        "stop-timeout", {"llamafactory_stop_timeout": -1}, "llamafactory_stop_timeout", "at least 0"
    ),
    case(
        "ib-disable",
        {"llamafactory_nccl_ib_disable": "maybe"},
        "llamafactory_nccl_ib_disable",
        "true or false",
    ),
    case(
        "nccl-debug", {"llamafactory_nccl_debug": "LOUD"}, "llamafactory_nccl_debug", "use one of"
    ),
    case(
        "ulimit-syntax",
        {"llamafactory_ulimits": ["memlock=-1"]},
        "llamafactory_ulimits",
        "NAME:SOFT:HARD",
    ),
    case(
        "ulimit-soft-over-hard",
        {"llamafactory_ulimits": ["nofile:10:5"]},
        "llamafactory_ulimits",
        "SOFT <= HARD",
    ),
    case(
        "allow-bridge",
        {"llamafactory_allow_bridge": "perhaps"},
        "llamafactory_allow_bridge",
        "true or false",
    ),
    case(
        "allow-public",
        {"llamafactory_allow_public_master_addr": [1]},
        "llamafactory_allow_public_master_addr",
        "true or false",
    ),
    case(
        "allow-uneven",
        {"llamafactory_allow_uneven_gpus": "x"},
        "llamafactory_allow_uneven_gpus",
        "true or false",
    ),
    case(
        "gcp-project",
        {"llamafactory_gcp_project": "My Project"},
        "llamafactory_gcp_project",
        "not a GCP project ID",
    ),
    case(
        "gcp-project-missing",
        {"llamafactory_platform": "gcp"},
        "llamafactory_gcp_project",
        "export GCP_PROJECT",
    ),
    case(
        "gcp-auth-kind",
        {"llamafactory_gcp_auth_kind": "password"},
        "llamafactory_gcp_auth_kind",
        "use one of",
    ),
    case(
        "gcp-sa-file-missing",
        {
            "llamafactory_platform": "gcp",
            "llamafactory_gcp_project": "my-project",
            "llamafactory_gcp_auth_kind": "serviceaccount",
        },
        "llamafactory_gcp_service_account_file",
        "give the key file's path",
    ),
    case(
        "gcp-sa-file-line",
        {"llamafactory_gcp_service_account_file": "/k\n.json"},
        "llamafactory_gcp_service_account_file",
        "must be one line",
    ),
    case(
        "gcp-token-missing",
        {
            "llamafactory_platform": "gcp",
            "llamafactory_gcp_project": "my-project",
            "llamafactory_gcp_auth_kind": "accesstoken",
        },
        "llamafactory_gcp_access_token",
        "gcloud auth print-access-token",
    ),
    case(
        "gcp-token-type",
        {"llamafactory_gcp_access_token": ["t"]},
        "llamafactory_gcp_access_token",
        "must be a string",
    ),
    case(
        "rank-duplicate",
        {},
        "llamafactory_node_rank",
        "hang at the rendezvous",
        per_host={"vm0": {"llamafactory_node_rank": 0}, "vm1": {"llamafactory_node_rank": 0}},
    ),
    case(
        "rank-gap",
        {},
        "llamafactory_node_rank",
        "without gaps",
        per_host={"vm0": {"llamafactory_node_rank": 0}, "vm1": {"llamafactory_node_rank": 2}},
    ),
    case(
        "rank-on-one-host",
        {},
        "llamafactory_node_rank",
        "set it on every node or on none",
        per_host={"vm1": {"llamafactory_node_rank": 1}},
    ),
    case(
        "rank-text",
        {},
        "llamafactory_node_rank",
        "must be a whole number",
        per_host={"vm0": {"llamafactory_node_rank": 0}, "vm1": {"llamafactory_node_rank": "x"}},
    ),
    case(
        "master-public",
        {"llamafactory_master_addr": "34.120.0.5"},
        "llamafactory_master_addr",
        "rank 0's internal address",
    ),
    case(
        "master-bridge",
        {"llamafactory_master_addr": "172.17.0.2"},
        "llamafactory_master_addr",
        "Docker bridge address",
    ),
    case(
        "master-loopback",
        {"llamafactory_master_addr": "127.0.0.1"},
        "llamafactory_master_addr",
        "Remove it to let discover_network",
    ),
    case(
        "uneven-gpus",
        {},
        "llamafactory_gpus_per_node",
        "llamafactory_allow_uneven_gpus=true",
        per_host={
            "vm0": {"llamafactory_gpus_per_node": 8},
            "vm1": {"llamafactory_gpus_per_node": 4},
        },
    ),
    case(
        "image-on-one-node",
        {},
        "llamafactory_image",
        "set it once for the group",
        per_host={"vm1": {"llamafactory_image": "other/image:1"}},
    ),
    case(
        "local-cluster-not-a-bool",
        {"llamafactory_local_cluster": "box"},
        "llamafactory_local_cluster",
        "true or false",
    ),
    case(
        "local-cluster-on-one-node",
        {},
        "llamafactory_local_cluster",
        "set it once for the group",
        per_host={"vm1": {"llamafactory_local_cluster": False}},
    ),
    case(
        "platform-differs",
        {},
        "llamafactory_platform",
        "one value",
        per_host={
            "vm0": {"llamafactory_platform": "gcp"},
            "vm1": {"llamafactory_platform": "local"},
        },
    ),
    # -- the other roles' variables ---------------------------------------------------------
    case("preflight-enabled", {"preflight_enabled": "x"}, "preflight_enabled", "true or false"),
    case("preflight-timeout", {"preflight_timeout": 0}, "preflight_timeout", "at least 1"),
    case("preflight-port", {"preflight_port": 80}, "preflight_port", "from 1024 to 65535"),
    case(
        "preflight-port-clash",
        {"llamafactory_master_port": 30000, "preflight_port": 30000},
        "preflight_port",
        "give another port",
    ),
    case("preflight-free", {"preflight_min_free_gb": -1}, "preflight_min_free_gb", "at least 0"),
    case("preflight-smoke", {"preflight_smoke_test": "x"}, "preflight_smoke_test", "true or false"),
    case(
        "preflight-gpu-health",
        {"preflight_gpu_health": "x"},
        "preflight_gpu_health",
        "true or false",
    ),
    case(
        "preflight-smoke-size",
        {"preflight_smoke_size_mb": 0},
        "preflight_smoke_size_mb",
        "at least",
    ),
    case(
        "preflight-container",
        {"preflight_doctor_container": "-x"},
        "preflight_doctor_container",
        "a container name is",
    ),
    case("restart", {"launch_restart_on_change": "x"}, "launch_restart_on_change", "true or false"),
    case("wait", {"launch_wait": "x"}, "launch_wait", "true or false"),
    case("wait-timeout", {"launch_wait_timeout": 0}, "launch_wait_timeout", "at least 1"),
    case("stall-timeout", {"launch_stall_timeout": -1}, "launch_stall_timeout", "at least 0"),
    case("poll-interval", {"launch_poll_interval": 0}, "launch_poll_interval", "at least 1"),
    case("results-dir", {"launch_results_dir": "/r\nx"}, "launch_results_dir", "one line"),
    case("peer-timeout", {"launch_peer_timeout": -1}, "launch_peer_timeout", "at least 0"),
    case("max-restarts", {"launch_max_restarts": 101}, "launch_max_restarts", "from 0 to 100"),
    case(
        "when-done",
        {"gcp_instances_when_done": "halt"},
        "gcp_instances_when_done",
        "use one of",
    ),
    case(
        "when-failed",
        {"gcp_instances_when_failed": "destroy"},
        "gcp_instances_when_failed",
        "use one of",
    ),
    case(
        "model-max",
        {"launch_fetch_model_max_mb": -1},
        "launch_fetch_model_max_mb",
        "at least 0",
    ),
    case(
        "delete-without-model",
        {"gcp_instances_when_done": "delete", "launch_fetch_model_max_mb": 0},
        "gcp_instances_when_done",
        "launch_fetch_model_max_mb",
    ),
    case(
        "delete-failed-without-model",
        {"gcp_instances_when_failed": "delete", "launch_fetch_model_max_mb": 0},
        "gcp_instances_when_failed",
        "to stop (the disks stay",
    ),
    case(
        "output-uri-scheme",
        {"llamafactory_output_uri": "s3://b/x"},
        "llamafactory_output_uri",
        "is not gs://BUCKET",
    ),
    case(
        "output-uri-bucket",
        {"llamafactory_output_uri": "gs://My_Bucket/x"},
        "llamafactory_output_uri",
        "Example: gs://my-bucket/llamafactory",
    ),
    case(
        "output-uri-prefix",
        {"llamafactory_output_uri": "gs://bkt/a/../b"},
        "llamafactory_output_uri",
        "empty, . or .. parts",
    ),
    case(
        "instance-label",
        {"gcp_instances_label": "Job Owner"},
        "gcp_instances_label",
        "a Compute Engine label key",
    ),
    case("instance-timeout", {"gcp_instances_timeout": 0}, "gcp_instances_timeout", "at least 1"),
    case(
        "restart-stopped",
        {"gcp_instances_restart_stopped": "maybe"},
        "gcp_instances_restart_stopped",
        "true or false",
    ),
    case(
        "capacity-retries",
        {"gcp_instances_capacity_retries": -1},
        "gcp_instances_capacity_retries",
        "at least 0",
    ),
    case(
        "max-duration",
        {"gcp_instances_max_duration": -5},
        "gcp_instances_max_duration",
        "at least 0",
    ),
    case(
        "max-duration-bridge",
        {
            "gcp_instances_max_duration": 3600,
            "llamafactory_network_mode": "bridge",
            "llamafactory_allow_bridge": True,
        },
        "gcp_instances_max_duration",
        "llamafactory_network_mode=host, or gcp_instances_max_duration=0",
    ),
    case("agent-port", {"launch_agent_port": 80}, "launch_agent_port", "from 1024 to 65535"),
    case(
        "agent-port-clash",
        {"llamafactory_master_port": 30000, "launch_agent_port": 30000},
        "launch_agent_port",
        "give another port",
    ),
    case(
        "collective-timeout",
        {"llamafactory_collective_timeout_max": 10},
        "llamafactory_collective_timeout_max",
        "at least 60",
    ),
    case(
        "rendezvous-timeout",
        {"llamafactory_rendezvous_timeout": "soon"},
        "llamafactory_rendezvous_timeout",
        "a whole number",
    ),
    case(
        "cleanup-outputs",
        {"job_admin_cleanup_outputs": "x"},
        "job_admin_cleanup_outputs",
        "true or false",
    ),
    case("fw-state", {"gcp_firewall_state": "gone"}, "gcp_firewall_state", "use one of"),
    case(
        "fw-cluster",
        {"gcp_firewall_cluster_name": "a" * 58},
        "gcp_firewall_cluster_name",
        "at most 57 characters",
    ),
    case(
        "fw-network",
        {"gcp_firewall_network": "Default"},
        "gcp_firewall_network",
        "lowercase letters",
    ),
    case(
        "fw-priority", {"gcp_firewall_priority": 70000}, "gcp_firewall_priority", "from 0 to 65535"
    ),
    case("fw-source", {"gcp_firewall_source": "all"}, "gcp_firewall_source", "use one of"),
    case("fw-tag", {"gcp_firewall_tag": "Tag"}, "gcp_firewall_tag", "lowercase letters"),
    case("fw-ranges", {"gcp_firewall_ranges": ["ten"]}, "gcp_firewall_ranges", "CIDR"),
    case(
        "fw-target-tags",
        {"gcp_firewall_target_tags": ["A"]},
        "gcp_firewall_target_tags",
        "lowercase letters",
    ),
    case(
        "fw-ssh",
        {"gcp_firewall_ssh_source_ranges": "1.2.3.4/32"},
        "gcp_firewall_ssh_source_ranges",
        "must be a list",
    ),
    case(
        "fw-timeout",
        {"gcp_firewall_operation_timeout": 0},
        "gcp_firewall_operation_timeout",
        "at least 1",
    ),
    case(
        "fw-python",
        {"gcp_firewall_python": "/usr/bin/python3\n-c"},
        "gcp_firewall_python",
        "one line",
    ),
    case(
        "dn-metadata",
        {"discover_network_gcp_metadata": "sometimes"},
        "discover_network_gcp_metadata",
        "use one of",
    ),
    case(
        "dn-url",
        {"discover_network_metadata_url": "ftp://x"},
        "discover_network_metadata_url",
        "http:// or https:// URL",
    ),
    case(
        "dn-timeout",
        {"discover_network_metadata_timeout": 0},
        "discover_network_metadata_timeout",
        "at least",
    ),
    case(
        "dn-tunnels",
        {"discover_network_include_tunnels": "x"},
        "discover_network_include_tunnels",
        "true or false",
    ),
    # -- names: renamed, removed, unknown ---------------------------------------------------
    case(
        "removed-group",
        {},
        "gcp_firewall_group",
        "Put the training VMs in that group",
        per_host={"vm0": {"gcp_firewall_group": "x"}, "vm1": {"gcp_firewall_group": "x"}},
    ),
    case(
        "typo",
        {},
        "llamafactory_gpu_per_node",
        "did you mean llamafactory_gpus_per_node?",
        per_host={"vm0": {"llamafactory_gpu_per_node": 0}},
    ),
    case(
        "typo-launch",
        {},
        "launch_wait_timout",
        "did you mean launch_wait_timeout?",
        per_host={"vm1": {"launch_wait_timout": 60}},
    ),
    case(
        "typo-preflight",
        {},
        "preflight_smoke_tset",
        "did you mean preflight_smoke_test?",
        per_host={"vm1": {"preflight_smoke_tset": True}},
    ),
    case(
        "typo-docker",
        {},
        "docker_engine_sourc",
        "did you mean docker_engine_source?",
        per_host={"vm1": {"docker_engine_sourc": "docker"}},
    ),
    # -- purposes, hosts, forks -------------------------------------------------------------
    case(
        "admin-without-job",
        {"llamafactory_config": None, "llamafactory_job": None},
        "llamafactory_job",
        "-e llamafactory_job=NAME",
        purpose="admin",
    ),
    case(
        "job-from-odd-file-name",
        {"llamafactory_config": "/srv/___.yaml", "llamafactory_job": None},
        "llamafactory_job",
        "set llamafactory_job",
        purpose="admin",
    ),
    # -- the training config ----------------------------------------------------------------
    case(
        "cpu-without-gloo",
        {"llamafactory_train_overrides": {"ddp_backend": "nccl"}},
        "llamafactory_gpus_per_node",
        "ddp_backend: gloo",
    ),
    case(
        "config-number",
        {"llamafactory_train_overrides": {"learning_rate": "fast"}},
        "llamafactory_train_overrides.learning_rate",
        "must be a number",
    ),
    case(
        "config-bool",
        {"llamafactory_train_overrides": {"do_train": "maybe"}},
        "llamafactory_train_overrides.do_train",
        "true or false",
    ),
    case(
        "config-string",
        {"llamafactory_train_overrides": {"stage": ["sft"]}},
        "llamafactory_train_overrides.stage",
        "must be a string",
    ),
    case(
        "config-path-line",
        {"llamafactory_train_overrides": {"output_dir": "/o\nx"}},
        "llamafactory_train_overrides.output_dir",
        "on one line",
    ),
]
CATALOGUE += [
    case(f"renamed-{old}", {}, old, f"set {new} instead", per_host={"vm0": {old: "x"}})
    for old, new in sorted(v.RENAMED.items())
]
# Every value written to a file, a command line or a name on a node, against every injection.
CATALOGUE += injected("llamafactory_job", "lower-case letters", lambda t: "job" + t)
CATALOGUE += injected("llamafactory_image", "not an image reference", lambda t: "img" + t)
CATALOGUE += injected("llamafactory_jobs_root", "", lambda t: "/var/lib/" + t)
CATALOGUE += injected("llamafactory_hf_cache", "", lambda t: "/var/cache/" + t)
CATALOGUE += injected("llamafactory_shared_mounts", "", lambda t: ["/mnt/" + t])
CATALOGUE += injected("llamafactory_env", "rename it", lambda t: {"VAR" + t: "1"})
CATALOGUE += injected("llamafactory_train_overrides", "fix the name", lambda t: {"lr" + t: 1})
CATALOGUE += injected("llamafactory_hf_token", "copy the token", lambda t: "hf_" + t)
CATALOGUE += injected("llamafactory_ulimits", "NAME:SOFT:HARD", lambda t: ["nofile" + t + ":1:1"])
CATALOGUE += injected("llamafactory_interface", INTERFACE_FIX, lambda t: "e" + t, per_host=True)
CATALOGUE += injected("llamafactory_master_interface", INTERFACE_FIX, lambda t: "e" + t, True)
CATALOGUE += injected("llamafactory_master_addr", "not an IP address", lambda t: "10.0.0.1" + t)
CATALOGUE += injected("llamafactory_nccl_debug", "use one of", lambda t: "INFO" + t)
CATALOGUE += injected("preflight_doctor_container", "a container name", lambda t: "c" + t)
CATALOGUE += injected("gcp_firewall_cluster_name", "lowercase letters", lambda t: "c" + t)
CATALOGUE += injected("gcp_firewall_network", "lowercase letters", lambda t: "n" + t)
CATALOGUE += injected("gcp_firewall_tag", "lowercase letters", lambda t: "t" + t)
CATALOGUE += injected("gcp_firewall_target_tags", "lowercase letters", lambda t: ["t" + t])
CATALOGUE += injected("llamafactory_gcp_project", "not a GCP project ID", lambda t: "proj" + t)
CATALOGUE += injected("llamafactory_output_uri", "Example: gs://my-", lambda t: "gs://bkt/" + t)
# A line break in an env value would add a line to the 0600 env file (the only way the other
# characters matter: Docker reads --env-file values literally, no shell sees them).
CATALOGUE += [
    case(
        "env-value-line-break",
        {"llamafactory_env": {"A": "1\nMASTER_ADDR=6.6.6.6"}},
        "llamafactory_env",
        "Give one line",
    ),
    case(
        "env-value-carriage-return",
        {"llamafactory_env": {"A": "1\rB=2"}},
        "llamafactory_env",
        "Give one line",
    ),
    case(
        "env-value-nul", {"llamafactory_env": {"A": "1\x00"}}, "llamafactory_env", "Give one line"
    ),
    case(
        "network-profile-unknown",
        {"llamafactory_network_profile": "rdma"},
        "llamafactory_network_profile",
        "use one of 'auto', 'socket', 'tcpxo', 'gib'",
    ),
    case(
        "network-profile-mixed",
        {},
        "llamafactory_network_profile",
        "the job has one value",
        per_host={"vm1": {"llamafactory_network_profile": "gib"}},
    ),
    case(
        "network-profile-on-bridge",
        {
            "llamafactory_network_profile": "tcpxo",
            "llamafactory_network_mode": "bridge",
            "llamafactory_allow_bridge": True,
        },
        "llamafactory_network_profile",
        "needs llamafactory_network_mode=host",
    ),
    case(
        "registry-user-line-break",
        {"llamafactory_registry_username": "me\nx"},
        "llamafactory_registry_username",
        "must be one line",
    ),
    case(
        "registry-user-space",
        {"llamafactory_registry_username": "me x"},
        "llamafactory_registry_username",
        "no ':'",
    ),
]


@pytest.mark.parametrize(("changes", "per_host", "purpose", "variable", "fix"), CATALOGUE)
def test_bad_input_is_refused_naming_the_variable_and_the_fix(
    changes, per_host, purpose, variable, fix
):
    plan, problems = check(changes, per_host, purpose=purpose)
    assert plan is None
    assert problems, "nothing refused"
    named = [p for p in problems if variable in p]
    assert named, problems
    assert any(fix in p for p in named), named
    if fix == "":  # the path cases: one message says what a node path may hold
        assert any(
            "a path on the nodes may hold only" in p or "'..' component" in p for p in named
        ), named


def test_the_catalogue_is_large_and_covers_every_schema_variable():
    assert len(CATALOGUE) >= 50
    covered = {p.values[3].split(".")[0] for p in CATALOGUE}
    missing = sorted(set(v.schema()) - covered)
    assert missing == [], missing


def test_secrets_are_not_shown():
    _plan, problems = check({"llamafactory_hf_token": "hf_secret value"})
    assert problems and "secret value" not in " ".join(problems)
    _plan, problems = check({"llamafactory_registry_password": ["hunter2"]})
    assert problems and "hunter2" not in " ".join(problems)


def test_every_problem_is_reported_at_once():
    changes = {
        "llamafactory_job": "My Job",
        "llamafactory_master_port": 80,
        "llamafactory_image": "Bad Image",
        "llamafactory_env": {"A": "1\n2", "RANK": "0"},
        "llamafactory_jobs_root": "/var/$(id)",
        "launch_wait_timeout": 0,
    }
    per_host = {
        "vm0": {"launch_hf_token": "x", "llamafactory_gpu_per_node": 1},
        "vm1": {"llamafactory_interface": "eth0;reboot"},
    }
    plan, problems = check(changes, per_host, hosts=["vm0"], forks=1, play_names=["launch_wiat"])
    assert plan is None
    text = "\n".join(problems)
    for fragment in [
        "llamafactory_job 'My Job'",
        "llamafactory_master_port is 80",
        "llamafactory_image 'Bad Image'",
        "llamafactory_env sets A to a value with a line break",
        "llamafactory_env sets RANK",
        "llamafactory_jobs_root is '/var/$(id)'",
        "launch_wait_timeout is 0",
        "launch_hf_token was renamed llamafactory_hf_token (set in: vm0)",
        "unknown variable llamafactory_gpu_per_node",
        "unknown variable launch_wiat (did you mean launch_wait?) (set in: play vars)",
        "llamafactory_interface of vm1 is 'eth0;reboot'",
        "--limit leaves out vm1",
    ]:
        assert fragment in text, fragment
    assert len(problems) == len(set(problems)) >= 12


def test_the_good_defaults_give_the_expected_plan():
    plan, problems = check()
    assert problems == []
    # sha1("demo") starts 89e495 = 9036949; 9036949 % 500 = 449.
    assert plan["master_port"] == 29949
    assert plan["preflight_port"] == 49949
    job_dir = "/var/lib/llamafactory/jobs/demo"
    excluded = ("config", "copies", "digest", "notes", "warnings")
    # the demo's model and data are on the controller
    assert (plan["hub"], plan["files"], plan["hub_offline"]) == ([], [], True)
    excluded += ("hub", "files", "hub_offline")
    assert {k: plan[k] for k in plan if k not in excluded} == {
        "job": "demo",
        "purpose": "train",
        "master_port": 29949,
        "preflight_port": 49949,
        "agent_port": 39949,
        "jobs_root": "/var/lib/llamafactory/jobs",
        "job_dir": job_dir,
        "output_dir": job_dir + "/output",
        "output_uri": "",
        "container": "llamafactory-demo",
        "nodes": ["vm0", "vm1"],
        "ranks": {"vm0": 0, "vm1": 1},
        "master": "vm0",
        "nproc": 1,
        "platform": "local",
        "gpus_per_node": {"vm0": 0, "vm1": 0},
    }
    assert plan["config"]["output_dir"] == job_dir + "/output"
    assert plan["config"]["deepspeed"] == job_dir + "/deepspeed.json"
    assert plan["config"]["ddp_backend"] == "gloo"
    assert [c["key"] for c in plan["copies"]][-1] == "deepspeed"
    assert len(plan["digest"]) == 16
    assert (
        f"output_dir saves/tiny-llama/lora/sft becomes {job_dir}/output on every node"
        in (plan["notes"])
    )
    json.dumps(plan)  # a fact: plain data


def test_the_job_name_and_port_come_from_the_config_file_name(tmp_path):
    config = tmp_path / "Llama3 LoRA_SFT.yaml"
    config.write_text(
        DEMO.read_text().replace("ds_z3_config.json", str(DEMO.parent / "ds_z3_config.json"))
    )
    plan, problems = check({"llamafactory_config": str(config), "llamafactory_job": None})
    assert problems == []
    assert plan["job"] == "llama3-lora-sft"
    assert plan["master_port"] == job.derive_master_port("llama3-lora-sft")
    plan, problems = check({"llamafactory_master_port": 45000, "preflight_port": None})
    assert problems == []
    assert (plan["master_port"], plan["preflight_port"]) == (45000, 25000)
    plan, problems = check({"llamafactory_master_port": 58000})
    assert (plan["preflight_port"], plan["agent_port"]) == (38000, 48000)


def test_a_ddp_timeout_above_the_ceiling_is_lowered_with_a_warning():
    """The demo's config keeps upstream's ddp_timeout: 180000000 (5.7 years)."""
    plan, problems = check()
    assert problems == []
    assert plan["config"]["ddp_timeout"] == 3600
    assert plan["warnings"] == [
        "ddp_timeout 180000000 in llama3_lora_sft_ds3.yaml is lowered to 3600 s "
        "(llamafactory_collective_timeout_max): a collective that hangs longer fails the job "
        "instead of waiting for years; raise llamafactory_collective_timeout_max if a single "
        "step or save really takes longer"
    ]
    plan, problems = check(
        {
            "llamafactory_collective_timeout_max": 7200,
            "llamafactory_train_overrides": {"ddp_timeout": 600},
        }
    )
    assert problems == [] and plan["config"]["ddp_timeout"] == 600 and plan["warnings"] == []


def test_admin_and_doctor_do_not_read_the_config():
    plan, problems = check(
        {"llamafactory_config": None, "llamafactory_job": "other"}, purpose="admin"
    )
    assert problems == [] and plan["job_dir"] == "/var/lib/llamafactory/jobs/other"
    assert "config" not in plan and plan["container"] == "llamafactory-other"
    plan, problems = check(
        {"llamafactory_config": None, "llamafactory_job": None}, purpose="doctor"
    )
    assert problems == []
    assert (plan["job"], plan["job_dir"], plan["container"]) == (
        "",
        "/var/lib/llamafactory/jobs/.doctor",
        "",
    )
    # admin may act on part of the group; train and doctor may not.
    plan, problems = check({"llamafactory_job": "other"}, purpose="admin", hosts=["vm1"])
    assert problems == [] and plan["nodes"] == ["vm1"] and plan["ranks"] == {"vm0": 0, "vm1": 1}
    _plan, problems = check(purpose="doctor", hosts=["vm1"])
    assert any("--limit leaves out vm0" in p for p in problems)


def test_hosts_and_forks():
    _plan, problems = check(group=[], hosts=[])
    assert any("no hosts in the group 'llamafactory'" in p for p in problems)
    _plan, problems = check(hosts=["vm0", "vm1", "web"])
    assert any("web is not in the group 'llamafactory'" in p for p in problems)
    # With host networking the wait holds one fork (rank 0's agent watches the others).
    assert check(forks=1)[1] == []
    bridge = {"llamafactory_network_mode": "bridge", "llamafactory_allow_bridge": True}
    _plan, problems = check(bridge, forks=1)
    assert any(
        "forks is 1 but the job has 2 nodes and llamafactory_network_mode bridge" in p
        for p in problems
    ), problems
    assert check({**bridge, "launch_wait": False}, forks=1)[1] == []


def test_a_stopped_vm_is_refused_by_name_before_any_node_is_contacted():
    zone = "https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-a"
    running = {"status": "RUNNING", "zone": zone}
    stopped = {"vm0": running, "vm1": {"status": "TERMINATED", "zone": zone}}
    for purpose in ("train", "doctor"):
        _plan, problems = check(purpose=purpose, instances=stopped)
        assert problems == [
            "vm1 is TERMINATED in Compute Engine (gcp_status, from the dynamic inventory), not "
            "RUNNING: it cannot take part in the job. Start it (gcloud compute instances start "
            "vm1 --zone us-central1-a), or take it out of the job (remove its "
            "llamafactory=training label), then run again."
        ]
    assert check(instances={"vm0": running, "vm1": running})[1] == []
    assert check(purpose="admin", instances=stopped, changes={"llamafactory_job": "x"})[1] == []


def test_delete_is_refused_only_where_the_vms_disks_hold_the_only_copy():
    """The data-loss guard: deleting the VMs needs the outputs in the bucket or the model
    brought to the controller."""
    for when in ("gcp_instances_when_done", "gcp_instances_when_failed"):
        _plan, problems = check({when: "delete", "launch_fetch_model_max_mb": 0})
        assert [p for p in problems if p.startswith(when + " is delete")], problems
        assert "Set llamafactory_output_uri (gs://BUCKET/PREFIX" in problems[0]
        assert check({when: "delete"})[1] == []  # the model comes home (the default)
        durable = {when: "delete", "launch_fetch_model_max_mb": 0}
        durable["llamafactory_output_uri"] = "gs://my-bucket/runs"
        assert check(durable)[1] == []
        assert check({when: "stop", "launch_fetch_model_max_mb": 0})[1] == []


def test_facts_and_role_values_are_not_reported():
    per_host = {h: {"llamafactory_job_plan": {}} for h in HOSTS}
    assert check(per_host=per_host)[1] == []
    assert check(per_host={"vm0": {"launch_plan": 1}}, ignore=["launch_plan"])[1] == []


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("- stage: sft\n", "is not a LLaMA-Factory config"),
        ("stage: [sft\n", "must name a LLaMA-Factory training YAML"),
        ("model_name_or_path: m\n", "has no 'stage'"),
        ("stage: sft\n", "has no 'model_name_or_path'"),
        ("stage: sft\nmodel_name_or_path: m\nlearning_rate: fast\n", "must be a number"),
        ("stage: sft\nmodel_name_or_path: m\ndeepspeed: dsdir\n", "is a folder"),
        ("stage: sft\nmodel_name_or_path: m\ndeepspeed: bad.json\n", "is not valid JSON"),
    ],
)
def test_bad_training_configs(tmp_path, content, fragment):
    (tmp_path / "dsdir").mkdir()
    (tmp_path / "bad.json").write_text("{not json")
    config = tmp_path / "job.yaml"
    config.write_text(content)
    plan, problems = check({"llamafactory_config": str(config), "llamafactory_gpus_per_node": 1})
    assert plan is None
    assert any("llamafactory_config" in p and fragment in p for p in problems), problems


@pytest.mark.parametrize("local", [False, True])
def test_the_templated_defaults_of_either_platform_pass(local):
    # validate_job receives the play's templated values: the defaults that follow
    # llamafactory_local_cluster arrive as their GCP or their local value, both valid.
    settings = good_settings(llamafactory_local_cluster=local)
    assert settings["llamafactory_ulimits"] == (
        [] if local else ["memlock:-1:-1", "stack:67108864:67108864", "nofile:1048576:1048576"]
    )
    assert settings["discover_network_gcp_metadata"] == ("always" if local else "auto")
    plan, problems = check({"llamafactory_local_cluster": local})
    assert problems == [] and plan is not None


# -- the schema: the roles' argument specs with the Python rules merged in ----------------

ROLES_DIR = ROOT / "roles"
KINDS = ("str", "path", "int", "float", "bool", "list", "dict")


def spec_of(role, roles_dir=ROLES_DIR):
    path = roles_dir / role / "meta" / "argument_specs.yml"
    if not path.exists():
        return None
    options = {}
    for entry in yaml.safe_load(path.read_text())["argument_specs"].values():
        options.update(entry.get("options") or {})
    return options


def rules_without_a_spec(roles_dir=ROLES_DIR):
    """The Python rules whose variable no checked role's spec declares."""
    return sorted(set(v.RULES) - set(v.schema(str(roles_dir))))


def options_lacking(roles_dir=ROLES_DIR):
    """What validation needs and a checked role's spec option lacks: a description, a type it
    knows, a list's elements, a literal default that passes its own checks."""
    found = []
    for role in v.ROLES:
        for name, option in (spec_of(role, roles_dir) or {}).items():
            if option.get("required"):
                continue  # a parameter of an entry point (tasks_from), not a setting
            if not option.get("description"):
                found.append(f"{name} ({role}) has no description")
            if option.get("type") not in KINDS:
                found.append(f"{name} ({role}) has no type validation knows: {KINDS}")
                continue
            if option["type"] == "list" and not option.get("elements"):
                found.append(f"{name} ({role}) is a list without elements")
            default = option.get("default")
            if default is not None and not v.templated(default):
                var = v.schema(str(roles_dir))[name]
                problems = values.check_value(var, default)[1]
                found += [f"{name} ({role}): its default fails: {p}" for p in problems]
    return found


def test_every_rule_names_a_variable_a_spec_declares():
    assert rules_without_a_spec() == []
    for name, rule in v.RULES.items():
        assert set(rule) <= set(v.RULE_FIELDS), name
        assert rule.get("choices", None) is None, f"{name}: choices belong in the spec"


def test_every_checked_spec_option_has_what_validation_needs():
    assert options_lacking() == []


def test_the_schema_checks_catch_a_rule_or_an_option_without_its_spec(tmp_path):
    roles = tmp_path / "roles"
    shutil.copytree(ROLES_DIR, roles, ignore=shutil.ignore_patterns("files", "templates"))
    path = roles / "launch" / "meta" / "argument_specs.yml"
    specs = yaml.safe_load(path.read_text())
    options = specs["argument_specs"]["settings"]["options"]
    del options["launch_peer_timeout"]
    options["launch_colour"] = {"description": "A colour.", "type": "list"}
    options["launch_shade"] = {"type": "text", "default": "dark"}
    options["launch_poll_interval"]["default"] = 0
    path.write_text(yaml.safe_dump(specs, sort_keys=False))
    assert rules_without_a_spec(roles) == ["launch_peer_timeout"]
    assert options_lacking(roles) == [
        "launch_poll_interval (launch): its default fails: launch_poll_interval is 0: it must be "
        "at least 1",
        "launch_colour (launch) is a list without elements",
        "launch_shade (launch) has no description",
        f"launch_shade (launch) has no type validation knows: {KINDS}",
    ]


def test_the_checked_roles_are_llamafactory_and_the_roles_that_depend_on_it():
    dependents = set()
    for meta in ROLES_DIR.glob("*/meta/main.yml"):
        needs = yaml.safe_load(meta.read_text()).get("dependencies") or []
        if "hostnet.llamafactory.llamafactory" in [
            d["role"] if isinstance(d, dict) else d for d in needs
        ]:
            dependents.add(meta.parent.parent.name)
    assert set(v.ROLES) == {"llamafactory"} | dependents
    assert {var.role for var in v.schema().values()} == set(v.ROLES)


def test_the_choices_python_judges_are_the_specs():
    assert v.schema()["llamafactory_purpose"].choices == v.PURPOSES
    assert v.schema()["llamafactory_network_profile"].choices == network_profile.CHOICES
    # Judged per node by the platform step, with the fix (the rules' choices=None).
    assert KNOWN["llamafactory_platform"]["choices"] == ["gcp", "local"]
    assert KNOWN["llamafactory_network_mode"]["choices"] == ["host", "bridge"]
    assert v.schema()["llamafactory_platform"].choices is None


@pytest.mark.parametrize("role", sorted(p.parent.name for p in ROLES_DIR.glob("*/meta")))
def test_each_roles_defaults_are_generated_from_its_spec(role):
    wanted = role_docs.render_defaults(ROLES_DIR / role)
    path = ROLES_DIR / role / "defaults" / "main.yml"
    assert (path.read_text() if path.exists() else None) == wanted, (
        f"roles/{role}/defaults/main.yml is not its spec's: run python tools/role_docs.py"
    )


def test_a_variable_declared_in_a_spec_alone_is_validated(tmp_path):
    """One declaration: an option added to a copy of launch's spec is known to the validation
    - its type, choices and default enforced, its name accepted - and gets its default in the
    generated defaults/main.yml, with no change to the Python."""
    roles = tmp_path / "roles"
    shutil.copytree(ROLES_DIR, roles, ignore=shutil.ignore_patterns("files", "templates"))
    path = roles / "launch" / "meta" / "argument_specs.yml"
    specs = yaml.safe_load(path.read_text())
    specs["argument_specs"]["settings"]["options"]["launch_colour"] = {
        "description": "The colour of the progress lines. Red or blue.",
        "type": "str",
        "choices": ["red", "blue"],
        "default": "red",
    }
    specs["argument_specs"]["settings"]["options"]["launch_shades"] = {
        "description": "How many shades.",
        "type": "int",
        "default": 3,
    }
    path.write_text(yaml.safe_dump(specs, sort_keys=False))
    known = v.spec_options(str(roles))

    def problems(changes):
        return check(changes, known=known, roles_dir=str(roles))[1]

    assert problems({"launch_colour": "blue", "launch_shades": "4"}) == []
    assert problems({"launch_colour": "green"}) == [
        "launch_colour is 'green': use one of 'red', 'blue'"
    ]
    assert problems({"launch_shades": "many"}) == [
        "launch_shades is 'many': it must be a whole number"
    ]
    assert problems({"launch_colour": None}) == [
        "launch_colour is empty (null): give a value or remove it to get the default"
    ]
    var = v.schema(str(roles))["launch_colour"]
    assert (var.kind, var.default, var.choices, var.role) == (
        "str",
        "red",
        ("red", "blue"),
        "launch",
    )
    assert "# The colour of the progress lines.\nlaunch_colour: red\n" in role_docs.render_defaults(
        roles / "launch"
    )
    # Set by the user, the name is known with the spec and unknown without it.
    assert check(play_names=["launch_colour"], known=known, roles_dir=str(roles))[1] == []
    assert any(
        p.startswith("unknown variable launch_colour")
        for p in check(play_names=["launch_colour"])[1]
    )


def test_known_names_come_from_every_roles_spec():
    known = v.spec_options(str(ROOT / "roles"))
    on_disk = sorted(p.parent.parent.name for p in ROOT.glob("roles/*/meta/argument_specs.yml"))
    assert "llamafactory" in on_disk
    for role in on_disk:
        assert set(spec_of(role)) <= set(known), role


def test_a_role_without_a_main_spec_is_checked_by_validate_job():
    # Ansible checks a role's `main` spec on every node each time the role is entered; a role
    # documents its settings under another entry point only when validate_job (role
    # llamafactory, its dependency) checks every one of them once, before any node is touched.
    documented_only = []
    for path in sorted(ROOT.glob("roles/*/meta/argument_specs.yml")):
        role = path.parts[-3]
        specs = yaml.safe_load(path.read_text())["argument_specs"]
        if "main" in specs:
            continue
        documented_only.append(role)
        assert "settings" in specs, role
        if role != "llamafactory":
            meta = yaml.safe_load((ROOT / "roles" / role / "meta" / "main.yml").read_text())
            needs = [d["role"] if isinstance(d, dict) else d for d in meta["dependencies"]]
            assert "hostnet.llamafactory.llamafactory" in needs, role
        assert not [name for name in specs["settings"]["options"] if name not in v.schema()], role
    assert "launch" in documented_only and "docker_engine" not in documented_only


def test_the_names_the_collections_tasks_set_are_read_from_its_task_files(tmp_path):
    """validate_job leaves these out of a host's settings when it runs again later in a playbook
    (read from the task files, not from Ansible's fact caches)."""
    names = v.task_set_names()
    # register, set_fact (in blocks and rescues too), and the playbooks' tasks.
    assert {"launch_results", "launch_before", "job_admin_model", "docker_engine_seen"} <= names
    assert {"discover_network_rank", "gcp_instances_kept_why", "launch_failure"} <= names
    assert "cacheable" not in names and "llamafactory_job" not in names
    roles = tmp_path / "roles"
    (roles / "r" / "tasks").mkdir(parents=True)
    (tmp_path / "playbooks").mkdir()
    (roles / "r" / "tasks" / "main.yml").write_text(
        "- block:\n"
        "    - ansible.builtin.set_fact: {r_a: 1, cacheable: true}\n"
        "  rescue:\n"
        "    - {ansible.builtin.command: x, register: r_b}\n"
    )
    (tmp_path / "playbooks" / "p.yml").write_text(
        "- hosts: all\n  tasks:\n    - set_fact: {p_c: 1}\n"
    )
    assert v.task_set_names(str(roles)) == {"r_a", "r_b", "p_c"}


def test_the_fast_yaml_loader_reads_every_spec_and_task_file_as_pyyaml_does():
    paths = [*ROOT.glob("roles/*/meta/argument_specs.yml"), *ROOT.glob("roles/*/tasks/*.yml")]
    assert len(paths) > 40
    for path in paths:
        assert v.read_yaml(str(path)) == yaml.safe_load(path.read_text()), path
