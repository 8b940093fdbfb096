"""Network profiles: the choice per machine type, the NICs found as Google's scripts find them, and
the rendered environment against the values of Google's recipes
(tests/unit/fixtures/network_profile/recipes.json, each with its source)."""

import json
import re
from pathlib import Path

import pytest
import yaml
from ansible_collections.hostnet.llamafactory.plugins.module_utils import (
    _network_profile as profiles,
)

RECIPES = json.loads(
    (
        Path(__file__).resolve().parents[2] / "fixtures" / "network_profile" / "recipes.json"
    ).read_text()
)["recipes"]


def nic(name, slot=None, mtu=1460, up=True, address="10.0.0.2"):
    return {
        "name": name,
        "up": up,
        "mtu": mtu,
        "ipv4": [(address, 32)] if address else [],
        "pci_slot": slot,
    }


# The netdevs of each machine type as its recipe names them; PCI addresses from the recipes
# (A3 High, A3 Mega: the GPU NICs; enp0s12 is 00:0c.0 by its name's scheme, enp0s19 00:13.0,
# enp192s20 c0:14.0).
A3_MEGA_SLOTS = ["06", "07", "0d", "0e", "86", "87", "8d", "8e"]
LAYOUTS = {
    "a3-megagpu-8g": [nic("lo"), nic("enp0s12", "0000:00:0c.0", mtu=8244)]
    + [nic(f"enp{int(b, 16)}s0", f"0000:{b}:00.0", mtu=8244) for b in A3_MEGA_SLOTS]
    + [nic("docker0", address="172.17.0.1")],
    "a3-highgpu-8g": [nic("enp0s12", "0000:00:0c.0", mtu=8244)]
    + [nic(f"enp{int(b, 16)}s0f0", f"0000:{b}:00.0") for b in ("06", "0c", "86", "8c")],
    "a3-ultragpu-8g": [
        nic("enp0s19", "0000:00:13.0", mtu=8896),
        nic("enp192s20", "0000:c0:14.0", mtu=8896, address="10.1.0.2"),
    ]
    + [nic(f"gpu{i}rdma0", f"0000:{0x91 + i:02x}:00.0", mtu=8896) for i in range(8)],
}
LAYOUTS["a4-highgpu-8g"] = LAYOUTS["a3-ultragpu-8g"]
RDMA = {t: [n["name"] for n in LAYOUTS[t] if "rdma" in n["name"]] for t in LAYOUTS}


SOURCE = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{40}:[\w./-]+$")


def quoted_values(recipe):
    """(what, {value, line}) of every recipe value of the fixture."""
    for key, entry in recipe["env"].items():
        yield key, entry
    for key in ("sources_script", "ld_library_path"):
        if key in recipe:
            yield key, recipe[key]
    for entry in recipe["mounts"]:
        yield "mount", entry
    checker = recipe.get("guest_config_checker") or {}
    for entry in checker.get("lines", []):
        yield "guest config", entry
    if checker:
        yield "guest config env", checker["env"]


def test_every_fixture_value_quotes_its_source_line():
    # Quotes, not paraphrases: the file and commit, the line's number and its exact text.
    for recipe in RECIPES:
        assert SOURCE.match(recipe["source"]), recipe["source"]
        quotes = {q["line"]: q["text"] for q in recipe["quotes"]}
        for what, entry in quoted_values(recipe):
            assert set(entry) == {"value", "line"}, (recipe["source"], what)
            assert entry["line"] in quotes, (recipe["source"], what, entry)
            assert entry["value"] in quotes[entry["line"]], (recipe["source"], what, entry)


def test_a_fixture_value_without_its_quote_is_refused():
    recipe = json.loads(json.dumps(RECIPES[0]))
    recipe["env"]["NCCL_FASTRAK_CTRL_DEV"] = {"value": "enp0s12"}
    with pytest.raises(AssertionError):
        for what, entry in quoted_values(recipe):
            assert set(entry) == {"value", "line"}, what


def container_side(volume):
    parts = volume.split(":")
    return parts[1] if len(parts) > 1 else parts[0]


@pytest.mark.parametrize(
    "recipe", RECIPES, ids=lambda r: r["machine_type"] + "-" + r["source"].split("/")[1][:20]
)
def test_rendered_env_matches_googles_recipe(recipe):
    machine = recipe["machine_type"]
    profile, why = profiles.choose_profile("auto", machine)
    assert why == f"machine type {machine}"
    found = profiles.find_nics(profile, machine, LAYOUTS[machine], RDMA[machine])
    assert found["problems"] == []
    setup = profiles.rank_setup(
        profile, found["control"][0], found["control"], found["gpu"], machine_type=machine
    )
    for key, entry in recipe["env"].items():
        ours, value = setup["env"][key], entry["value"]
        # NCCL_SOCKET_IFNAME in the exact-name form ("=a,b"): the same NICs, no prefix match.
        assert ours.lstrip("=") == value if key == "NCCL_SOCKET_IFNAME" else ours == value, key
    if "sources_script" in recipe:
        assert setup["env_script"] == recipe["sources_script"]["value"]
    if "ld_library_path" in recipe:
        wanted = recipe["ld_library_path"]["value"].split(":")
        assert setup["library_path"][:1] == wanted[:1]
    inside = {container_side(volume) for volume in setup["volumes"]}
    for entry in recipe["mounts"]:
        assert container_side(entry["value"]).rstrip("/") in inside, entry
    for key in recipe.get("unset", []):
        assert key not in setup["env"], key
    checker = recipe.get("guest_config_checker")
    if checker:
        name = setup["env"]["NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE"]
        assert name.startswith(profiles.CONTAINER_DIRS[profile] + "/")
        rule = profiles.GUEST_CONFIG_CHECKS_DISABLED[machine]
        assert name.endswith("/" + rule["file"])
        assert rule["lines"] == [entry["value"] for entry in checker["lines"]]
    assert "NCCL_IB_DISABLE" not in setup["env"]


def test_gib_mounts_the_hosts_folder_where_googles_script_looks():
    # set_nccl_env.sh hard-codes /usr/local/gib/configs: the host's /var/lib/gib (where the
    # installer image writes) is seen there; the preflight looks for the host's paths.
    setup = profiles.rank_setup("gib", "enp0s19", ["enp0s19"], ["gpu0rdma0"])
    assert setup["volumes"] == ["/var/lib/gib:/usr/local/gib:ro"]
    assert setup["env_script"] == "/usr/local/gib/scripts/set_nccl_env.sh"
    assert setup["library_path"][0] == "/usr/local/gib/lib64"
    assert {"path": "/var/lib/gib/scripts/set_nccl_env.sh", "kind": "env_script"} in setup["paths"]
    assert {"path": "/var/lib/gib", "kind": "volume"} in setup["paths"]


def test_a3_high_points_the_guest_config_checker_at_its_own_file():
    setup = profiles.rank_setup(
        "tcpxo", "enp0s12", ["enp0s12"], ["enp6s0f0"], machine_type="a3-highgpu-8g"
    )
    name = "hostnet-a3high-guest-config.textproto"
    assert setup["env"]["NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE"] == (
        f"/var/lib/tcpxo/lib64/{name}"
    )
    assert {"path": f"/var/lib/tcpxo/lib64/{name}", "kind": "volume"} in setup["paths"]
    mega = profiles.rank_setup("tcpxo", "enp0s12", ["enp0s12"], ["enp6s0"], None, "a3-megagpu-8g")
    assert "NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE" not in mega["env"]


def test_tcpxo_finds_gpu_nics_by_name_when_no_pci_address_is_seen():
    layout = [dict(n, pci_slot=None) for n in LAYOUTS["a3-highgpu-8g"]]
    found = profiles.find_nics("tcpxo", "a3-highgpu-8g", layout)
    assert found["gpu"] == ["enp6s0f0", "enp12s0f0", "enp134s0f0", "enp140s0f0"]
    assert found["control"] == ["enp0s12"]
    reasons = {c["name"]: c["reason"] for c in found["candidates"]}
    assert reasons["enp6s0f0"] == "name enp6s0f0 (PCI address 0000:06:00.0 not seen)"


def test_tcpxo_pci_address_wins_over_names():
    # Another image names the NICs eth1..eth8: the PCI addresses still find them, in order.
    layout = [nic("eth0", "0000:00:0c.0")] + [
        nic(f"eth{i + 1}", f"0000:{b}:00.0") for i, b in enumerate(A3_MEGA_SLOTS)
    ]
    found = profiles.find_nics("tcpxo", "a3-megagpu-8g", layout)
    assert found["gpu"] == [f"eth{i}" for i in range(1, 9)]
    assert found["control"] == ["eth0"]  # not enp0s12: the host NIC on PCI bus 0
    env = profiles.rank_setup("tcpxo", "eth0", found["control"], found["gpu"])["env"]
    assert env["NCCL_FASTRAK_IFNAME"] == "eth1,eth2,eth3,eth4,eth5,eth6,eth7,eth8"


def test_every_candidate_has_a_reason():
    found = profiles.find_nics("tcpxo", "a3-megagpu-8g", LAYOUTS["a3-megagpu-8g"])
    by_name = {c["name"]: c for c in found["candidates"]}
    assert by_name["docker0"] == {
        "name": "docker0",
        "pci_slot": None,
        "role": None,
        "reason": "not a control or GPU NIC of tcpxo",
    }
    assert by_name["enp0s12"]["role"] == "control"
    assert by_name["enp6s0"]["reason"] == "PCI address 0000:06:00.0"


def test_problems_name_count_mtu_and_state():
    layout = [n for n in LAYOUTS["a3-ultragpu-8g"] if n["name"] != "gpu7rdma0"]
    layout = [dict(n, mtu=1460) if n["name"] == "gpu1rdma0" else n for n in layout]
    layout = [dict(n, up=False) if n["name"] == "gpu2rdma0" else n for n in layout]
    found = profiles.find_nics("gib", "a3-ultragpu-8g", layout, RDMA["a3-ultragpu-8g"])
    assert [p["id"] for p in found["problems"]] == ["gpu-nic-count", "gpu-nic-mtu", "gpu-nic-down"]
    assert "7 GPU NICs found" in found["problems"][0]["detail"]
    assert (
        "gpu1rdma0 has MTU 1460, a3-ultragpu-8g's GPU networks 8896"
        in (found["problems"][1]["detail"])
    )


def test_gib_takes_rdma_netdevs_on_an_unknown_machine_type():
    layout = [
        nic("ens4", "0000:00:04.0"),
        nic("ens5", "0000:00:05.0"),
        nic("roce0", "0000:91:00.0"),
    ]
    found = profiles.find_nics("gib", "a5-futuregpu-8g", layout, ["roce0"])
    assert found["gpu"] == ["roce0"]
    assert found["control"] == ["ens4"]


def test_no_gpu_nic_is_an_error_naming_the_fix():
    with pytest.raises(profiles.ProfileError, match="no GPU NIC found for the tcpxo profile"):
        profiles.find_nics("tcpxo", "a3-megagpu-8g", [nic("enp0s12", "0000:00:0c.0")])


def test_tcpxo_on_an_unknown_machine_type_is_refused():
    with pytest.raises(profiles.ProfileError, match="a3-highgpu-8g, a3-megagpu-8g"):
        profiles.find_nics("tcpxo", "n2-standard-4", [nic("ens4", "0000:00:04.0")])


NO_TYPE = "no machine type known (not on GCE, or its metadata did not answer)"


@pytest.mark.parametrize(
    ("requested", "machine", "expected"),
    [
        ("auto", "projects/1/machineTypes/a3-megagpu-8g", ("tcpxo", "machine type a3-megagpu-8g")),
        ("auto", "g2-standard-48", ("socket", "machine type g2-standard-48 has no GPU NICs")),
        ("auto", None, ("socket", NO_TYPE)),
        ("socket", "a3-ultragpu-8g", ("socket", "set")),  # sockets work anywhere, slowly
        ("gib", "a4-highgpu-8g", ("gib", "set")),
    ],
)
def test_choose_profile(requested, machine, expected):
    assert profiles.choose_profile(requested, profiles.machine_type_name(machine)) == expected


def test_a_profile_that_contradicts_the_machine_type_is_refused():
    with pytest.raises(profiles.ProfileError, match=r"a3-megagpu-8g uses tcpxo .*set it to tcpxo"):
        profiles.choose_profile("gib", "a3-megagpu-8g")
    with pytest.raises(profiles.ProfileError, match="not one of auto, socket, tcpxo, gib"):
        profiles.choose_profile("rdma", "a4-highgpu-8g")


def test_socket_profile_is_todays_environment():
    # NCCL_IB_DISABLE stays the job's setting (llamafactory_nccl_ib_disable).
    assert profiles.rank_setup("socket", "ens4") == {
        "env": {"NCCL_SOCKET_IFNAME": "=ens4", "GLOO_SOCKET_IFNAME": "ens4"},
        "env_script": None,
        "library_path": [],
        "volumes": [],
        "devices": [],
        "paths": [],
    }


def test_every_machine_type_cites_its_source_and_expected_bandwidth():
    for machine, layout in profiles.MACHINE_TYPES.items():
        assert layout["source"] in profiles.SOURCES
        assert len(layout["gpu_nic_names"]) in (4, 8)
        mark = profiles.PASS_MARKS[machine]
        assert mark["threshold"] is None or mark["threshold"] > 0
        assert mark["source"].split(" ", maxsplit=1)[0] in profiles.SOURCES
        assert mark["rule"] == "average" and mark["sizes"] == [2 << 30, 4 << 30, 8 << 30]
    # A3 High's only published mark (60) is for TCPX: none for the TCPXO the collection runs.
    assert profiles.PASS_MARKS["a3-highgpu-8g"]["threshold"] is None
    assert profiles.PASS_MARKS["a3-megagpu-8g"]["threshold"] == 150


def test_the_training_nic_is_the_control_nic_of_last_resort():
    # No recipe name and no PCI address for the host NIC (a virtual NIC): the NIC the route or
    # nic0 chose carries the control traffic.
    layout = [nic("ens4")] + [nic(f"gpu{i}", f"0000:{b}:00.0") for i, b in enumerate(A3_MEGA_SLOTS)]
    found = profiles.find_nics("tcpxo", "a3-megagpu-8g", layout, primary="ens4")
    assert found["control"] == ["ens4"]
    reasons = {c["name"]: c["reason"] for c in found["candidates"]}
    assert reasons["ens4"] == "the training NIC (the route to the peers, or nic0)"
    with pytest.raises(profiles.ProfileError, match="no control NIC found"):
        profiles.find_nics("tcpxo", "a3-megagpu-8g", layout)


def test_expected_bandwidth_sweeps_the_pass_marks_sizes():
    expected = profiles.expected_bandwidth("a3-megagpu-8g", "tcpxo")
    assert expected["sweep_bytes"] == [2 << 30, 4 << 30, 8 << 30]
    assert expected["size"] == 8 << 30
    assert (expected["collective"], expected["threshold"], expected["gpus"]) == (
        "all_gather",
        150,
        8,
    )
    assert profiles.expected_bandwidth("a3-megagpu-8g", "socket") is None
    assert profiles.expected_bandwidth("n2-standard-4", "socket") is None
    assert profiles.NCCL_NETWORKS == {"socket": "Socket", "tcpxo": "FasTrak", "gib": "gIB"}


def test_role_nccl_plugin_writes_what_the_profiles_point_at():
    # The folders, scripts and A3 High's checker file the rank containers are pointed at are the
    # ones role nccl_plugin installs and writes.
    role = yaml.safe_load(
        (Path(__file__).resolve().parents[4] / "roles/nccl_plugin/vars/main.yml").read_text()
    )
    assert role["nccl_plugin_dirs"] == profiles.PLUGIN_DIRS
    assert role["nccl_plugin_env_scripts"] == profiles.ENV_SCRIPTS
    checker = profiles.GUEST_CONFIG_CHECKS_DISABLED["a3-highgpu-8g"]
    assert role["nccl_plugin_guest_config_file"] == checker["file"]
    assert role["nccl_plugin_guest_config_lines"] == checker["lines"]
