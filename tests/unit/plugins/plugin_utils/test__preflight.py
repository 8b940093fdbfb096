"""The preflight's verdict (plugins/plugin_utils/_preflight.py) over probe reports captured on the
local cluster (tests/unit/fixtures/preflight, made by its capture.py): healthy, a port range
dropped on vm1, bridge networking, and the external NIC chosen instead of the VPC's."""

import copy
import json
from pathlib import Path

import pytest
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _gpu_health
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _preflight as preflight

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "preflight"


def case(name):
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    reports = {host: {"report": report, "error": ""} for host, report in data["reports"].items()}
    return data, reports


def verdict(data, reports, **options):
    master = data["nodes"]["vm0"]["address"]
    return preflight.findings(
        reports,
        data["nodes"],
        master,
        data["master_port"],
        data["probe_port"],
        network_mode=data["network_mode"],
        **options,
    )


def test_healthy_cluster_has_no_findings():
    data, reports = case("healthy")
    assert verdict(data, reports, min_free_gb=10) == []
    for report in data["reports"].values():
        assert all(r["ok"] for r in report["results"])
        assert report["source"] == report["bind"]  # host network: the node's own address


def test_a_dropped_port_range_is_named_with_the_firewall_fix():
    data, reports = case("blocked-port")
    found = verdict(data, reports)
    assert [f["id"] for f in found] == ["peer-unreachable"]
    assert "vm0 (rank 0) cannot reach vm1 at 198.18.96.11:49600" in found[0]["cause"]
    assert "timed out" in found[0]["cause"]
    assert "gcp_firewall" in found[0]["fix"] and "iptables -S" in found[0]["fix"]
    # vm1 -> vm0 works: the rule drops new connections to vm1 only.


def test_rank_0s_agent_port_taken_is_named():
    """Rank 0's probe gathers on the agents' port: taken there, the rank's agent could not
    listen either."""
    data, reports = case("healthy")
    reports["vm0"]["report"]["collect_error"] = (
        "cannot gather the reports on port 39600: [Errno 98] Address already in use"
    )
    found = verdict(data, reports)
    assert [f["id"] for f in found] == ["port-in-use"]
    assert found[0]["cause"].startswith("vm0 (rank 0): cannot gather the reports on port 39600")
    assert "launch_agent_port" in found[0]["fix"]
    reports["vm0"]["report"]["collect_error"] = ""
    assert verdict(data, reports) == []


def test_bridge_networking_is_named_once_per_node():
    data, reports = case("bridge")
    found = verdict(data, reports)
    assert [f["id"] for f in found] == ["container-not-on-host-network"] * 2
    assert "sends from 172.17.0.3" in found[0]["cause"]
    assert "network mode bridge" in found[0]["cause"]
    assert found[0]["fix"] == "set llamafactory_network_mode=host (the default)"


def test_the_wrong_nic_names_the_override():
    data, reports = case("wrong-nic")
    for node in data["nodes"].values():
        node["method"] = "override"
    found = verdict(data, reports)
    ids = sorted(f["id"] for f in found)
    assert ids == ["master-unreachable", "peer-unreachable", "peer-unreachable"]
    master = next(f for f in found if f["id"] == "master-unreachable")
    assert "vm1 (rank 1) cannot reach MASTER_ADDR:MASTER_PORT 198.19.96.10:29600" in master["cause"]
    assert "llamafactory_interface" in master["fix"] and "vm0's ext0" in master["fix"]


def test_without_an_override_the_fix_does_not_blame_one():
    data, reports = case("wrong-nic")
    found = verdict(data, reports)
    assert found and all("llamafactory_interface" not in f["fix"] for f in found)


def test_mtu_mismatch():
    data, reports = case("healthy")
    data["nodes"]["vm0"]["mtu"], data["nodes"]["vm1"]["mtu"] = 1460, 1500
    found = verdict(data, reports)
    assert [f["id"] for f in found] == ["mtu-mismatch"]
    assert "vm0 ens4 MTU 1460, vm1 eth0 MTU 1500" in found[0]["cause"]


def test_low_disk_and_gpu_count():
    data, reports = case("healthy")
    free = data["reports"]["vm1"]["disk"]["free"]
    found = verdict(data, reports, min_free_gb=free / 1e9 + 1)
    assert {f["id"] for f in found} == {"disk-low"}
    assert "preflight_min_free_gb" in found[0]["cause"]
    reports["vm1"]["report"]["gpus"] = 4
    found = verdict(data, reports, gpus_per_node=8)
    assert [f["id"] for f in found] == ["gpu-count"]
    assert "vm1's container sees 4 GPUs, llamafactory_gpus_per_node is 8" in found[0]["cause"]


def test_a_disk_too_small_for_the_next_checkpoint_is_named():
    data, reports = case("healthy")
    disk = reports["vm1"]["report"]["disk"]
    disk.update(checkpoint=40, checkpoint_bytes=disk["free"] + 1)
    found = verdict(data, reports)
    assert [f["id"] for f in found] == ["disk-checkpoint"]
    assert "less than its newest checkpoint (checkpoint-40, " in found[0]["cause"]
    assert found[0]["cause"].startswith("vm1 has ")
    assert "save_total_limit" in found[0]["fix"]
    disk["checkpoint_bytes"] = disk["free"] - 1
    assert verdict(data, reports) == []


def test_a_different_node_answering_is_named():
    data, reports = case("healthy")
    result = reports["vm1"]["report"]["results"][0]
    result["answer"] = '{"node": "vm7"}'
    found = verdict(data, reports)
    assert [f["id"] for f in found] == ["wrong-peer"]


@pytest.mark.parametrize(
    ("result", "expected_id", "in_error"),
    [
        (
            {
                "failed": True,
                "msg": "Error response from daemon: could not select device driver "
                '"nvidia" with capabilities: [[gpu]]',
            },
            "gpu-runtime",
            "could not select device driver",
        ),
        (
            {
                "failed": True,
                "msg": "Cannot create container",
                "container": {"Output": 'exec: "python3": executable file not found in $PATH'},
            },
            "probe-failed",
            "Cannot create container",
        ),
        (
            {"changed": True, "container": {"Output": "Traceback (most recent call last):\nboom"}},
            "probe-failed",
            "Traceback",
        ),
        ({"skipped": True}, "probe-failed", "skipped"),
    ],
)
def test_a_probe_that_did_not_run(result, expected_id, in_error):
    data, _reports = case("healthy")
    reports = {
        "vm0": {"changed": True, "container": {"Output": json.dumps(data["reports"]["vm0"])}},
        "vm1": result,
    }
    found = verdict(data, reports)
    assert [f["id"] for f in found] == [expected_id]
    assert in_error in found[0]["cause"]


def test_parse_reads_the_last_json_line_of_the_container_output():
    data = case("healthy")[0]
    output = "some banner\n" + json.dumps(data["reports"]["vm1"]) + "\n"
    parsed = preflight.parse({"changed": True, "container": {"Output": output}})
    assert parsed == {"report": data["reports"]["vm1"], "error": ""}
    assert preflight.parse(parsed) is parsed


def test_targets_and_message():
    addresses = {"vm0": "10.0.0.2", "vm1": "10.0.0.3", "vm2": "10.0.0.4"}
    hosts = ["vm0", "vm1", "vm2"]
    assert preflight.targets("vm0", hosts, addresses, "vm0", "10.0.0.2", 29500, 49500) == [
        {"node": "vm1", "address": "10.0.0.3", "port": 49500},
        {"node": "vm2", "address": "10.0.0.4", "port": 49500},
    ]
    assert preflight.targets("vm2", hosts, addresses, "vm0", "10.0.0.2", 29500, 49500)[-1] == {
        "node": "vm0",
        "address": "10.0.0.2",
        "port": 29500,
    }
    data, reports = case("blocked-port")
    text = preflight.message("demo", verdict(data, copy.deepcopy(reports)))
    assert text.startswith("preflight of job demo found 1 problem(s) before any rank started:")
    assert "- peer-unreachable: " in text and "\n  Fix: " in text
    assert text.endswith("Nothing was launched (preflight_enabled=false skips these checks).")


def test_doctor_report_lines():
    data, reports = case("blocked-port")
    probe = verdict(data, reports)
    logs = [
        {
            "id": "gloo-bridge-address",
            "host": "vm1",
            "line": "Gloo connectFullMesh failed",
            "cause": "Gloo dials 172.17.0.2",
            "fix": "host networking",
        }
    ]
    report = preflight.doctor_report(
        probe, logs, smoke_failure=None, smoke=None, running=False, container="hand-rank"
    )
    assert report["problems"] == 2
    assert report["lines"][0] == "doctor: 2 problem(s) found"
    assert report["lines"][1].startswith("- peer-unreachable: vm0 (rank 0)")
    assert "- gloo-bridge-address (vm1, in the logs of hand-rank)" in report["lines"][2]
    quiet = preflight.doctor_report(
        [], [], smoke={"world_size": 2, "backend": "gloo", "busbw_GBps": 1.5}, container="c"
    )
    assert quiet["problems"] == 0
    assert "smoke test: all_reduce across 2 ranks (gloo), bus bandwidth 1.5 GB/s" in quiet["lines"]
    busy = preflight.doctor_report([], [], smoke_failure="rank 1 died", running=True, container="c")
    assert busy["problems"] == 1 and busy["lines"][1].startswith("probes and smoke test skipped")


@pytest.mark.parametrize(
    ("version", "variable"),
    [
        ("0.9.5", "NODE_RANK"),
        ("0.9.1", "NODE_RANK"),
        ("0.9.1.dev0", "NODE_RANK"),
        ("0.9.0", "RANK"),
        ("0.8.3.dev0", "RANK"),
        ("1.0.0", "NODE_RANK"),
    ],
)
def test_rank_variable(version, variable):
    assert preflight.rank_variable(version) == variable


def test_versions_and_an_image_without_llamafactory():
    data, reports = case("healthy")
    for entry in reports.values():
        entry["report"]["packages"] = {
            "llamafactory": "0.9.5",
            "torch": "2.13.0",
            "deepspeed": "0.19.8",
            "transformers": None,
        }
    assert verdict(data, reports) == []
    assert preflight.versions_line(reports) == (
        "LLaMA-Factory 0.9.5 (reads NODE_RANK), torch 2.13.0, deepspeed 0.19.8"
    )
    reports["vm1"]["report"]["packages"] = {"llamafactory": None, "torch": "2.4.0"}
    found = verdict(data, reports)
    assert [f["id"] for f in found] == ["image-without-llamafactory"]
    assert "sees torch 2.4.0" in found[0]["cause"]
    assert preflight.versions_line({}) is None


def test_a_shared_mount_missing_on_a_node():
    data, reports = case("healthy")
    reports["vm1"]["missing_mounts"] = ["/mnt/shared"]
    found = verdict(data, reports)
    assert [f["id"] for f in found] == ["shared-mount-missing"]
    assert "vm1 has no folder /mnt/shared (llamafactory_shared_mounts)" in found[0]["cause"]


def test_a_gpu_profiles_missing_plugin_devices_and_nic_problems_are_named():
    # A3 Mega nodes of the tcpxo profile: vm1's plugin folder and aperture devices are missing
    # (what the preflight's stat found), vm0's discovery saw 7 of 8 GPU NICs and a wrong MTU.
    data, reports = case("healthy")
    nodes = copy.deepcopy(data["nodes"])
    for node in nodes.values():
        node.update(profile="tcpxo", machine_type="a3-megagpu-8g")
    nodes["vm0"]["profile_problems"] = [
        {"id": "gpu-nic-count", "detail": "7 GPU NICs found (...), a3-megagpu-8g has 8"},
        {"id": "gpu-nic-mtu", "detail": "enp6s0 has MTU 1460, a3-megagpu-8g's GPU networks 8244"},
    ]
    reports["vm1"]["missing_network"] = [
        {"path": "/var/lib/tcpxo/lib64/nccl-env-profile.sh", "kind": "env_script"},
        {"path": "/dev/aperture_devices", "kind": "device"},
    ]
    found = preflight.findings(
        reports, nodes, nodes["vm0"]["address"], data["master_port"], data["probe_port"]
    )
    assert [f["id"] for f in found] == [
        "gpu-nic-count",
        "gpu-nic-mtu",
        "network-plugin-missing",
        "network-device-missing",
    ]
    assert found[0]["cause"].startswith("vm0 (tcpxo profile): 7 GPU NICs found")
    assert "every GPU NIC of its machine type" in found[0]["fix"]
    assert "vm1 has no /var/lib/tcpxo/lib64/nccl-env-profile.sh" in found[2]["cause"]
    assert "llamafactory_network_profile=socket" in found[2]["fix"]
    assert "aperture devices' udev rule" in found[3]["fix"]


def test_nodes_of_different_machine_types_and_a_fallback_to_sockets_are_named():
    data, reports = case("healthy")
    nodes = copy.deepcopy(data["nodes"])
    nodes["vm0"].update(machine_type="a3-megagpu-8g", profile="socket")
    nodes["vm0"]["profile_problems"] = [
        {"id": "gpu-nics-missing", "detail": "no GPU NIC found for the tcpxo profile"}
    ]
    nodes["vm1"].update(machine_type="a3-highgpu-8g", profile="socket")
    found = preflight.findings(
        reports, nodes, nodes["vm0"]["address"], data["master_port"], data["probe_port"]
    )
    assert [f["id"] for f in found] == ["gpu-nics-missing", "machine-types-differ"]
    assert "set llamafactory_network_profile=socket" in found[0]["fix"]
    assert "vm0 a3-megagpu-8g, vm1 a3-highgpu-8g" in found[1]["cause"]


# -- each node's GPU health (module gpu_health, roles/preflight/tasks/gpu_health.yml) -------

GPU_FIXTURES = FIXTURES.parent / "gpu_health"


def gpu_health(xml, kernel_log="", **options):
    """What the module gpu_health returns for a node whose nvidia-smi -q -x prints `xml` (a
    capture of tests/unit/fixtures/gpu_health) and whose kernel log is `kernel_log`."""
    smi = _gpu_health.parse_smi_xml((GPU_FIXTURES / xml).read_text())
    found = _gpu_health.check(smi, kernel_log, **options)
    return {
        "changed": False,
        "driver_version": smi["driver_version"],
        "cuda_version": smi["cuda_version"],
        "gpus": smi["gpus"],
        "findings": found,
        "errors": len([f for f in found if f["level"] == "error"]),
        "kernel_log": "unread" if kernel_log is None else "read",
        "dcgm": "absent",
    }


def test_a_nodes_gpu_health_errors_are_findings_its_warnings_and_notes_are_not():
    data, reports = case("healthy")
    xids = (GPU_FIXTURES / "kernel-xid.log").read_text().splitlines()
    # vm0: persistence off (a warning) and application Xids (notes): nothing stops the launch.
    reports["vm0"]["gpu_health"] = gpu_health("a10g-515.105.01.xml", "\n".join(xids[:5]))
    assert [f["level"] for f in reports["vm0"]["gpu_health"]["findings"]] == ["warning"] + [
        "note"
    ] * 4
    assert verdict(data, reports) == []
    # vm1: uncorrected ECC errors, a pending page retirement and the GPU fallen off the bus.
    reports["vm1"]["gpu_health"] = gpu_health(
        "v100-sxm3-32gb-410.104.xml", "\n".join(xids[:6]), expected_gpus=1
    )
    found = verdict(data, reports)
    assert [f["id"] for f in found] == ["ecc-uncorrected", "page-retirement-pending", "xid-79"]
    assert found[0]["cause"].startswith("vm1: GPU 0 (Tesla V100-SXM3-32GB")
    assert "1 uncorrected ECC error(s) since the driver loaded" in found[0]["cause"]
    assert "stop and start the VM" in found[0]["fix"]
    assert found[2]["cause"].startswith("vm1: Xid 79 on 0000:05:00")
    # An unread kernel log is a warning: reported on the node, not a finding.
    reports["vm1"]["gpu_health"] = gpu_health("a10g-515.105.01.xml", None)
    assert verdict(data, reports) == []


@pytest.mark.parametrize("result", [None, {"skipped": True, "changed": False}])
def test_a_node_without_a_gpu_health_check_has_no_finding(result):
    data, reports = case("healthy")
    reports["vm1"]["gpu_health"] = result
    assert verdict(data, reports) == []


def test_a_gpu_health_check_that_could_not_run_is_named():
    data, reports = case("healthy")
    reports["vm1"]["gpu_health"] = {"failed": True, "msg": "/usr/bin/python3: not found"}
    found = verdict(data, reports)
    assert [f["id"] for f in found] == ["gpu-health-failed"]
    assert "could not run on vm1: /usr/bin/python3: not found" in found[0]["cause"]
    assert "preflight_gpu_health=false" in found[0]["fix"]


def test_a_nodes_missing_driver_is_named_with_the_installer():
    data, reports = case("healthy")
    reports["vm0"]["gpu_health"] = {
        "changed": False,
        "gpus": [],
        "findings": [
            {
                "level": "error",
                "id": "nvidia-smi-missing",
                "gpu": None,
                "detail": "nvidia-smi is not installed: this node has no NVIDIA driver",
                "fix": "install the NVIDIA driver - cuda_installer.pyz install_driver",
            }
        ],
    }
    found = verdict(data, reports)
    assert [f["id"] for f in found] == ["nvidia-smi-missing"]
    assert found[0]["cause"] == "vm0: nvidia-smi is not installed: this node has no NVIDIA driver"


@pytest.mark.parametrize(
    ("torch", "cuda"),
    [
        ("2.6.0+cu124", "12.4"),
        ("2.1.0+cu118", "11.8"),
        ("2.9.0+cu130", "13.0"),
        ("2.6.0", None),
        ("2.6.0+cpu", None),
        (None, None),
    ],
)
def test_image_cuda_from_the_torch_version(torch, cuda):
    assert preflight.image_cuda(torch) == cuda


def test_the_driver_against_the_images_pytorch_cuda():
    data, reports = case("healthy")
    for host in ("vm0", "vm1"):
        reports[host]["report"]["packages"] = {"llamafactory": "0.9.5", "torch": "2.6.0+cu124"}
        reports[host]["gpu_health"] = gpu_health("a10g-515.105.01.xml")  # CUDA 11.7
    reports["vm0"]["gpu_health"]["cuda_version"] = "12.2"  # same major: a warning, not here
    found = verdict(data, reports)
    assert [f["id"] for f in found] == ["driver-older-than-image-cuda"]
    assert found[0]["cause"] == (
        "vm1: driver 515.105.01 supports CUDA up to 11.7, the image is built for CUDA 12.4 "
        "(torch 2.6.0+cu124)"
    )
    # Already judged by the module (told image_cuda): not twice.
    reports["vm1"]["gpu_health"] = gpu_health("a10g-515.105.01.xml", image_cuda="12.4")
    assert [f["id"] for f in verdict(data, reports)] == ["driver-older-than-image-cuda"]


# -- the smoke test's verdict (smoke_verdict) ------------------------------------------------

A3_MEGA = {
    "collective": "all_gather",
    "sizes": [2 << 30, 4 << 30, 8 << 30],
    "rule": "average",
    "threshold": 150,
    "source": "chs-nccl",
    "published": 188.5,
    "size": 8 << 30,
    "gpus": 8,
    "sweep_bytes": [2 << 30, 4 << 30, 8 << 30],
}


def smoke(busbw, collective="all_gather", size=8 << 30, backend="nccl"):
    """The smoke result, the same busbw at each size of the sweep up to `size`."""
    sweep = [s for s in A3_MEGA["sizes"] if s <= size] or [size]
    return {
        "sizes": [{"bytes": s, "busbw_GBps": busbw} for s in sweep],
        "world_size": 16,
        "backend": backend,
        "collective": collective,
        "bytes": size,
        "busbw_GBps": busbw,
        "algbw_GBps": round(busbw * 16 / 15, 3),
    }


# As NCCL logs them (the gIB line as Google's "Run NCCL on Compute Engine instances" shows it).
FASTRAK = ["a3mega-vm-0:606:642 [0] NCCL INFO Using network FasTrak"]
SOCKET = ["a3mega-vm-0:606:642 [0] NCCL INFO Using network Socket"]


def test_the_profiles_network_in_use_passes_with_its_fraction_of_the_pass_mark():
    verdict = preflight.smoke_verdict(smoke(150.0), FASTRAK, "FasTrak", A3_MEGA, 8)
    assert verdict["findings"] == [] and verdict["warnings"] == []
    assert "NCCL network FasTrak" in verdict["line"]
    assert (
        "average busbw over 2, 4, 8 GiB 150.0 GB/s, 100% of the pass mark 150 GB/s"
        in (verdict["line"])
    )
    assert "80% of the published 188.5 GB/s (peak, 8 GiB)" in verdict["line"]


def test_plain_sockets_under_a_plugin_profile_fail():
    verdict = preflight.smoke_verdict(smoke(3.1), SOCKET, "FasTrak", A3_MEGA, 8)
    assert [f["id"] for f in verdict["findings"]] == ["network-plugin-not-used"]
    assert verdict["findings"][0]["cause"].startswith("NCCL used Socket, not FasTrak")
    assert "role nccl_plugin" in verdict["findings"][0]["fix"]
    unseen = preflight.smoke_verdict(smoke(3.1), [], "gIB", None, 8)
    assert [f["id"] for f in unseen["findings"]] == ["nccl-network-unseen"]


def test_under_the_pass_mark_is_a_warning_and_other_shapes_get_no_fraction():
    low = preflight.smoke_verdict(smoke(60.0), FASTRAK, "FasTrak", A3_MEGA, 8)
    assert low["findings"] == []
    assert "under the pass mark 150 GB/s" in low["warnings"][0]
    other = preflight.smoke_verdict(smoke(60.0), FASTRAK, "FasTrak", A3_MEGA, 4)
    assert other["warnings"] == [] and "no fraction" in other["line"]
    cpu = preflight.smoke_verdict(smoke(1.2, "all_reduce", 64_000_000, "gloo"), [], "Socket")
    assert cpu == {
        "findings": [],
        "warnings": [],
        "line": "all_reduce of 64.0 MB across 16 ranks (gloo): bus bandwidth 1.2 GB/s "
        "(algorithm 1.28 GB/s)",
        "passed": True,
    }


def test_rxdm_not_running_on_a_tcpxo_node_is_named():
    data, reports = case("healthy")
    nodes = copy.deepcopy(data["nodes"])
    for node in nodes.values():
        node.update(profile="tcpxo", machine_type="a3-megagpu-8g")
    reports["vm0"]["rxdm"] = {"state": "running", "log_lines": []}
    reports["vm1"]["rxdm"] = {
        "state": "exited",
        "log_lines": ["E1203 no aperture devices in /dev/aperture_devices"],
    }
    found = preflight.findings(
        reports, nodes, nodes["vm0"]["address"], data["master_port"], data["probe_port"]
    )
    assert [f["id"] for f in found] == ["rxdm-not-running"]
    assert "vm1's receive-datapath-manager (TCPXO's RxDM) is exited" in found[0]["cause"]
    assert "no aperture devices" in found[0]["cause"]
    assert "role nccl_plugin" in found[0]["fix"]


POLICY = "https://www.googleapis.com/compute/v1/projects/p/regions/us-central1/resourcePolicies/"


@pytest.mark.parametrize(
    ("placements", "warned"),
    [
        ([[POLICY + "compact"], [POLICY + "compact"]], False),
        ([[POLICY + "compact"], []], True),  # vm1 in no policy
        ([[POLICY + "compact"], [POLICY + "other"]], True),
        ([None, None], False),  # a static inventory: not known
        ([[], []], True),
    ],
)
def test_gpu_nodes_outside_one_placement_policy_are_a_warning(placements, warned):
    nodes = {
        f"vm{i}": {"rank": i, "profile": "gib", "placement": placement}
        for i, placement in enumerate(placements)
    }
    found = preflight.warnings(nodes)
    assert bool(found) is warned
    if warned:
        assert "not all in one placement policy" in found[0]
    socket = {h: dict(n, profile="socket") for h, n in nodes.items()}
    assert preflight.warnings(socket) == []


def test_an_a4_node_with_llamafactorys_cuda_12_4_image_is_stopped_by_the_gpus_name():
    # No public B200 capture: the A100's, its product name changed to the B200's (one element)
    # and its driver's CUDA to 12.8, so that only the GPU's kind can stop it.
    data, reports = case("healthy")
    for host in ("vm0", "vm1"):
        reports[host]["report"]["packages"] = {"llamafactory": "0.9.5", "torch": "2.6.0+cu124"}
        reports[host]["gpu_health"] = gpu_health("a100-sxm4-80gb-535.54.03.xml")
        reports[host]["gpu_health"]["cuda_version"] = "12.8"
        reports[host]["gpu_health"]["gpus"][0]["name"] = "NVIDIA B200"
    found = verdict(data, reports)
    assert [f["id"] for f in found] == ["image-cuda-older-than-gpu"] * 2
    assert found[0]["cause"] == (
        "vm0: the GPUs are NVIDIA B200 (Blackwell), which CUDA 12.8 or later builds for; the "
        "image is built for CUDA 12.4 and cannot run on them (torch 2.6.0+cu124)"
    )
    assert "docs/gpu-families.md" in found[0]["fix"]
    for host in ("vm0", "vm1"):
        reports[host]["report"]["packages"]["torch"] = "2.8.0+cu128"
    assert verdict(data, reports) == []
