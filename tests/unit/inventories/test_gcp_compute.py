"""inventories/gcp_compute.yml, through google.cloud's gcp_compute inventory plugin and
ansible-inventory, against the fake Compute Engine API (tools/localcluster/compute_api.py): the
label selects the training VMs, ranks come from a label, ansible_host follows the in-VPC switch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import compute_contract
import pytest
import requests
import yaml
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _node_ranks
from localcluster import compute_api

ROOT = Path(__file__).resolve().parents[3]
INVENTORY = ROOT / "inventories" / "gcp_compute.yml"
ANSIBLE_INVENTORY = Path(sys.executable).parent / "ansible-inventory"
PROJECT = "hlf-test"
ZONES = ["us-central1-a", "us-central1-b"]
LIST_PATH = f"/compute/v1/projects/{PROJECT}/aggregated/instances"


def node_ranks(hosts, hostvars):
    """validate_job's ranks (plugin_utils/_node_ranks.py) from the inventory's hostvars."""
    given = {h: hostvars[h].get("llamafactory_node_rank") for h in hosts}
    return _node_ranks.node_ranks(hosts, given)


def nic(internal, external=None):
    interface = {"network": "global/networks/default", "networkIP": internal}
    if external:
        interface["accessConfigs"] = [{"natIP": external}]
    return {"networkInterfaces": [interface]}


# Two training VMs (rank label 1 and 0; trainer-a has no external IP) and one VM without the
# label, in a zone the inventory reads: only the API's filter keeps it out.
VMS = {
    ("us-central1-a", "trainer-b"): {
        "labels": {"llamafactory": "training", "llamafactory-rank": "1"},
        **nic("10.128.0.3", "203.0.113.11"),
    },
    ("us-central1-b", "trainer-a"): {
        "labels": {"llamafactory": "training", "llamafactory-rank": "0"},
        **nic("10.128.0.2"),
    },
    ("us-central1-a", "web"): {"labels": {"role": "web"}, **nic("10.128.0.9", "203.0.113.19")},
}


@pytest.fixture
def fake(fake_api):
    """The fake, reset, with the three VMs; a session for its control API."""
    session = requests.Session()
    session.trust_env = False  # the control API is plain HTTP on loopback, no proxy
    control = fake_api["control"]
    session.post(f"{control}/reset").raise_for_status()
    for (zone, name), body in VMS.items():
        session.put(f"{control}/instances/{PROJECT}/{zone}/{name}", json=body).raise_for_status()
    yield fake_api, session
    # Every exchange of the test kept Google's published contract (compute.v1.json).
    assert compute_contract.validate_log(api_requests((fake_api, session))) == []
    session.close()


def api_requests(fake):
    info, session = fake
    return [e for e in session.get(f"{info['control']}/requests").json() if not e.get("refused")]


def unwrap(value):
    """ansible-inventory 2.19 marks inventory strings {"__ansible_unsafe": ...}."""
    return value["__ansible_unsafe"] if set(value) == {"__ansible_unsafe"} else value


def run_inventory(fake, tmp_path, env=None, **options):
    """ansible-inventory --list on a copy of the example, pointed at the fake."""
    info, _session = fake
    config = yaml.safe_load(INVENTORY.read_text())
    assert config["plugin"] == "google.cloud.gcp_compute"
    config.update(
        projects=[PROJECT], zones=ZONES, auth_kind="accesstoken", access_token=info["token"]
    )
    config.update(options)
    path = tmp_path / "test.gcp_compute.yml"  # the plugin takes only *gcp_compute.yml, *gcp.yml
    path.write_text(yaml.safe_dump(config))
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("GCP_", "LLAMAFACTORY_"))
    }
    environment.update(info["env"])
    environment.update(
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_INVENTORY_UNPARSED_FAILED="1",  # an API error fails instead of an empty inventory
        **(env or {}),
    )
    return subprocess.run(
        [str(ANSIBLE_INVENTORY), "-i", str(path), "--list"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def listed(result):
    assert result.returncode == 0, result.stderr
    inventory = json.loads(result.stdout, object_hook=unwrap)
    return inventory, inventory["_meta"]["hostvars"]


def test_label_selects_the_training_vms_with_ranks_and_reachable_addresses(fake, tmp_path):
    inventory, hostvars = listed(run_inventory(fake, tmp_path))

    assert sorted(inventory["llamafactory"]["hosts"]) == ["trainer-a", "trainer-b"]
    assert sorted(hostvars) == ["trainer-a", "trainer-b"]  # the web VM was never returned
    assert {h: v["llamafactory_node_rank"] for h, v in hostvars.items()} == {
        "trainer-a": 0,
        "trainer-b": 1,
    }
    assert node_ranks(inventory["llamafactory"]["hosts"], hostvars) == (
        {"trainer-a": 0, "trainer-b": 1},
        [],
    )
    # The external IP; the internal one for the VM that has none.
    assert hostvars["trainer-b"]["ansible_host"] == "203.0.113.11"
    assert hostvars["trainer-a"]["ansible_host"] == "10.128.0.2"
    for host in hostvars.values():
        assert host["llamafactory_platform"] == "gcp"
        assert (host["llamafactory_gcp_project"], host["gcp_firewall_network"]) == (
            PROJECT,
            "default",
        )
        assert "name" not in host  # the API's fields come prefixed: gcp_name, gcp_labels...
    assert hostvars["trainer-a"]["gcp_zone"] == "us-central1-b"

    calls = api_requests(fake)
    assert len(calls) == 1
    call = calls[0]
    assert (call["method"], call["host"], call["path"]) == ("GET", "www.googleapis.com", LIST_PATH)
    assert call["query"] == {"filter": ["labels.llamafactory = training"]}
    assert call["token_ok"]  # the fake answers 401 to any other bearer token
    assert call["status"] == 200


def test_controller_in_the_vpc_uses_internal_addresses(fake, tmp_path):
    _inventory, hostvars = listed(
        run_inventory(fake, tmp_path, env={"LLAMAFACTORY_CONTROLLER_IN_VPC": "1"})
    )
    assert {h: v["ansible_host"] for h, v in hostvars.items()} == {
        "trainer-a": "10.128.0.2",
        "trainer-b": "10.128.0.3",
    }


def test_several_filters_are_anded_and_every_page_is_read(fake, tmp_path):
    info, session = fake
    stopped = {"labels": {"llamafactory": "training"}, "status": "TERMINATED", **nic("10.128.0.4")}
    session.put(f"{info['control']}/instances/{PROJECT}/us-central1-a/trainer-c", json=stopped)
    session.post(f"{info['control']}/config", json={"page_size": 1}).raise_for_status()
    filters = ["labels.llamafactory = training", "status = RUNNING"]

    inventory, _hostvars = listed(run_inventory(fake, tmp_path, filters=filters))

    assert sorted(inventory["llamafactory"]["hosts"]) == ["trainer-a", "trainer-b"]
    calls = api_requests(fake)
    joined = "(labels.llamafactory = training) (status = RUNNING)"
    assert [c["query"]["filter"] for c in calls] == [[joined], [joined]]
    assert "pageToken" not in calls[0]["query"]
    assert calls[1]["query"]["pageToken"]


def test_a_rank_label_that_is_no_number_is_named_by_node_ranks(fake, tmp_path):
    info, session = fake
    body = {**VMS[("us-central1-a", "trainer-b")], "labels": {"llamafactory": "training"}}
    body["labels"]["llamafactory-rank"] = "one"
    session.put(f"{info['control']}/instances/{PROJECT}/us-central1-a/trainer-b", json=body)

    inventory, hostvars = listed(run_inventory(fake, tmp_path))

    assert hostvars["trainer-b"]["llamafactory_node_rank"] == "one"
    _ranks, problems = node_ranks(inventory["llamafactory"]["hosts"], hostvars)
    assert any("llamafactory_node_rank of trainer-b is 'one'" in p for p in problems)


@pytest.mark.parametrize(
    ("config", "options", "message"),
    [
        ({"deny": ["compute.instances.list"]}, {}, "Required 'compute.instances.list' permission"),
        ({}, {"filters": ["labels.llamafactory ~ training"]}, "Invalid list filter expression"),
    ],
)
def test_api_errors_fail_the_inventory(fake, tmp_path, config, options, message):
    info, session = fake
    session.post(f"{info['control']}/config", json=config).raise_for_status()
    result = run_inventory(fake, tmp_path, **options)
    assert result.returncode != 0
    assert message in result.stderr


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ("", ["a", "b", "c"]),
        ("labels.llamafactory = training", ["a", "b"]),
        ('labels.llamafactory = "training"', ["a", "b"]),
        ("(labels.llamafactory = training) (status = RUNNING)", ["a"]),
        ("(labels.llamafactory = training) AND (labels.llamafactory-rank = 1)", ["b"]),
        ("(name = a) OR (name = c)", ["a", "c"]),
        ("labels.llamafactory != training", ["c"]),
    ],
)
def test_fake_instance_filter(expression, names):
    instances = [
        {"name": "a", "status": "RUNNING", "labels": {"llamafactory": "training"}},
        {
            "name": "b",
            "status": "TERMINATED",
            "labels": {"llamafactory": "training", "llamafactory-rank": "1"},
        },
        {"name": "c", "status": "RUNNING"},
    ]
    keep = compute_api.parse_instance_filter(expression)
    assert [i["name"] for i in instances if keep(i)] == names


@pytest.mark.parametrize(
    "expression",
    ["labels.x ~ y", "(labels.x = y", "(a = b) AND (c = d) OR (e = f)", "a = b AND c = d", "()"],
)
def test_fake_refuses_filters_it_cannot_parse(expression):
    with pytest.raises(compute_api.ApiError) as error:
        compute_api.parse_instance_filter(expression)
    assert error.value.code == 400
