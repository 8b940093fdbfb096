"""Playbook-level tests. Fixtures for the ones on the local cluster: one cluster per session,
shared read-only."""

import json
import os
import subprocess
import time
from pathlib import Path

import ansible_run
import pytest
from localcluster import box_api, cluster, hub_double, registry, spec, train_image

ROOT = ansible_run.ROOT


@pytest.fixture(scope="session")
def test_cluster():
    """The default definition as cluster 'test', moved off the demo's subnets. KEEP_CLUSTER=1
    leaves it up for the next session (a developer's loop; `./dev cluster down --name test
    --shift 1` ends it)."""
    definition = spec.load(name="test", shift=1)
    state = cluster.up(definition)
    yield definition, state
    if os.environ.get("KEEP_CLUSTER") != "1":
        cluster.down(definition)


class VM:
    """One VM of a running cluster, for assertions."""

    def __init__(self, node: dict):
        self.node = node
        self.name = node["name"]

    def sh(self, script: str, check: bool = True, timeout: float = 120):
        result = subprocess.run(
            ["docker", "exec", self.node["container"], "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{self.name}: {script!r} failed ({result.returncode}): "
                f"{result.stdout}{result.stderr}"
            )
        return result

    def addresses(self) -> dict[str, dict]:
        """interface name -> {'ipv4': [(address, prefix)], 'mtu': n, 'up': bool}"""
        links = json.loads(self.sh("ip -j addr show").stdout)
        return {
            link["ifname"]: {
                "ipv4": [
                    (a["local"], a["prefixlen"])
                    for a in link.get("addr_info", [])
                    if a["family"] == "inet"
                ],
                "mtu": link["mtu"],
                "up": "UP" in link["flags"],
            }
            for link in links
        }

    def default_route(self) -> dict:
        return json.loads(self.sh("ip -j route show default").stdout)[0]

    def connect(self, address: str, port: int, seconds: float = 3, source: str = "") -> str:
        """A TCP connection from this VM (from `source`, one of its addresses, if given): 'open',
        'refused' (the peer answered: nothing listens) or 'timeout' (dropped on the way, as a
        VPC firewall drops it)."""
        script = (
            "import socket, sys\n"
            "try:\n"
            f"    peer = ({address!r}, {port})\n"
            f"    socket.create_connection(peer, {seconds}, ({source!r}, 0)).close()\n"
            "    print('open')\n"
            "except ConnectionRefusedError:\n"
            "    print('refused')\n"
            "except OSError:\n"
            "    print('timeout')\n"
        )
        return self.sh(f'python3 -c "{script}"').stdout.strip()


# ------------------------------------------------------------------ GCP's GPU machine types

# The GPU cluster's pairs of VMs. Each pair is a job of its own on the GCP path: its VMs carry
# the pair's name as a label (yes), which its inventory filters on, and their rank in it.
GPU_PAIRS = {"tcpxo": ("vm0", "vm1"), "gib": ("vm2", "vm3"), "mixed": ("vm2", "vm1")}
GPU_MACHINE_TYPES = ("a3-megagpu-8g", "a3-megagpu-8g", "a3-ultragpu-8g", "a3-ultragpu-8g")


def gpu_cluster_definition() -> spec.ClusterSpec:
    """'gpubox': vm0, vm1 a3-megagpu-8g (tcpxo: enp0s12 + 8 GPU NICs), vm2, vm3 a3-ultragpu-8g
    (gib: enp0s19, enp192s20 + 8 RDMA NICs), labelled by GPU_PAIRS. shift 6 with the vpc and
    external networks on /24s of that block that no other test cluster uses (198.18.195.0/24,
    198.19.193.0/24; `cp`, also shift 6, takes .192-.194 and 198.19.192), the GPU networks
    derived at 198.18.207-223: up for the whole session beside the other clusters. The
    project's default rules only: each pair's train.yml opens its own paths."""
    vms = []
    for index, machine_type in enumerate(GPU_MACHINE_TYPES):
        name = f"vm{index}"
        labels = {"llamafactory": "training"}
        for pair, names in GPU_PAIRS.items():
            if name in names:
                rank = str(names.index(name))
                assert labels.setdefault("llamafactory-rank", rank) == rank, (name, pair)
                labels[pair] = "yes"
        vms.append({"name": name, "machine_type": machine_type, "labels": labels})
    return spec.load(
        name="gpubox",
        shift=6,
        networks={
            "vpc": {"subnet": "198.18.3.0/24", "mtu": 1460},
            "external": {"subnet": "198.19.1.0/24"},
        },
        vms=vms,
    )


@pytest.fixture(scope="session")
def gpu_cluster():
    """The running 'gpubox' cluster's state (state.json), shared by test_box_gpu_layouts (the
    box) and test_gpu_profiles (the collection on it); torn down at the session's end."""
    definition = gpu_cluster_definition()
    state = cluster.up(definition)
    yield state
    cluster.down(definition)
    assert not cluster.state_dir(definition).exists()


@pytest.fixture(scope="session")
def vms(test_cluster):
    return [VM(node) for node in test_cluster[1]["nodes"]]


def ansible_facts(inventory: str, tmp_path: Path) -> dict[str, dict]:
    """Network facts of every llamafactory host, gathered over SSH."""
    result = ansible_run.run(
        tmp_path,
        inventory,
        module="ansible.builtin.setup",
        module_args="gather_subset=!all,!min,network,distribution",
        timeout=300,
    )
    assert result.rc == 0, f"ansible setup failed: {result.stats}"
    return {host: items[-1]["res"]["ansible_facts"] for host, items in result.results().items()}


def run_module(
    inventory: str,
    tmp_path: Path,
    module: str,
    args: str,
    hosts: str = "llamafactory",
    check: bool = False,
) -> dict[str, dict]:
    """host -> the module's result (failed ones included, with 'failed': True)."""
    result = ansible_run.run(
        tmp_path, inventory, module=module, module_args=args, hosts=hosts, check=check, timeout=300
    )
    return {
        host: {**items[-1]["res"], "failed": not items[-1]["ok"]}
        for host, items in result.results().items()
    }


def run_playbook(
    inventory: str,
    tmp_path: Path,
    playbook: str,
    extravars: dict | None = None,
    check: bool = False,
    **options,
):
    """(the run, host -> the facts set along the way, host -> results)."""
    options["envvars"] = {**BOX_ENV, **(options.get("envvars") or {})}
    result = ansible_run.run(
        tmp_path, inventory, playbook=playbook, extravars=extravars, check=check, **options
    )
    return result, result.facts(), result.results()


# The training image in the cluster's private registry, with its credentials: every play of
# these tests pulls it through the role (the first launch pulls 2 GB on each VM).
PULL_VARS: dict = {}
# How the controller reaches the box's Compute Engine API (its proxy and CA), for every run on
# the GCP path's inventory (the dynamic inventory and the firewall role read it).
BOX_ENV: dict = {}
# llamafactory_output_uri in the box's bucket, for the jobs that keep their outputs there.
OUTPUTS: dict = {}


@pytest.fixture(scope="session")
def train_cluster(test_cluster):
    """The session's cluster on the GCP path (its inventory the shipped dynamic one pointed at
    the box, llamafactory_platform gcp, the box's project without a rule between the VMs until
    train.yml's firewall role makes one), its registry holding the training image, the demo's
    assets: (the GCP path's inventory, the VMs)."""
    definition, state = test_cluster
    client = cluster.client()
    train_image.ensure_assets(client, cluster.cache_dir())
    found = registry.start(definition, client, cluster.cache_dir())
    image = registry.push(client, found, train_image.TRAIN_IMAGE, registry.TRAIN_REPOSITORY)
    PULL_VARS.update(
        llamafactory_image=image,
        llamafactory_registry_username=found.username,
        llamafactory_registry_password=found.password,
    )
    BOX_ENV.update(state["gce"]["env"])
    OUTPUTS.update(llamafactory_output_uri=f"gs://{state['gcs']['bucket']}/tests")
    return state["gcp_inventory"], [VM(node) for node in state["nodes"]]


def follow_restarts(test_cluster, vms):
    """The session's view of the VMs after some were stopped and started: a started VM has a new
    external address (state.json has it; the VM objects and the session's state share the node
    dicts, so every later test sees it)."""
    definition, state = test_cluster
    saved = json.loads((cluster.state_dir(definition) / "state.json").read_text())
    fresh = {node["name"]: node for node in saved["nodes"]}
    for node in state["nodes"]:
        node.update(fresh[node["name"]])
    for vm in vms:
        vm.node.update(fresh[vm.name])


# The demo's tiny model and dataset as Hub repositories of the session's Hub double.
HUB_MODEL = "hostnet-box/tiny-llama"
HUB_DATASET = "hostnet-box/alpaca-tiny"


def start_hub_double(definition: spec.ClusterSpec, **options) -> hub_double.HubDouble:
    """The Hub double on the cluster's VPC gateway (the host's address on the VMs' network),
    serving the demo's tiny model as HUB_MODEL."""
    double = hub_double.on_cluster(definition, **options)
    model = cluster.cache_dir() / "assets" / "model"
    double.add_repo(HUB_MODEL, {p.name: p for p in sorted(model.iterdir()) if p.is_file()})
    return double


@pytest.fixture(scope="session")
def hub(train_cluster, test_cluster, tmp_path_factory):
    """The session cluster's Hub double (after train_cluster: the assets exist), with the demo's
    dataset as HUB_DATASET too; its `dataset_dir`: a dataset_dir that names it (alpaca_tiny,
    as the demo's config does) by hf_hub_url."""
    double = start_hub_double(test_cluster[0])
    data = cluster.cache_dir() / "assets" / "data" / "alpaca_tiny.json"
    double.add_repo(HUB_DATASET, {"alpaca_tiny.json": data}, repo_type="dataset")
    double.dataset_dir = tmp_path_factory.mktemp("hub-data")
    info = {"alpaca_tiny": {"hf_hub_url": HUB_DATASET}}
    (double.dataset_dir / "dataset_info.json").write_text(json.dumps(info))
    yield double
    double.stop()


@pytest.fixture(scope="session")
def box(train_cluster, test_cluster):
    """The session cluster's Compute Engine API, as a GCP client reaches it."""
    client = box_api.Box(test_cluster[1]["gce"])
    yield client
    client.close()


@pytest.fixture(scope="session")
def bucket(train_cluster, test_cluster):
    """The session cluster's Cloud Storage (its bucket), as a GCP client reaches it; jobs given
    **OUTPUTS write their outputs under its tests/ prefix."""
    client = box_api.Storage(test_cluster[1]["gcs"])
    yield client
    client.close()


NODES_RULE = "llamafactory-nodes"  # the gcp_firewall role's rule between the nodes


@pytest.fixture(scope="session")
def nodes_rule(train_cluster, box, tmp_path_factory):
    """The rule between the nodes as the gcp_firewall role makes it (run alone when no train.yml
    of the session made it yet); tests that delete it put it back (put_back)."""
    rule = box.rule(NODES_RULE)
    if rule is None:
        result, _facts, _results = run_playbook(
            train_cluster[0],
            tmp_path_factory.mktemp("nodes-rule"),
            "tests/integration/playbooks/firewall.yml",
            {
                **PULL_VARS,
                "llamafactory_job": "nodes-rule",
                # group_vars find it from playbooks/, this playbook is elsewhere
                "llamafactory_config": str(ROOT / "examples/local-demo/llama3_lora_sft_ds3.yaml"),
            },
        )
        assert result.rc == 0, result.failures()
        rule = box.rule(NODES_RULE)
    return rule


def put_back(box, rule):
    """The role's rule as it was (a test deleted or changed it behind the role's back)."""
    if box.rule(rule["name"]) is not None:
        box.delete_rule(rule["name"])
    box.insert_rule(rule)


# ------------------------------------------------------------------ playing a job

TRAIN = "playbooks/train.yml"
JOBS = "/var/lib/llamafactory/jobs"


def play(
    inventory, tmp_path, job, playbook=TRAIN, check=False, forks=None, timeout=600, **extravars
):
    """Run a playbook for `job`; (rc, stats, failures: host -> msg, events). `forks`: the
    run's (ansible.cfg's 25 otherwise); `timeout`: ansible-runner's, for the whole run."""
    result, _facts, _results = run_playbook(
        inventory,
        tmp_path,
        playbook,
        # One results folder for the runs of a test: a re-run finds the same files there.
        extravars={
            **PULL_VARS,
            "llamafactory_job": job,
            "launch_results_dir": str(tmp_path.parent / "results"),
            **extravars,
        },
        check=check,
        forks=forks,
        timeout=timeout,
    )
    return summarize(result)


def summarize(result: ansible_run.Run):
    return result.rc, result.stats, result.failures(), result.events


def container(vm, job):
    result = vm.sh(f"docker inspect llamafactory-{job}", check=False)
    return json.loads(result.stdout)[0] if result.returncode == 0 else None


def forget_job(vms, job):
    """No container or folder left of `job` by an earlier session on a kept cluster
    (KEEP_CLUSTER=1): a test that waits for the job's files must not find old ones."""
    for vm in vms:
        vm.sh(f"docker rm -f llamafactory-{job} >/dev/null 2>&1; rm -rf {JOBS}/{job}")


def kill_worker(vm, job):
    """SIGKILL to the rank's training worker (torchrun's child, not torchrun), as the host's
    OOM killer or an operator would."""
    top = vm.sh(f"docker top llamafactory-{job} -eo pid,args").stdout
    worker = next(
        line.split()[0]
        for line in top.splitlines()
        if "launcher.py" in line and "torchrun" not in line
    )
    vm.sh(f"kill -9 {worker}")


def wait_until(predicate, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"not within {seconds} s: {what}")


def assert_resumed(steps, resumed_at, lost, last):
    """A trainer log (each line's current_steps) of a run resumed from checkpoint-`resumed_at`
    after losing `lost` steps: one run from step 1, then the resumed one to the `last` step
    (LLaMA-Factory appends on resume). The log drops back to resumed_at + 1 where steps were
    lost, and goes straight on where the failure came right at the checkpoint."""
    assert steps.count(1) == 1 and steps[-1] == last, steps  # resumed, not started over
    again = next((i for i in range(1, len(steps)) if steps[i] < steps[i - 1]), None)
    if lost:
        assert again is not None and steps[again] == resumed_at + 1, (resumed_at, lost, steps)
    else:
        assert again is None and resumed_at + 1 in steps, (resumed_at, steps)


def said(events):
    """Every task's msg and warnings (not wrapped as the callback prints them)."""
    found = []
    for event in events:
        res = (event.get("event_data") or {}).get("res") or {}
        found.extend(str(w) for w in res.get("warnings") or [])
        if "msg" in res:
            found.append(str(res["msg"]))
    return "\n".join(found)
