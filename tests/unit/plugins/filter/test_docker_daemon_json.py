"""The daemon.json merge: keys kept, nested maps merged, bad values refused with the key."""

import json

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.hostnet.llamafactory.plugins.filter.docker_daemon_json import (
    docker_daemon_json,
)

USERS = json.dumps(
    {
        "max-concurrent-downloads": 7,
        "runtimes": {"crun": {"path": "/usr/bin/crun"}},
        "log-opts": {"labels": "team"},
    }
)


def test_merge_keeps_unmanaged_keys_and_merges_nested_maps():
    merged = docker_daemon_json(
        USERS,
        {
            "runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}},
            "log-driver": "json-file",
            "log-opts": {"max-size": "100m", "max-file": "3"},
            "exec-opts": ["native.cgroupdriver=cgroupfs"],
            "bip": "172.31.0.1/16",
        },
    )
    assert merged["max-concurrent-downloads"] == 7
    assert set(merged["runtimes"]) == {"crun", "nvidia"}
    assert merged["log-opts"] == {"labels": "team", "max-size": "100m", "max-file": "3"}
    assert merged["bip"] == "172.31.0.1/16"


def test_absent_or_empty_file_is_an_empty_object():
    assert docker_daemon_json("", {"log-driver": "json-file"}) == {"log-driver": "json-file"}
    assert docker_daemon_json("  \n", {}) == {}


@pytest.mark.parametrize(
    ("current", "settings", "message"),
    [
        ("{not json", {}, "is not valid JSON"),
        ("[1, 2]", {}, "must hold a JSON object"),
        ("{}", {"bip": "x"}, r"'bip': 'x' must be the bridge's IPv4 address"),
        ("{}", {"bip": "172.31.0.1"}, r"'bip'.*with a prefix"),
        (
            "{}",
            {"default-address-pools": [{"base": "172.30.0.1/16", "size": 24}]},
            "each pool needs base",
        ),
        (
            "{}",
            {"default-address-pools": [{"base": "172.30.0.0/16", "size": 40}]},
            "each pool needs base",
        ),
        ("{}", {"exec-opts": ["native.cgroupdriver=cgroupv3"]}, "must be one of cgroupfs, systemd"),
        ("{}", {"log-opts": {"max-file": 3}}, "must be a mapping of strings"),
        ("{}", {"log-opts": {"max-size": "lots"}}, "max-size must look like 100m"),
        ("{}", {"data-root": "relative/dir"}, "must be an absolute path"),
        ("{}", {"runtimes": {"nvidia": {"args": []}}}, "runtime 'nvidia' needs path"),
        ("{}", {"default-runtime": "nvidia"}, "names no runtime in 'runtimes'"),
    ],
)
def test_bad_input_is_refused_naming_the_key(current, settings, message):
    with pytest.raises(AnsibleFilterError, match=message) as error:
        docker_daemon_json(current, settings)
    assert "nothing was changed" in str(error.value)


def test_default_runtime_may_name_a_runtime_already_in_the_file():
    current = json.dumps({"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}})
    assert docker_daemon_json(current, {"default-runtime": "nvidia"})["default-runtime"] == "nvidia"


def test_null_settings_are_left_out_and_the_layers_merge_over_them_key_by_key():
    current = '{"bip": "172.31.0.1/16", "log-opts": {"labels": "x"}}'
    merged = docker_daemon_json(
        current,
        {"bip": None, "log-driver": "json-file", "log-opts": {"max-size": "100m", "max-file": "3"}},
        over=[{"log-opts": {"max-size": "10m"}}, {"log-opts": {"max-file": "5"}, "debug": True}],
    )
    assert merged == {
        "bip": "172.31.0.1/16",  # not set by the role: the file's stays
        "log-driver": "json-file",
        "log-opts": {"labels": "x", "max-size": "10m", "max-file": "5"},
        "debug": True,
    }
    # A layer's bad value is caught like the settings' own.
    with pytest.raises(AnsibleFilterError, match="max-file"):
        docker_daemon_json("", {"log-driver": "json-file"}, over=[{"log-opts": {"max-file": 3}}])


@pytest.mark.parametrize(
    ("current", "settings"),
    [("[]", {}), ("{not json", {}), ("{}", {"bip": "x"})],
    ids=["not an object", "not JSON", "a bad value"],
)
def test_not_strict_gives_null_where_strict_fails(current, settings):
    with pytest.raises(AnsibleFilterError):
        docker_daemon_json(current, settings)
    assert docker_daemon_json(current, settings, strict=False) is None
    assert docker_daemon_json("{}", {"bip": "172.31.0.1/16"}, strict=False) == {
        "bip": "172.31.0.1/16"
    }
