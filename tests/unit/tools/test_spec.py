"""The cluster definition: defaults, overrides, and refusals that name the fix."""

import ipaddress
import json

import pytest
import yaml
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _nic_host as nic_host
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
        ({"zones": ["us-central1-b"]}, "zone 'us-central1-a' is not one of zones"),
        ({"zones": ["us-central1-a", "Moon"]}, "zones: 'Moon' is not a GCE zone name"),
        ({"zones": []}, "zones must be a non-empty list"),
        ({"vms": [{"name": "vm0", "zone": "europe-west4-a"}]}, "zone 'europe-west4-a' is not one"),
        ({"vms": [{"name": "vm0", "index": 1}, {"name": "vm1", "index": 1}]}, r"\[1\] repeat"),
        ({"vms": [{"name": "vm0", "index": -1}]}, "index -1 must be a whole number"),
        ({"vms": [{"name": "vm0", "index": 300}]}, "do not fit the smallest subnet"),
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
    nodes = _nodes(definition)
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


# ------------------------------------------------------------------ GPU machine types' NICs

MEGA = [f"enp{n}s0" for n in (6, 7, 13, 14, 134, 135, 141, 142)]


def gpu_definition(**changes):
    vms = [
        {"name": "vm0", "machine_type": "a3-megagpu-8g"},
        {"name": "vm1", "machine_type": "a3-ultragpu-8g"},
        {"name": "vm2"},
    ]
    return parse(**{"name": "gpubox", "shift": 6, "vms": vms, **changes})


def test_the_layout_table_has_one_home():
    from localcluster import spec as box_spec

    source = (spec.repo_root() / "plugins/module_utils/_network_profile.py").read_text()
    assert "a3-megagpu-8g" in source
    assert set(box_spec.MACHINE_TYPES) >= {"a3-highgpu-8g", "a3-megagpu-8g", "a3-ultragpu-8g"}
    assert "0000:06:00.0" not in (spec.repo_root() / "tools/localcluster/spec.py").read_text()


def published(vm) -> dict[str, str]:
    """NIC name -> PCI address for the VM's NICs that have one on GCP (machine_nics' pci_slot)."""
    return {nic.name: nic.pci_slot for nic in spec.machine_nics(vm) if nic.pci_slot}


def test_a_gpu_machine_type_gets_its_nics_networks_and_pci_slots():
    definition = gpu_definition()
    mega, ultra, plain = definition.vms
    assert (mega.nic, ultra.nic, plain.nic) == ("enp0s12", "enp0s19", "ens4")
    assert [(n.role, n.name, n.kind) for n in spec.machine_nics(mega)] == [
        ("vpc", "enp0s12", "control"),
        *[(f"gpu{i}", name, "gpu") for i, name in enumerate(MEGA)],
    ]
    assert [(n.role, n.name) for n in spec.machine_nics(ultra)] == [
        ("vpc", "enp0s19"),
        ("control1", "enp192s20"),
        *[(f"rdma{i}", f"gpu{i}rdma0") for i in range(8)],
    ]
    assert spec.machine_nics(plain) == []
    assert published(mega) == {
        "enp0s12": "0000:00:0c.0",
        "enp6s0": "0000:06:00.0",
        "enp7s0": "0000:07:00.0",
        "enp13s0": "0000:0d:00.0",
        "enp14s0": "0000:0e:00.0",
        "enp134s0": "0000:86:00.0",
        "enp135s0": "0000:87:00.0",
        "enp141s0": "0000:8d:00.0",
        "enp142s0": "0000:8e:00.0",
    }
    # gib: the control NICs' bus slots only; the RDMA NICs' are not published, none invented.
    assert published(ultra) == {"enp0s19": "0000:00:13.0", "enp192s20": "0000:c0:14.0"}
    assert published(plain) == {}
    for nic in spec.machine_nics(mega) + spec.machine_nics(ultra):
        assert spec.NIC_RE.match(nic.name), nic.name


def test_gpu_networks_are_derived_moved_by_shift_with_the_types_mtu():
    networks = gpu_definition().networks
    # shift 6: +6 x 32 /24s; vpc at 198.18.192.0/24, the derived ones at 198.18.(192+slot).
    assert str(networks["vpc"].subnet) == "198.18.192.0/24"
    assert (str(networks["control1"].subnet), networks["control1"].mtu) == ("198.18.207.0/24", 8896)
    for i in range(8):
        assert (str(networks[f"gpu{i}"].subnet), networks[f"gpu{i}"].mtu) == (
            f"198.18.{208 + i}.0/24",
            8244,  # tcpxo: the recipe sets none; dstack's value
        )
        assert (str(networks[f"rdma{i}"].subnet), networks[f"rdma{i}"].mtu) == (
            f"198.18.{216 + i}.0/24",
            8896,
        )
    assert networks["vpc"].mtu == 1460  # the shared VPC keeps the definition's MTU
    unshifted = gpu_definition(shift=0).networks
    assert str(unshifted["gpu0"].subnet) == "198.18.16.0/24"
    assert str(unshifted["control1"].subnet) == "198.18.15.0/24"
    # Only what the VMs' types need; none for plain VMs.
    assert set(parse().networks) == {"vpc", "external", "secondary", "decoy"}
    high = parse(vms=[{"name": "a", "machine_type": "a3-highgpu-8g"}]).networks
    assert set(high) - set(BASE["networks"]) == {"gpu0", "gpu1", "gpu2", "gpu3"}


def test_gpu_networks_the_definition_names_are_taken_as_given():
    networks = dict(BASE["networks"], gpu0={"subnet": "198.18.100.0/24"})
    definition = gpu_definition(networks=networks, shift=1)
    assert str(definition.networks["gpu0"].subnet) == "198.18.132.0/24"  # moved by shift too
    assert definition.networks["gpu0"].mtu == 8244  # no mtu given: the type's
    networks["gpu0"] = {"subnet": "198.18.100.0/24", "mtu": 1500}
    assert gpu_definition(networks=networks).networks["gpu0"].mtu == 1500


def test_gpu_definitions_are_refused_with_the_fix():
    with pytest.raises(ClusterError, match=r"nic 'ens4' is not a3-megagpu-8g's primary NIC"):
        parse(vms=[{"name": "a", "machine_type": "a3-megagpu-8g", "nic": "ens4"}])
    assert parse(vms=[{"name": "a", "machine_type": "a3-megagpu-8g", "nic": "enp0s12"}])
    with pytest.raises(ClusterError, match=r"NIC names must differ"):
        parse(vms=[{"name": "a", "machine_type": "a3-megagpu-8g", "second_nic": "enp6s0"}])
    # A named network over a derived one: the message says how to move it.
    networks = dict(BASE["networks"], secondary={"subnet": "198.18.16.0/24"})
    with pytest.raises(ClusterError, match=r"overlap; networks\.gpu0's subnet is derived"):
        parse(networks=networks, vms=[{"name": "a", "machine_type": "a3-megagpu-8g"}])
    with pytest.raises(ClusterError, match=r"unknown networks \['gpux'\]"):
        parse(networks=dict(BASE["networks"], gpux={"subnet": "198.18.40.0/24"}))
    named = parse(networks=dict(BASE["networks"], gpu3={"subnet": "198.18.40.0/24"}))
    assert "gpu3" in named.networks  # a GPU role no VM uses: kept (and not created)


def test_to_raw_round_trips_a_gpu_definition():
    definition = gpu_definition()
    assert spec.parse(spec.to_raw(definition)) == definition
    assert json.loads(json.dumps(spec.to_raw(definition))) == spec.to_raw(definition)


def test_gce_network_names():
    definition = gpu_definition()
    assert [definition.gce_network(r) for r in ("vpc", "control1", "gpu3", "rdma3")] == [
        "default",
        "gpubox-net-1",
        "gpubox-gpu3",
        "gpubox-rdma-net",  # one RoCE VPC, a subnet per NIC
    ]
    assert definition.gce_subnetwork("rdma3") == "gpubox-rdma-sub-3"


def test_a_gpu_vm_attaches_every_nic_of_its_type():
    definition = gpu_definition()
    mega, ultra, plain = definition.vms
    assert cluster._vm_networks(definition, mega) == [
        ("vpc", "enp0s12"),
        ("external", "ext0"),
        *[(f"gpu{i}", name) for i, name in enumerate(MEGA)],
    ]
    assert cluster._vm_networks(definition, ultra)[2] == ("control1", "enp192s20")
    assert cluster._vm_networks(definition, plain) == [("vpc", "ens4"), ("external", "ext0")]
    control, gpus = cluster.nic_entries(definition, mega, {"gpu0": "02:42:00:00:00:01"})
    assert control == [
        {
            "name": "enp0s12",
            "address": "198.18.192.10",
            "network": "vpc",
            "gce_network": "default",
            "mtu": 1460,
            "mac": "02:42:c6:12:c0:0a",
            "pci_slot": "0000:00:0c.0",
        }
    ]
    assert gpus[0] == {
        "name": "enp6s0",
        "address": "198.18.208.10",
        "network": "gpu0",
        "gce_network": "gpubox-gpu0",
        "mtu": 8244,
        "mac": "02:42:00:00:00:01",
        "pci_slot": "0000:06:00.0",
    }
    assert [n["pci_slot"] for n in cluster.nic_entries(definition, ultra)[1]] == [None] * 8


def test_stand_in_devices_of_gpu_types():
    mega, ultra, plain = gpu_definition().vms
    script = cluster.standin_devices_script(mega)
    assert "mkdir -p /dev/aperture_devices/0000:06:00.1\n" in script
    assert script.count("/dev/aperture_devices/") == 8
    assert "mknod -m 0666 /dev/dmabuf_import_helper c 1 3" in script
    script = cluster.standin_devices_script(ultra)
    assert "mknod -m 0666 /dev/infiniband/uverbs7 c 1 3" in script
    assert cluster.standin_devices_script(plain) == ""


def _nodes(definition):
    return [
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


def test_no_host_has_a_box_only_variable(tmp_path):
    # The box's one difference from GCP is llamafactory_local_cluster in the shared group_vars
    # (tests/unit/inventories/test_local_inventory.py): a GPU VM's host variables are a plain
    # VM's, and the GCP path writes no host_vars (a stale folder is removed).
    definition = gpu_definition(inventory=str(tmp_path / "inv.yml"))
    state = {
        "user": "gce",
        "ssh_key": "/k/id",
        "known_hosts": "/k/known_hosts",
        "nodes": _nodes(definition),
    }
    path = cluster.write_inventory(definition, state)
    hosts = yaml.safe_load(path.read_text())["all"]["children"]["llamafactory"]["hosts"]
    for vm in definition.vms:
        assert hosts[vm.name] == {
            "ansible_host": definition.networks["external"].address(vm.index),
            "llamafactory_node_rank": vm.index,
        }

    gce = {
        "project": "hostnet-box",
        "zone": "us-central1-a",
        "service_account_file": "/s/sa.json",
        "env": {},
    }
    stale = definition.gcp_inventory / "host_vars"
    stale.mkdir(parents=True)
    (stale / "vm0.yml").write_text("# written by an older box\n")
    cluster.write_inventory(definition, {**state, "gce": gce})
    assert not stale.exists()
    assert sorted(p.name for p in definition.gcp_inventory.iterdir()) == [
        "box.yml",
        "gcp_compute.yml",
        "group_vars",
    ]


def test_the_published_pci_slots_are_the_ones_the_nic_names_encode():
    # llamafactory_local_cluster gives the box's veth NICs the PCI address their names encode
    # (primary_nic's pci_slots_from_names): for every GPU machine type these are the slots GCP
    # publishes for those NICs (spec's machine_nics), so the box's NICs have GCP's addresses.
    vms = [{"name": f"vm{i}", "machine_type": t} for i, t in enumerate(sorted(spec.MACHINE_TYPES))]
    definition = parse(name="alltypes", shift=6, vms=vms)
    assert {vm.machine_type for vm in definition.vms} == set(spec.MACHINE_TYPES)
    for vm in definition.vms:
        nics = spec.machine_nics(vm)
        assert nics, vm.machine_type
        from_names = {
            nic.name: nic_host.pci_slot_of_name(nic.name)
            for nic in nics
            if nic_host.pci_slot_of_name(nic.name)
        }
        assert published(vm) == from_names, vm.machine_type
        for nic in nics:
            assert nic_host.pci_slot_of_name(nic.name) == nic.pci_slot, (vm.machine_type, nic)


def test_an_empty_project_has_no_vms_and_its_zones():
    definition = parse(vms=[], zones=["us-central1-a", "us-central1-c"])
    assert definition.vms == ()
    assert definition.zones == ("us-central1-a", "us-central1-c")
    assert parse(vms=None).vms == ()
    assert parse().zones == ("us-central1-a",)  # the default: the definition's zone
    assert spec.parse(spec.to_raw(definition)) == definition
    assert definition.free_index() == 0
    assert definition.capacity() == 256 - 12


def test_a_vm_may_give_its_zone_and_index():
    definition = parse(
        zones=["us-central1-b", "us-central1-a"],
        zone="us-central1-a",
        vms=[{"name": "a", "index": 3}, {"name": "b", "zone": "us-central1-b"}, {"name": "c"}],
    )
    assert definition.zones == ("us-central1-a", "us-central1-b")  # the default zone first
    assert [(vm.name, vm.index, vm.zone) for vm in definition.vms] == [
        ("a", 3, "us-central1-a"),
        ("b", 0, "us-central1-b"),
        ("c", 1, "us-central1-a"),
    ]
    assert definition.networks["vpc"].address(definition.vm("a").index) == "198.18.0.13"
    assert definition.free_index() == 2
    assert definition.free_index({2, 4}) == 5
    assert spec.parse(spec.to_raw(definition)) == definition
