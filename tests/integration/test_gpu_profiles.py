"""train.yml per network profile on the local cluster's GPU machine types, on the GCP path, to
the launch: the firewall's rule per GPU VPC (none on the RoCE one), the plugin installed by its
(stand-in) installer image, TCPXO's (stand-in) RxDM running, each rank's
environment, mounts and devices as the profile says, cleanup.yml closing the GPU VPCs again,
and the negative cases named.

On the session's GPU cluster (conftest.gpu_cluster, shared with test_box_gpu_layouts). Each
pair of conftest.GPU_PAIRS is a job of its own: the box's GCP-path inventory filtered on the
pair's label, its firewall rules under a cluster name of its own. The job is the stand-in
(tools/localcluster/standin: no torch, so no smoke test); the plugins and RxDM are the
stand-ins of tools/localcluster/gpu_standins.py (no GPU, no Artifact Registry here): what is
checked is what the collection does with them."""

import concurrent.futures
import json
import shutil
import subprocess
import time
from dataclasses import dataclass

import pytest
import yaml
from conftest import GPU_PAIRS, ROOT, TRAIN, VM, run_playbook
from localcluster import box_api, cluster, gpu_standins, spec, train_image

pytestmark = pytest.mark.cluster  # brings up a local cluster

# The stand-in job, detached: the play ends at the launch, the ranks keep running.
JOB_VARS = {
    "preflight_smoke_test": False,  # the stand-in image has no torch
    "llamafactory_train_overrides": {"max_steps": 400, "save_steps": 400},
    "launch_wait": False,
}
CLEANUP = "playbooks/cleanup.yml"
PORT = 31500  # a listener on every NIC of vm1, for the GPU VPCs' paths
OPEN_WITHIN_S = 5.0
# Serves one line to every connection, forever (the VM's python3; detached by docker exec -d).
SERVE = f"""
import socket
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", {PORT}))
server.listen(16)
while True:
    peer, _ = server.accept()
    peer.sendall(b"pong\\n")
    peer.close()
"""


@dataclass
class GpuJobs:
    inventories: dict[str, str]  # pair -> its GCP-path inventory folder
    vms: dict[str, VM]
    image: str  # the stand-in job's
    box: box_api.Box
    env: dict[str, str]  # how Ansible reaches the box's API

    def run(self, pair, tmp_path, playbook=TRAIN, skip_tags=None, **extravars):
        """One run for `pair`, its rules under the cluster name gpu-<pair>."""
        result, _facts, _results = run_playbook(
            self.inventories[pair],
            tmp_path,
            playbook,
            {
                "llamafactory_image": self.image,
                "gcp_firewall_cluster_name": f"gpu-{pair}",
                "launch_results_dir": str(tmp_path.parent / "results"),
                **JOB_VARS,
                **extravars,
            },
            envvars=self.env,
            skip_tags=skip_tags,
        )
        return result


def pair_inventory(state: dict, pair: str) -> str:
    """The box's GCP-path inventory folder, copied with its dynamic inventory filtered on the
    pair's label (the group_vars link comes along)."""
    source = ROOT / state["gcp_inventory"]
    folder = source.with_name(f"{source.name.removesuffix('.gcp')}-{pair}.gcp")
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(source, folder, symlinks=True)
    config = folder / "gcp_compute.yml"
    loaded = yaml.safe_load(config.read_text())
    loaded["filters"] = [*loaded["filters"], f"labels.{pair} = yes"]
    config.write_text(yaml.safe_dump(loaded, sort_keys=False))
    return str(folder)


@pytest.fixture(scope="module")
def gpu_jobs(gpu_cluster):
    """The GPU cluster with the stand-in job's image and each VM's profile's stand-ins loaded
    (one stream per VM, the VMs in parallel) and an inventory per pair."""
    client = cluster.client()
    image = train_image.ensure_standin_image(client, cluster.cache_dir())
    gpu_standins.ensure_images(client, cluster.cache_dir())
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(len(gpu_cluster["nodes"])) as pool:
        loads = [
            pool.submit(
                gpu_standins.load_into,
                node["container"],
                [image, *gpu_standins.wanted(spec.MACHINE_TYPES[node["machine_type"]]["profile"])],
            )
            for node in gpu_cluster["nodes"]
        ]
        for load in loads:
            load.result()
    print(f"images in every VM in {time.monotonic() - started:.1f} s")
    inventories = {pair: pair_inventory(gpu_cluster, pair) for pair in GPU_PAIRS}
    box = box_api.Box(gpu_cluster["gce"])
    vms = {n["name"]: VM(n) for n in gpu_cluster["nodes"]}
    try:
        yield GpuJobs(inventories, vms, image, box, gpu_cluster["gce"]["env"])
    finally:
        box.close()
        for folder in inventories.values():
            shutil.rmtree(folder, ignore_errors=True)


def summary(result) -> str:
    """The gcp_firewall role's report (its debug task's lines)."""
    for host_results in result.results().values():
        for item in host_results:
            if str(item["task"]).startswith("Report the rules"):
                return "\n".join(item["res"]["msg"])
    raise AssertionError("the firewall role reported nothing")


def role_tasks(result, role: str) -> list[dict]:
    return [
        e["event_data"]
        for e in result.events
        if e.get("event") in ("runner_on_ok", "runner_item_on_ok")
        and e["event_data"].get("role") == role
    ]


def paths(source: VM, target: VM, nics: str, indexes) -> dict[str, str]:
    """source's NIC to target's listener on the networks of their `nics` (control_nics or
    gpu_nics) at `indexes`: network -> 'open', 'refused' or 'timeout'."""
    found = {}
    for index in indexes:
        here, there = source.node[nics][index], target.node[nics][index]
        found[there["gce_network"]] = source.connect(there["address"], PORT, 1, here["address"])
    return found


def opened(source: VM, target: VM, nics: str, indexes) -> None:
    started = time.monotonic()
    while set(found := paths(source, target, nics, indexes).values()) != {"open"}:
        assert time.monotonic() - started < OPEN_WITHIN_S, found


def serve(vm: VM) -> None:
    subprocess.run(
        ["docker", "exec", "-d", vm.node["container"], "python3", "-c", SERVE], check=True
    )


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


def test_tcpxo_pair_opens_its_gpu_vpcs_installs_the_plugin_runs_rxdm_and_launches_with_its_env(
    gpu_jobs, tmp_path
):
    vms, box = gpu_jobs.vms, gpu_jobs.box
    vm0, vm1 = vms["vm0"], vms["vm1"]
    gpu_networks = [n["gce_network"] for n in vm0.node["gpu_nics"]]
    serve(vm1)
    result = gpu_jobs.run("tcpxo", tmp_path / "first", llamafactory_job="gpu-tcpxo")
    assert result.rc == 0, result.failures()
    try:
        gpu_nics = ",".join(f"enp{n}s0" for n in (6, 7, 13, 14, 134, 135, 141, 142))
        # The firewall: the nodes rule and one per GPU VPC (CLUSTER-nodes-NETWORK: the
        # network's name has no leading CLUSTER- to drop), each from the nodes' NICs there.
        held = {name: rule for name, rule in box.rules().items() if name.startswith("gpu-tcpxo-")}
        assert set(held) == {"gpu-tcpxo-nodes", *(f"gpu-tcpxo-nodes-{n}" for n in gpu_networks)}
        network_link = held["gpu-tcpxo-nodes"]["network"].rsplit("/", 1)[0]
        for index, network in enumerate(gpu_networks):
            rule = held[f"gpu-tcpxo-nodes-{network}"]
            assert rule["network"] == f"{network_link}/{network}"
            sources = sorted(f"{vm.node['gpu_nics'][index]['address']}/32" for vm in (vm0, vm1))
            assert sorted(rule["sourceRanges"]) == sources
            assert rule["description"].startswith("hostnet.llamafactory cluster gpu-tcpxo:")
        assert sorted(held["gpu-tcpxo-nodes"]["sourceRanges"]) == sorted(
            f"{vm.node['vpc_address']}/32" for vm in (vm0, vm1)
        )
        opened(vm0, vm1, "gpu_nics", (0, 7))  # the first and the last GPU VPC
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
        for vm in (vm0, vm1):
            inspected, env_file, agent, environ = rank_of(vm, "gpu-tcpxo")
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
        # train.yml again while the job runs (it attaches): the hosts' setup changes nothing (the
        # installer does not run again, RxDM is left alone), nor does the firewall.
        result = gpu_jobs.run("tcpxo", tmp_path / "again", llamafactory_job="gpu-tcpxo")
        assert result.rc == 0, result.failures()
        setup = role_tasks(result, "nccl_plugin")
        assert setup, "nccl_plugin did not run"
        assert [d["task"] for d in setup if d["res"].get("changed")] == []
        assert not any(d["task"].startswith("Run the installer") for d in setup)
        report = summary(result).splitlines()
        assert all(line.endswith(": no change") for line in report), report
        rxdm_again = json.loads(vm0.sh("docker inspect receive-datapath-manager").stdout)[0]
        assert rxdm_again["State"]["StartedAt"] == rxdm["State"]["StartedAt"]
    finally:
        stop([vm0, vm1], "gpu-tcpxo")


def test_gib_pair_opens_its_control_vpcs_only_installs_the_plugin_and_passes_the_rdma_devices(
    gpu_jobs, tmp_path
):
    vms, box = gpu_jobs.vms, gpu_jobs.box
    vm2, vm3 = vms["vm2"], vms["vm3"]
    boot = box.rules()
    # A rule of the project with a name of the role's pattern but not its mark (made by hand).
    net1 = vm2.node["control_nics"][1]["gce_network"]
    by_hand = {
        "name": "gpu-gib-nodes-by-hand",
        "description": "made by hand",
        "network": boot["default-allow-ssh"]["network"].replace("/default", f"/{net1}"),
        "sourceRanges": ["198.18.3.99/32"],
        "allowed": [{"IPProtocol": "tcp", "ports": ["1"]}],
    }
    box.insert_rule(by_hand)
    serve(vm3)
    result = gpu_jobs.run("gib", tmp_path / "first", llamafactory_job="gpu-gib")
    try:
        assert result.rc == 0, result.failures()
        # The nodes rule and one for the second control NIC's VPC (net-1); none on the RoCE
        # VPC, and the report says why.
        held = box.rules()
        assert set(held) - set(boot) - {by_hand["name"]} == {
            "gpu-gib-nodes",
            f"gpu-gib-nodes-{net1}",
        }
        assert held[by_hand["name"]]["description"] == "made by hand"
        assert "an RDMA VPC" in summary(result)
        opened(vm2, vm3, "control_nics", (1,))
        assert vm2.sh("test -f /var/lib/gib/scripts/set_nccl_env.sh", check=False).returncode == 0
        assert vm2.sh("docker inspect receive-datapath-manager", check=False).returncode != 0
        for vm in (vm2, vm3):
            inspected, env_file, _agent, environ = rank_of(vm, "gpu-gib")
            assert env_file["NCCL_NET"] == "gIB"
            assert env_file["NCCL_SOCKET_IFNAME"] == "=enp0s19,enp192s20"
            assert "NCCL_IB_DISABLE" not in env_file
            devices = [d["PathOnHost"] for d in inspected["HostConfig"]["Devices"] or []]
            assert devices == ["/dev/infiniband"]
            assert environ["NCCL_IB_GID_INDEX"] == "3"  # set_nccl_env.sh's
            assert environ["NCCL_NET"] == "gIB"
            # What the plugin's script names (its files under /usr/local/gib, as Google's) and
            # the library path are there, in the rank's container.
            library = environ["LD_LIBRARY_PATH"].split(":")[0] + "/libnccl-net.so"
            named = [
                environ["NCCL_TUNER_CONFIG_PATH"],
                environ["NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE"],
                library,
            ]
            for path in named:
                found = vm.sh(f"docker exec llamafactory-gpu-gib test -f {path}", check=False)
                assert found.returncode == 0, f"{path} is not in {vm.name}'s rank container"
            # The installer's folder where set_nccl_env.sh names its files: /usr/local/gib.
            assert environ["LD_LIBRARY_PATH"].startswith("/usr/local/gib/lib64:")
            mounts = {m["Destination"]: m for m in inspected["Mounts"]}
            assert mounts["/usr/local/gib"]["Source"] == "/var/lib/gib"
            assert not mounts["/usr/local/gib"]["RW"]
    finally:
        # cleanup.yml: the job's ranks, then (no job left) its rules, the hand-made one kept.
        cleaned = gpu_jobs.run("gib", tmp_path / "cleanup", CLEANUP, llamafactory_job="gpu-gib")
        assert cleaned.rc == 0, cleaned.failures()
    assert set(box.rules()) == set(boot) | {by_hand["name"]}
    assert paths(vm2, vm3, "control_nics", (1,)) == {net1: "timeout"}
    box.delete_rule(by_hand["name"])


def test_the_negative_cases_are_named_before_the_ranks_start(gpu_jobs, tmp_path):
    vms = gpu_jobs.vms
    # Nodes whose machine types call for different profiles: refused at discovery.
    result = gpu_jobs.run("mixed", tmp_path / "mixed", llamafactory_job="gpu-mixed")
    assert result.rc != 0
    text = json.dumps(result.failures()).replace('\\"', '"')
    assert "different NCCL transports" in text
    assert '"vm1": "tcpxo: machine type a3-megagpu-8g"' in text, text
    # A profile that contradicts the machine type: the fix named.
    result = gpu_jobs.run(
        "gib",
        tmp_path / "wrong",
        llamafactory_job="gpu-wrong",
        llamafactory_network_profile="tcpxo",
    )
    assert result.rc != 0
    assert "a3-ultragpu-8g uses gib" in json.dumps(result.failures())
    # The plugin gone from a node, its host setup skipped: the preflight names it, no rank starts.
    vms["vm3"].sh("rm -rf /var/lib/gib")
    result = gpu_jobs.run(
        "gib", tmp_path / "missing", llamafactory_job="gpu-missing", skip_tags="nccl_plugin_install"
    )
    assert result.rc != 0
    text = json.dumps(result.failures())
    assert "vm3 has no /var/lib/gib/scripts/set_nccl_env.sh" in text, text
    assert "network-plugin-missing" in text or "install the plugin" in text, text
    assert vms["vm3"].sh("docker inspect llamafactory-gpu-missing", check=False).returncode != 0
