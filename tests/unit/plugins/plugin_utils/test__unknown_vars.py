"""Typo detection in the collection's variables (plugins/plugin_utils/_unknown_vars.py), behind
validate_job's warning (moved from the filter unknown_vars)."""

from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._unknown_vars import (
    unknown_vars,
)


def test_unknown_vars_suggests_only_settings():
    names = [
        "llamafactory_gpu_per_node",
        "launch_wait_timout",
        "launch_plan",
        "ansible_host",
        "llamafactory_job",
        "launch_zzz",
        "preflight_timout",
        "docker_engine_sourc",
    ]
    known = [
        "llamafactory_gpus_per_node",
        "launch_wait_timeout",
        "llamafactory_job",
        "preflight_timeout",
        "docker_engine_source",
    ]
    assert unknown_vars(names, known, ignore=["launch_plan", "launch_wait_result"]) == {
        "llamafactory_gpu_per_node": "llamafactory_gpus_per_node",
        "launch_wait_timout": "launch_wait_timeout",
        "launch_zzz": "",
        "preflight_timout": "preflight_timeout",
        "docker_engine_sourc": "docker_engine_source",
    }
