"""The Hub model fetched once on 8 VMs (roles/launch/tasks/hub.yml, through
playbooks/hub_fetch.yml: the fetch alone, no training): rank 0's node downloads it from the
box's Hub double with huggingface_hub, the 7 others copy it from rank 0 over the VPC; the
double counts one download per file; a re-run asks the Hub nothing and changes nothing, nor
does check mode; a gated model without a token is named with its fix. The 2-VM case is
test_launch.py's e2e (trained from the Hub model, offline)."""

import pytest
from conftest import HUB_MODEL, ROOT, VM, run_playbook, start_hub_double
from localcluster import cluster, spec, train_image

pytestmark = pytest.mark.cluster  # brings up a local cluster

NODES = 8
PLAYBOOK = "tests/integration/playbooks/hub_fetch.yml"
CACHE = "/var/lib/llamafactory/hf-cache/hub"


def hub_definition() -> spec.ClusterSpec:
    """'hub': 8 VMs whose project allows traffic between them (no firewall role here), on
    /24s of shift 6 that no other test cluster uses (198.18.196.0/24, 198.19.194.0/24)."""
    allow = dict(spec.DEFAULT_ALLOW_INTERNAL, sourceRanges=["198.18.4.0/24"])
    return spec.load(
        name="hub",
        shift=6,
        nodes=NODES,
        networks={
            "vpc": {"subnet": "198.18.4.0/24", "mtu": 1460},
            "external": {"subnet": "198.19.2.0/24"},
        },
        firewall=[*spec.load().firewall, allow],
    )


@pytest.fixture(scope="module")
def hub_cluster():
    """(the static inventory, the VMs, the Hub double); the download's small image (the
    training image's huggingface_hub) on rank 0's VM only."""
    definition = hub_definition()
    state = cluster.up(definition)
    double = start_hub_double(definition)
    double.add_repo("hostnet-box/gated", {"config.json": b"{}"}, gated=True)
    try:
        image = train_image.ensure_hub_client_image(cluster.client(), cluster.cache_dir())
        vms = [VM(node) for node in state["nodes"]]
        train_image.load_into(vms[0].node["container"], image)
        yield state["inventory"], vms, double, image
    finally:
        double.stop()
        cluster.down(definition)


def fetch(hub_cluster, tmp_path, model=HUB_MODEL, check=False, **extra):
    inventory, _vms, double, image = hub_cluster
    result, _facts, _results = run_playbook(
        inventory,
        tmp_path,
        PLAYBOOK,
        check=check,
        extravars={
            "llamafactory_job": "hub8",
            # group_vars find it from playbooks/, this playbook is elsewhere
            "llamafactory_config": str(ROOT / "examples/local-demo/llama3_lora_sft_ds3.yaml"),
            "llamafactory_image": image,
            "llamafactory_pull": "never",
            "llamafactory_hf_endpoint": double.url,
            "llamafactory_train_overrides": {"model_name_or_path": model},
            **extra,
        },
    )
    return result


def test_eight_nodes_download_the_model_once_and_a_rerun_nothing(hub_cluster, tmp_path):
    _inventory, vms, double, _image = hub_cluster
    double.reset()
    result = fetch(hub_cluster, tmp_path / "first")
    assert result.rc == 0, result.failures()
    repo = double.repo(HUB_MODEL)
    gets = sorted(r.path.rsplit("/", 1)[1] for r in double.downloads(HUB_MODEL))
    assert gets == sorted(repo.files)  # one download of each file for 8 nodes
    folder = f"{CACHE}/models--hostnet-box--tiny-llama"
    sums = set()
    for vm in vms:
        assert vm.sh(f"cat {folder}/refs/main").stdout == repo.commit
        sums.add(vm.sh(f"cd {folder}/snapshots/{repo.commit} && sha256sum -- *").stdout)
    assert len(sums) == 1
    output = "\n".join(event.get("stdout", "") for event in result.events)
    address = vms[0].node["vpc_address"]
    copies = [line for line in output.splitlines() if f"from http://{address}:" in line]
    assert {line.split("]")[0] + "]" for line in copies if ": done" in line} == {
        f"[{vm.name}]" for vm in vms[1:]
    }

    # Again: every node has it - the Hub is not asked, nothing changes. Then a node that lost
    # its copy, in check mode: nothing is changed (nor asked of the Hub) either.
    double.reset()
    again = fetch(hub_cluster, tmp_path / "again")
    assert again.rc == 0, again.failures()
    assert again.changed() == {}, again.stats
    vms[-1].sh(f"rm -rf {folder}")
    checked = fetch(hub_cluster, tmp_path / "check", check=True)
    assert checked.rc == 0, checked.failures()
    assert vms[-1].sh(f"test -e {folder}", check=False).returncode != 0
    assert double.requests == []


def test_a_gated_model_without_a_token_is_named_with_its_fix(hub_cluster, tmp_path):
    result = fetch(hub_cluster, tmp_path, model="hostnet-box/gated", llamafactory_job="gated")
    assert result.rc != 0
    assert "vm0" in result.failures()
    # the download's loop item carries it (one item per repository)
    message = "\n".join(result.messages())
    assert "downloading hostnet-box/gated failed (hub-gated)" in message
    assert "accept the licence" in message and "llamafactory_hf_token" in message
