"""train.yml per network profile on the local cluster's GPU machine types (issue 17), to the
launch: the plugin installed by its (stand-in) installer image, TCPXO's (stand-in) RxDM running,
each rank's environment, mounts and devices as the profile says, and the negative cases named.

One cluster of its own, 'gpujob' (module scope): vm0, vm1 a3-megagpu-8g (tcpxo), vm2, vm3
a3-ultragpu-8g (gib). Each pair gets its own inventory beside the cluster's (the local group
vars apply). The job is the stand-in (tools/localcluster/standin: no torch, so no smoke test);
the plugins and RxDM are the stand-ins of tools/localcluster/gpu_standins.py (no GPU, no
Artifact Registry here): what is checked is what the collection does with them."""

import json

import pytest
import yaml
from conftest import PULL_VARS, ROOT, TRAIN, VM, play, run_playbook
from localcluster import cluster, gpu_standins, spec, train_image

pytestmark = pytest.mark.cluster  # brings up a local cluster

PAIRS = {"tcpxo": ("vm0", "vm1"), "gib": ("vm2", "vm3"), "mixed": ("vm1", "vm2")}
# The stand-in job, detached: the play ends at the launch, the ranks keep running.
JOB_VARS = {
    "preflight_smoke_test": False,  # the stand-in image has no torch
    "llamafactory_train_overrides": {"max_steps": 400, "save_steps": 400},
    "launch_wait": False,
}


def definition() -> spec.ClusterSpec:
    """shift 7 on /24s no other test cluster uses (vpc 198.18.228.0/24, external
    198.19.226.0/24; 'md', also shift 7, takes the default ones), the GPU networks derived
    above them; the VPC open between the VMs (a fresh project's default-allow-internal)."""
    rules = yaml.safe_load(spec.DEFAULT_DEFINITION.read_text())["firewall"]
    internal = dict(spec.DEFAULT_ALLOW_INTERNAL, sourceRanges=["198.18.4.0/24"])
    return spec.load(
        name="gpujob",
        shift=7,
        networks={
            "vpc": {"subnet": "198.18.4.0/24", "mtu": 1460},
            "external": {"subnet": "198.19.2.0/24"},
        },
        vms=[
            {"name": "vm0", "machine_type": "a3-megagpu-8g"},
            {"name": "vm1", "machine_type": "a3-megagpu-8g"},
            {"name": "vm2", "machine_type": "a3-ultragpu-8g"},
            {"name": "vm3", "machine_type": "a3-ultragpu-8g"},
        ],
        firewall=[*rules, internal],
    )


@pytest.fixture(scope="module")
def gpu_jobs():
    """(inventory per pair, VM per name, the stand-in job's image)."""
    found = definition()
    state = cluster.up(found)
    client = cluster.client()
    image = train_image.ensure_standin_image(client, cluster.cache_dir())
    gpu_standins.ensure_images(client, cluster.cache_dir())
    for node in state["nodes"]:
        profile = spec.MACHINE_TYPES[node["machine_type"]]["profile"]
        train_image.load_into(node["container"], image)
        gpu_standins.load_into(node["container"], gpu_standins.wanted(profile))
    written = yaml.safe_load(found.inventory.read_text().split("\n---\n", 1)[1])
    group = written["all"]["children"]["llamafactory"]
    inventories = {}
    for pair, names in PAIRS.items():
        hosts = {
            name: dict(group["hosts"][name], llamafactory_node_rank=rank)
            for rank, name in enumerate(names)
        }
        path = found.inventory.with_name(f"gpujob-{pair}.yml")
        path.write_text(
            yaml.safe_dump(
                {"all": {"children": {"llamafactory": {"hosts": hosts, "vars": group["vars"]}}}}
            )
        )
        inventories[pair] = str(path)
    yield inventories, {n["name"]: VM(n) for n in state["nodes"]}, image
    for path in inventories.values():
        ROOT.joinpath(path).unlink(missing_ok=True)
    cluster.down(found)


def rank_of(vm, job):
    """The rank's container as Docker sees it, its env file and agent settings, and the
    environment the training process runs with (the agent's child, not the agent)."""
    inspected = json.loads(vm.sh(f"docker inspect llamafactory-{job}").stdout)[0]
    folder = f"/var/lib/llamafactory/jobs/{job}"
    env_file = dict(
        line.split("=", 1) for line in vm.sh(f"cat {folder}/env").stdout.splitlines() if line
    )
    agent = json.loads(vm.sh(f"cat {folder}/agent.json").stdout)
    # The stand-in job's process: the one whose command line names llamafactory-cli.
    script = (
        "for p in /proc/[0-9]*; do "
        'if tr "\\0" " " < $p/cmdline 2>/dev/null | grep -q "llamafactory-cli train" && '
        '! tr "\\0" " " < $p/cmdline | grep -q rank_agent; then '
        'tr "\\0" "\\n" < $p/environ; exit 0; fi; done; exit 1'
    )
    running = vm.sh(f"docker exec llamafactory-{job} sh -c '{script}'").stdout
    environ = dict(line.split("=", 1) for line in running.splitlines() if "=" in line)
    return inspected, env_file, agent, environ


def stop(vms, job):
    for vm in vms:
        vm.sh(f"docker rm -f llamafactory-{job} >/dev/null 2>&1 || true")


def test_tcpxo_pair_installs_the_plugin_runs_rxdm_and_launches_with_its_environment(
    gpu_jobs, tmp_path
):
    inventories, vms, image = gpu_jobs
    rc, _stats, failures, _events = play(
        inventories["tcpxo"], tmp_path, "gpu-tcpxo", llamafactory_image=image, **JOB_VARS
    )
    assert rc == 0, failures
    try:
        vm0 = vms["vm0"]
        gpu_nics = ",".join(f"enp{n}s0" for n in (6, 7, 13, 14, 134, 135, 141, 142))
        # The plugin from the installer image, with the marker of the installer it came from.
        listed = vm0.sh("ls /var/lib/tcpxo/lib64").stdout.split()
        assert {"nccl-env-profile.sh", "libnccl-net.so", "a3plus_guest_config.textproto"} <= set(
            listed
        )
        installer = gpu_standins.IMAGES["tcpxo_installer"]
        marker = vm0.sh("cat /var/lib/tcpxo/lib64/.hostnet-llamafactory-installer").stdout
        assert (
            marker.strip()
            == vm0.sh(f"docker image inspect -f '{{{{.Id}}}}' {installer}").stdout.strip()
        )
        # RxDM up, with the prolog's flags, and ready.
        rxdm = json.loads(vm0.sh("docker inspect receive-datapath-manager").stdout)[0]
        assert rxdm["State"]["Running"] and rxdm["HostConfig"]["NetworkMode"] == "host"
        assert rxdm["Args"] == ["--num_hops=2"]
        assert (
            "Buffer manager initialization complete"
            in vm0.sh("docker logs receive-datapath-manager 2>&1").stdout
        )
        for name in ("vm0", "vm1"):
            inspected, env_file, agent, environ = rank_of(vms[name], "gpu-tcpxo")
            assert env_file["NCCL_FASTRAK_IFNAME"] == gpu_nics
            assert env_file["NCCL_FASTRAK_CTRL_DEV"] == "enp0s12"
            assert env_file["NCCL_SOCKET_IFNAME"] == "=enp0s12"
            assert env_file["NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY"] == "/dev/aperture_devices"
            assert "NCCL_IB_DISABLE" not in env_file
            assert agent["network"] == {
                "env_script": "/var/lib/tcpxo/lib64/nccl-env-profile.sh",
                "library_path": ["/var/lib/tcpxo/lib64", "/usr/lib/x86_64-linux-gnu"],
            }
            mounts = {m["Destination"]: m for m in inspected["Mounts"]}
            assert not mounts["/var/lib/tcpxo/lib64"]["RW"]
            assert "/dev/aperture_devices" in mounts
            # The training runs with the plugin's script sourced under the job's values.
            assert environ["NCCL_PROTO"] == "Simple,LL128"  # the script's (tuned) value
            assert environ["NCCL_SOCKET_IFNAME"] == "=enp0s12"  # ours, not the script's
            assert environ["NCCL_FASTRAK_IFNAME"] == gpu_nics
            assert environ["LD_LIBRARY_PATH"].startswith(
                "/var/lib/tcpxo/lib64:/usr/lib/x86_64-linux-gnu"
            )
    finally:
        stop([vms["vm0"], vms["vm1"]], "gpu-tcpxo")
    # A second run changes nothing on the hosts' setup (the installer does not run again).
    rc, _stats, failures, events = play(
        inventories["tcpxo"],
        tmp_path / "again",
        "gpu-tcpxo-2",
        llamafactory_image=image,
        **JOB_VARS,
    )
    try:
        assert rc == 0, failures
        setup = [
            e["event_data"]
            for e in events
            if e.get("event") in ("runner_on_ok", "runner_item_on_ok")
            and e["event_data"].get("role") == "nccl_plugin"
        ]
        assert setup, "nccl_plugin did not run"
        changed = [d["task"] for d in setup if d["res"].get("changed")]
        assert changed == []
        assert not any(d["task"].startswith("Run the installer") for d in setup)
    finally:
        stop([vms["vm0"], vms["vm1"]], "gpu-tcpxo-2")


def test_gib_pair_installs_the_plugin_and_passes_the_rdma_devices(gpu_jobs, tmp_path):
    inventories, vms, image = gpu_jobs
    rc, _stats, failures, _events = play(
        inventories["gib"], tmp_path, "gpu-gib", llamafactory_image=image, **JOB_VARS
    )
    assert rc == 0, failures
    try:
        vm2 = vms["vm2"]
        assert vm2.sh("test -f /var/lib/gib/scripts/set_nccl_env.sh", check=False).returncode == 0
        assert vm2.sh("docker inspect receive-datapath-manager", check=False).returncode != 0
        for name in ("vm2", "vm3"):
            inspected, env_file, _agent, environ = rank_of(vms[name], "gpu-gib")
            assert env_file["NCCL_NET"] == "gIB"
            assert env_file["NCCL_SOCKET_IFNAME"] == "=enp0s19,enp192s20"
            assert "NCCL_IB_DISABLE" not in env_file
            devices = [d["PathOnHost"] for d in inspected["HostConfig"]["Devices"] or []]
            assert devices == ["/dev/infiniband"]
            assert "/var/lib/gib" in {m["Destination"] for m in inspected["Mounts"]}
            assert environ["NCCL_IB_GID_INDEX"] == "3"  # set_nccl_env.sh's
            assert environ["NCCL_NET"] == "gIB"
            assert environ["LD_LIBRARY_PATH"].startswith("/var/lib/gib/lib64:")
    finally:
        stop([vms["vm2"], vms["vm3"]], "gpu-gib")


def test_the_negative_cases_are_named_before_the_ranks_start(gpu_jobs, tmp_path):
    inventories, vms, image = gpu_jobs
    # Nodes whose machine types call for different profiles: refused at discovery.
    rc, _stats, failures, _events = play(
        inventories["mixed"], tmp_path / "mixed", "gpu-mixed", llamafactory_image=image, **JOB_VARS
    )
    assert rc != 0
    assert "different NCCL transports" in json.dumps(failures)
    assert '"vm1": "tcpxo: machine type a3-megagpu-8g"' in json.dumps(failures).replace('\\"', '"')
    # A profile that contradicts the machine type: the fix named.
    rc, _stats, failures, _events = play(
        inventories["gib"],
        tmp_path / "wrong",
        "gpu-wrong",
        llamafactory_image=image,
        llamafactory_network_profile="tcpxo",
        **JOB_VARS,
    )
    assert rc != 0
    assert "a3-ultragpu-8g uses gib" in json.dumps(failures)
    # The plugin gone from a node, its host setup skipped: the preflight names it, no rank starts.
    vms["vm3"].sh("rm -rf /var/lib/gib")
    result, _facts, _results = run_playbook(
        inventories["gib"],
        tmp_path / "missing",
        TRAIN,
        {**PULL_VARS, "llamafactory_job": "gpu-missing", "llamafactory_image": image, **JOB_VARS},
        skip_tags="nccl_plugin_install",
    )
    assert result.rc != 0
    text = json.dumps(result.failures())
    assert "vm3 has no /var/lib/gib/scripts/set_nccl_env.sh" in text, text
    assert "network-plugin-missing" in text or "install the plugin" in text, text
    assert vms["vm3"].sh("docker inspect llamafactory-gpu-missing", check=False).returncode != 0
