"""The cluster definition: defaults, overrides, and refusals that name the fix."""

import ipaddress
import json

import pytest
import yaml
from localcluster import cluster, spec
from localcluster.util import ClusterError

BASE = {
    "networks": {
        "vpc": {"subnet": "198.18.0.0/24", "mtu": 1460},
        "external": {"subnet": "198.19.0.0/24"},
        "secondary": {"subnet": "198.18.1.0/24"},
        "decoy": {"subnet": "198.18.2.0/24"},
    },
    "vms": [{"name": "vm0"}, {"name": "vm1", "nic": "eth0"}],
}


def parse(**changes):
    return spec.parse({**BASE, **changes})


def test_default_definition_is_two_gcp_like_vms():
    definition = spec.load()
    assert [vm.name for vm in definition.vms] == ["vm0", "vm1"]
    assert [vm.nic for vm in definition.vms] == ["ens4", "eth0"]
    assert definition.networks["vpc"].mtu == 1460
    assert definition.inventory == spec.repo_root() / "inventories/local/demo.yml"
    for network in definition.networks.values():
        assert network.subnet.subnet_of(ipaddress.ip_network("198.18.0.0/15"))


def test_addresses_and_names():
    definition = parse(name="t1")
    vm1 = definition.vms[1]
    assert definition.networks["vpc"].address(vm1.index) == "198.18.0.11"
    assert definition.networks["external"].address(vm1.index) == "198.19.0.11"
    assert definition.networks["vpc"].gateway == "198.18.0.1"
    assert definition.container(vm1) == "hlf-t1-vm1"
    assert definition.network_name("vpc") == "hlf-t1-vpc"
    assert vm1.nic == "eth0"


def test_nodes_override_keeps_the_first_vms_settings():
    definition = parse(nodes=3, vms=[{"name": "a", "nic": "enp0s12"}])
    assert [(vm.name, vm.nic) for vm in definition.vms] == [
        ("vm0", "enp0s12"),
        ("vm1", "enp0s12"),
        ("vm2", "enp0s12"),
    ]


def test_shift_moves_every_subnet_and_stays_in_range():
    definition = parse(shift=1)
    assert str(definition.networks["vpc"].subnet) == "198.18.32.0/24"
    assert str(definition.networks["external"].subnet) == "198.19.32.0/24"
    with pytest.raises(ClusterError, match=r"outside 198\.18\.0\.0/15"):
        parse(shift=8)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"networks": {**BASE["networks"], "vpc": {"subnet": "10.0.0.0/24"}}},
            r"networks.vpc.subnet 10.0.0.0/24 is outside 198.18.0.0/15",
        ),
        ({"networks": {**BASE["networks"], "vpc": {"subnet": "198.19.0.0/25"}}}, "overlap"),
        ({"networks": {"vpc": BASE["networks"]["vpc"]}}, "networks.external is required"),
        (
            {"networks": {**BASE["networks"], "vpc": {"subnet": "198.18.0.0/24", "mtu": 100}}},
            "mtu 100 must be within",
        ),
        ({"vms": [{"name": "vm0", "nic": "Bad-Name"}]}, r"NIC name 'Bad-Name' must match"),
        ({"vms": [{"name": "vm0", "nic": "ens4", "decoy": "ens4"}]}, "NIC names must differ"),
        ({"vms": [{"name": "vm0", "colour": "red"}]}, r"unknown keys \['colour'\]"),
        ({"vms": [{"name": "vm0", "platform": "centos7"}]}, "platform 'centos7' is not one of"),
        ({"vms": ["vm0", "vm0"]}, "names must be unique"),
        ({"vms": []}, "define at least one VM"),
        ({"user": "root"}, "plain non-root login"),
        ({"name": "Demo!"}, "name 'Demo!' must match"),
        ({"project": "Box"}, "project 'Box' is not a GCP project id"),
        ({"zone": "us-central1"}, "zone 'us-central1' is not a GCE zone name"),
        (
            {"vms": [{"name": "vm0", "machine_type": "big box"}]},
            "machine_type 'big box' is not a GCE machine type name",
        ),
    ],
)
def test_bad_definitions_are_refused_with_the_fix(changes, message):
    with pytest.raises(ClusterError, match=message):
        parse(**changes)


def test_project_zone_and_machine_types():
    default = parse()
    assert (default.project, default.zone) == ("hostnet-box", "us-central1-a")
    assert {vm.machine_type for vm in default.vms} == {"n2-standard-4"}
    definition = parse(
        project="tiny-lab-42",
        zone="europe-west4-b",
        vms=[{"name": "vm0"}, {"name": "gpu0", "machine_type": "a2-highgpu-1g"}],
    )
    assert (definition.project, definition.zone) == ("tiny-lab-42", "europe-west4-b")
    assert [vm.machine_type for vm in definition.vms] == ["n2-standard-4", "a2-highgpu-1g"]
    # They are part of the definition: a cluster up with other values is recreated.
    assert cluster.spec_hash(parse(zone="europe-west4-b")) != cluster.spec_hash(default)


def test_decoy_needs_its_network():
    networks = {k: v for k, v in BASE["networks"].items() if k != "decoy"}
    with pytest.raises(ClusterError, match=r"decoy needs networks\.decoy"):
        parse(networks=networks, vms=[{"name": "vm0", "decoy": "ens5"}])


def test_inventory_uses_external_addresses_and_ranks(tmp_path):
    definition = parse(name="inv", inventory=str(tmp_path / "inv.yml"))
    nodes = [
        {
            "name": vm.name,
            "index": vm.index,
            "nic": vm.nic,
            "vpc_address": definition.networks["vpc"].address(vm.index),
            "vpc_prefix": 24,
            "external_address": definition.networks["external"].address(vm.index),
        }
        for vm in definition.vms
    ]
    state = {"user": "gce", "ssh_key": "/k/id", "known_hosts": "/k/known_hosts", "nodes": nodes}
    path = cluster.write_inventory(definition, state)
    text = path.read_text()
    assert "#   vm1: 198.18.0.11/24 on eth0" in text
    group = yaml.safe_load(text)["all"]["children"]["llamafactory"]
    assert group["hosts"]["vm1"] == {"ansible_host": "198.19.0.11", "llamafactory_node_rank": 1}
    assert group["vars"]["llamafactory_platform"] == "local"
    assert "StrictHostKeyChecking=yes" in group["vars"]["ansible_ssh_common_args"]
    assert "UserKnownHostsFile=/k/known_hosts" in group["vars"]["ansible_ssh_common_args"]
    assert not definition.gcp_inventory.exists()  # no control plane in this state


def test_the_gcp_path_inventory_is_the_shipped_one_but_for_project_zone_and_credentials(
    tmp_path,
):
    definition = parse(name="inv", inventory=str(tmp_path / "inv.yml"))
    gce = {
        "project": "hostnet-box",
        "zone": "us-central1-a",
        "service_account_file": "/s/gce/service-account.json",
        "env": {"HTTPS_PROXY": "http://127.0.0.1:1"},
    }
    state = {"user": "gce", "ssh_key": "/k/id", "known_hosts": "/k/known_hosts", "nodes": []}
    cluster.write_inventory(definition, {**state, "gce": gce})
    folder = definition.gcp_inventory
    assert folder == tmp_path / "inv.gcp"
    shipped = yaml.safe_load((spec.repo_root() / "inventories" / "gcp_compute.yml").read_text())
    written = yaml.safe_load((folder / "gcp_compute.yml").read_text())
    differs = {k for k in shipped.keys() | written.keys() if shipped.get(k) != written.get(k)}
    # (the shipped zone is us-central1-a too)
    assert differs <= {"projects", "zones", "auth_kind", "service_account_file"}
    assert {"projects", "auth_kind", "service_account_file"} <= differs
    assert (written["projects"], written["zones"]) == (["hostnet-box"], ["us-central1-a"])
    assert (written["auth_kind"], written["service_account_file"]) == (
        "serviceaccount",
        "/s/gce/service-account.json",
    )
    box = yaml.safe_load((folder / "box.yml").read_text())["llamafactory"]["vars"]
    assert box["ansible_user"] == "gce" and box["ansible_ssh_private_key_file"] == "/k/id"
    assert box["llamafactory_gcp_service_account_file"] == "/s/gce/service-account.json"
    assert "llamafactory_platform" not in box  # the dynamic inventory composes 'gcp'
    assert (folder / "group_vars").resolve() == (tmp_path / "group_vars").resolve()


# ------------------------------------------------------------------ firewall rules, tags


def test_the_default_rules_are_a_fresh_projects_less_default_allow_internal():
    definition = parse()  # no firewall key: the default definition's rules
    assert definition.firewall == spec.load().firewall
    rules = {rule["name"]: rule for rule in definition.firewall}
    # Nothing lets the VMs reach each other: train.yml's gcp_firewall rule must.
    assert sorted(rules) == ["default-allow-icmp", "default-allow-rdp", "default-allow-ssh"]
    for rule in [*rules.values(), spec.DEFAULT_ALLOW_INTERNAL]:
        assert (rule["kind"], rule["direction"], rule["priority"]) == (
            "compute#firewall",
            "INGRESS",
            65534,
        )
        assert rule["network"].endswith("/global/networks/default")
        assert rule["selfLink"].endswith(f"/global/firewalls/{rule['name']}")
    assert rules["default-allow-ssh"]["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert rules["default-allow-rdp"]["allowed"] == [{"IPProtocol": "tcp", "ports": ["3389"]}]
    assert rules["default-allow-icmp"]["allowed"] == [{"IPProtocol": "icmp"}]


def test_the_fresh_projects_internal_rule_moves_with_the_vpc():
    # The VPC's own range (GCP's default network: 10.128.0.0/9).
    (internal,) = parse(shift=5, firewall=[spec.DEFAULT_ALLOW_INTERNAL]).firewall
    assert internal["sourceRanges"] == ["198.18.160.0/24"]
    assert {"IPProtocol": "tcp", "ports": ["0-65535"]} in internal["allowed"]


def test_shift_moves_the_rules_ranges_inside_the_simulated_networks_only():
    rules = [
        {
            "name": "r",
            "allowed": [{"IPProtocol": "all"}],
            "sourceRanges": ["198.18.0.0/24", "198.18.0.11/32", "0.0.0.0/0", "198.18.0.0/15"],
            "destinationRanges": ["198.19.0.0/20"],
        }
    ]
    (moved,) = parse(shift=5, firewall=rules).firewall
    assert moved["sourceRanges"] == [
        "198.18.160.0/24",
        "198.18.160.11/32",
        "0.0.0.0/0",
        "198.18.0.0/15",
    ]
    assert moved["destinationRanges"] == ["198.19.160.0/20"]
    assert rules[0]["sourceRanges"][0] == "198.18.0.0/24"  # the caller's list is left alone


def test_a_definition_replaces_the_rules_and_tags_its_vms():
    locked = list(spec.load().firewall)
    definition = parse(firewall=locked, vms=[{"name": "vm0", "tags": ["rank0", "gpu"]}, "vm1"])
    assert [r["name"] for r in definition.firewall] == [
        "default-allow-ssh",
        "default-allow-rdp",
        "default-allow-icmp",
    ]
    assert [vm.tags for vm in definition.vms] == [("rank0", "gpu"), ()]
    assert parse(firewall=[]).firewall == ()
    # Another rule set is another cluster: `up` recreates it.
    assert cluster.spec_hash(definition) != cluster.spec_hash(parse())


def test_compute_engine_keys_and_their_defaults():
    definition = parse()
    assert (definition.project, definition.zone) == ("hostnet-box", "us-central1-a")
    assert [vm.machine_type for vm in definition.vms] == ["n2-standard-4"] * 2
    assert [vm.initial_labels() for vm in definition.vms] == [
        {"llamafactory": "training", "llamafactory-rank": "0"},
        {"llamafactory": "training", "llamafactory-rank": "1"},
    ]
    given = parse(
        project="my-project-1",
        zone="europe-west4-b",
        vms=[{"name": "a", "machine_type": "a2-highgpu-1g", "labels": {"role": "web"}}],
    )
    assert (given.project, given.zone) == ("my-project-1", "europe-west4-b")
    assert (given.vms[0].machine_type, given.vms[0].initial_labels()) == (
        "a2-highgpu-1g",
        {"role": "web"},
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"firewall": {"name": "r"}}, "firewall must be a list"),
        (
            {"firewall": [{"name": "r", "allowed": [{"IPProtocol": "gre"}]}]},
            r"firewall\[0\]: firewall rule 'r': allowed\[0\]: protocol 'gre'",
        ),
        (
            {"firewall": [{"name": "r", "denied": [{"IPProtocol": "all"}]}] * 2},
            r"rule names must be unique, \['r'\] repeat",
        ),
        ({"vms": [{"name": "vm0", "tags": ["Web"]}]}, r"vms\[0\] \(vm0\): tags must be a list"),
        ({"vms": [{"name": "vm0", "tags": "web"}]}, "tags must be a list"),
    ],
)
def test_bad_rules_and_tags_are_refused_with_the_fix(changes, message):
    with pytest.raises(ClusterError, match=message):
        parse(**changes)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"project": "Bad_Project"}, "project 'Bad_Project' is not a GCP project id"),
        ({"zone": "moon"}, "zone 'moon' is not a GCE zone name"),
        ({"vms": [{"name": "a", "labels": {"Rank": "1"}}]}, r"vms\[0\].labels: Rank='1'"),
        ({"vms": [{"name": "a", "labels": ["x"]}]}, "must be a mapping"),
        ({"vms": [{"name": "a", "machine_type": "N2 big"}]}, "is not a GCE machine type name"),
    ],
)
def test_compute_engine_keys_are_checked(changes, message):
    with pytest.raises(ClusterError, match=message):
        parse(**changes)


def test_to_raw_round_trips_a_shifted_definition():
    definition = parse(shift=6, vms=[{"name": "a", "labels": {"x": "1"}}, {"name": "b"}])
    assert spec.parse(spec.to_raw(definition)) == definition
    assert json.loads(json.dumps(spec.to_raw(definition))) == spec.to_raw(definition)


def test_a_placement_policy_is_checked_and_kept():
    definition = parse(placement_policy={"name": "compact"})
    assert definition.placement_policy == {"name": "compact", "collocation": "COLLOCATED"}
    assert spec.parse(spec.to_raw(definition)).placement_policy == definition.placement_policy
    assert parse().placement_policy is None
    with pytest.raises(ClusterError, match=r"placement_policy\.name 'Compact'"):
        parse(placement_policy={"name": "Compact"})
    with pytest.raises(ClusterError, match=r"placement_policy\.collocation 'SPREAD'"):
        parse(placement_policy={"name": "compact", "collocation": "SPREAD"})
