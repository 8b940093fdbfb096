"""primary_nic's logic over captured and constructed network layouts (tests/unit/fixtures/nic).

Each fixture holds a host's `ip -j` output and the cases to run against it; `source` says whether
it was captured on the local cluster or constructed in the same format.
"""

import http.server
import json
import re
import socket
import threading
import time
from pathlib import Path

import pytest
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _nic as nic
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _nic_host as nic_host

NIC_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nic"
FIXTURES = sorted(NIC_FIXTURES.glob("*.json"))


def layout_for(fixture: dict, case: dict) -> dict:
    peer = case["options"].get("peer")
    route = fixture["route_get"].get(peer) if peer else None
    return {
        "ip_addr": json.dumps(fixture["ip_addr"]),
        "route_default": json.dumps(fixture["route_default"]),
        "route_peer": json.dumps(route) if isinstance(route, list) else None,
        "route_peer_error": route.get("error") if isinstance(route, dict) else None,
        "sysfs": fixture["sysfs"],
        "infiniband": fixture["infiniband"],
        "gce": fixture["gce"],
        "metadata": case.get("metadata", fixture["metadata"]),
    }


CASES = [
    pytest.param(json.loads(path.read_text()), case, id=f"{path.stem}: {case['name']}")
    for path in FIXTURES
    for case in json.loads(path.read_text())["cases"]
]


@pytest.mark.parametrize(("fixture", "case"), CASES)
def test_layout(fixture, case):
    layout = layout_for(fixture, case)
    if "error" in case:
        with pytest.raises(nic.NicError) as error:
            nic.choose(layout, **case["options"])
        assert re.search(case["error"], str(error.value)), str(error.value)
        return
    result = nic.choose(layout, **case["options"])
    for key, value in case["expect"].items():
        assert result[key] == value, f"{key}: {result[key]!r} != {value!r}"
    if "warning" in case:
        assert any(case["warning"] in w for w in result["warnings"]), result["warnings"]
    reasons = {c["name"]: c["rejected"] for c in result["candidates"]}
    assert reasons[result["interface"]] is None
    assert len([r for r in reasons.values() if r is None]) == 1
    for name, expected in case.get("rejected", {}).items():
        if expected is None:
            assert reasons[name] is None
        else:
            assert expected in reasons[name], f"{name}: {reasons[name]}"
    assert result["nccl_env"]["NCCL_SOCKET_IFNAME"] == "=" + result["interface"]
    assert result["nccl_env"]["GLOO_SOCKET_IFNAME"] == result["interface"]
    assert ("NCCL_IB_DISABLE" in result["nccl_env"]) is (not fixture["infiniband"])


@pytest.mark.parametrize(
    ("address", "private"),
    [
        ("10.128.0.5", True),
        ("172.31.255.1", True),
        ("172.32.0.1", False),
        ("192.168.1.1", True),
        ("100.64.0.1", True),
        ("100.128.0.1", False),
        ("198.18.0.10", True),
        ("198.19.255.1", True),
        ("198.20.0.1", False),
        ("34.122.0.5", False),
        ("8.8.8.8", False),
    ],
)
def test_private_ranges(address, private):
    assert nic.is_private(address) is private


# ---------------------------------------------------------------- gathering


class FakeModule:
    """AnsibleModule's run_command/get_bin_path over one fixture's captured output."""

    def __init__(self, fixture):
        self.fixture = fixture
        self.commands = []

    def get_bin_path(self, name, required=False):
        return "/usr/sbin/" + name

    def run_command(self, args):
        self.commands.append(args[1:])
        if args[1:] == ["-j", "-d", "addr", "show"]:
            return 0, json.dumps(self.fixture["ip_addr"]), ""
        if args[1:] == ["-j", "-4", "route", "show", "default"]:
            return 0, json.dumps(self.fixture["route_default"]), ""
        if args[1:4] == ["-j", "route", "get"]:
            route = self.fixture["route_get"][args[4]]
            if isinstance(route, dict):
                return route["rc"], "", route["error"] + "\n"
            return 0, json.dumps(route), ""
        raise AssertionError(f"unexpected command {args}")


class FakeResponse:
    def __init__(self, body, flavor="Google"):
        self.body = body
        self.headers = {"Metadata-Flavor": flavor} if flavor else {}

    def read(self):
        return self.body.encode()


class FakeMetadata:
    """Records requests; answers like GCE's metadata server (or not at all)."""

    def __init__(self, answers=None, flavor="Google", fail=None):
        self.answers = answers or {"ip": "10.128.0.5", "mac": "42:01:0a:80:00:05"}
        self.flavor, self.fail, self.requests = flavor, fail, []

    def __call__(self, url, headers, timeout, follow_redirects, use_proxy):
        self.requests.append((url, headers, timeout))
        if self.fail:
            raise self.fail
        return FakeResponse(self.answers[url.rsplit("/", 1)[1]], self.flavor)


def load(name):
    return json.loads((NIC_FIXTURES / f"{name}.json").read_text())


def params(**changes):
    base = {
        "peer": None,
        "interface": None,
        "gcp_metadata": "auto",
        "metadata_url": "http://metadata.google.internal/computeMetadata/v1",
        "metadata_timeout": 2.0,
        "network_profile": "socket",  # the machine type is not asked for socket (tested below)
    }
    return {**base, **changes}


@pytest.fixture
def dmi(tmp_path):
    def write(product):
        path = tmp_path / "product_name"
        path.write_text(product + "\n")
        return str(path)

    return write


def test_off_gce_auto_sends_nothing(dmi):
    metadata = FakeMetadata()
    layout, peer = nic_host.gather(
        FakeModule(load("localcluster-vm0-ens4-decoy")),
        params(),
        opener=metadata,
        dmi_path=dmi("Standard PC (Q35 + ICH9, 2009)"),
    )
    assert metadata.requests == []
    assert layout["gce"] is False and layout["metadata"] is None and peer is None


def test_on_gce_rank0_asks_the_metadata_server(dmi):
    metadata = FakeMetadata()
    layout, _peer = nic_host.gather(
        FakeModule(load("gcp-debian12-ens4")),
        params(),
        opener=metadata,
        dmi_path=dmi("Google Compute Engine"),
    )
    urls = [url for url, _h, _t in metadata.requests]
    assert urls == [
        f"http://metadata.google.internal/computeMetadata/v1/instance/network-interfaces/0/{key}"
        for key in ("ip", "mac")
    ]
    assert all(h == {"Metadata-Flavor": "Google"} and t == 2.0 for _u, h, t in metadata.requests)
    assert layout["metadata"] == {"ip": "10.128.0.5", "mac": "42:01:0a:80:00:05"}
    assert nic.choose(layout)["method"] == "metadata"


def test_on_gce_with_a_peer_the_route_decides_and_nothing_is_asked(dmi):
    metadata = FakeMetadata()
    module = FakeModule(load("gcp-debian12-ens4"))
    layout, peer = nic_host.gather(
        module, params(peer="10.128.0.6"), opener=metadata, dmi_path=dmi("Google Compute Engine")
    )
    assert metadata.requests == [] and peer == "10.128.0.6"
    assert ["-j", "route", "get", "10.128.0.6"] in module.commands
    assert nic.choose(layout, peer=peer)["method"] == "peer route"


def test_always_asks_even_off_gce(dmi):
    metadata = FakeMetadata()
    layout, _peer = nic_host.gather(
        FakeModule(load("gcp-debian12-ens4")),
        params(gcp_metadata="always"),
        opener=metadata,
        dmi_path=dmi("Standard PC"),
    )
    assert len(metadata.requests) == 2 and layout["metadata"]["mac"] == "42:01:0a:80:00:05"


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        (FakeMetadata(flavor=None), "without the header Metadata-Flavor: Google"),
        (FakeMetadata(fail=TimeoutError("timed out")), "timed out"),
    ],
)
def test_metadata_failures_become_errors(dmi, metadata, message):
    layout, _peer = nic_host.gather(
        FakeModule(load("gcp-debian12-ens4")),
        params(),
        opener=metadata,
        dmi_path=dmi("Google Compute Engine"),
    )
    assert message in layout["metadata"]["error"]
    result = nic.choose(layout)
    assert result["method"] == "default route"
    assert any("did not answer" in w for w in result["warnings"])


def test_unreachable_peer_keeps_the_error_text(dmi):
    layout, peer = nic_host.gather(
        FakeModule(load("localcluster-vm2-enp0s12-no-default")),
        params(peer="203.0.113.5"),
        opener=FakeMetadata(),
        dmi_path=dmi("Standard PC"),
    )
    assert layout["route_peer"] is None
    assert "Network is unreachable" in layout["route_peer_error"]
    with pytest.raises(nic.NicError, match="unreachable"):
        nic.choose(layout, peer=peer)


def test_peer_names_are_resolved():
    assert nic_host.resolve("127.0.0.1") == "127.0.0.1"
    with pytest.raises(nic.NicError, match="does not resolve"):
        nic_host.resolve("no-such-host.invalid")


MACHINE_TYPE_URL = "http://metadata.google.internal/computeMetadata/v1/instance/machine-type"


def test_auto_profile_asks_every_gce_node_for_its_machine_type(dmi):
    metadata = FakeMetadata({"machine-type": "projects/12345/machineTypes/n2-standard-4"})
    module = FakeModule(load("gcp-debian12-ens4"))
    layout, peer = nic_host.gather(
        module,
        params(peer="10.128.0.6", network_profile="auto"),
        opener=metadata,
        dmi_path=dmi("Google Compute Engine"),
    )
    assert [url for url, _h, _t in metadata.requests] == [MACHINE_TYPE_URL]
    assert layout["machine_type"] == "n2-standard-4"
    result = nic.choose(layout, peer=peer)
    found = nic_host.profile_of(layout, result["interface"], "auto")
    assert (found["profile"], found["why"]) == (
        "socket",
        "machine type n2-standard-4 has no GPU NICs",
    )
    assert found["setup"]["env"]["NCCL_SOCKET_IFNAME"] == "=" + result["interface"]


@pytest.mark.parametrize(
    ("product", "mode", "asked"),
    [
        ("Standard PC", "auto", False),
        ("Google Compute Engine", "never", False),
        ("Standard PC", "always", True),
    ],
)
def test_machine_type_follows_gcp_metadata(dmi, product, mode, asked):
    metadata = FakeMetadata(
        {
            "ip": "10.128.0.5",
            "mac": "42:01:0a:80:00:05",
            "machine-type": "projects/1/machineTypes/a3-megagpu-8g",
        }
    )
    layout, _peer = nic_host.gather(
        FakeModule(load("gcp-debian12-ens4")),
        params(peer="10.128.0.6", gcp_metadata=mode, network_profile="auto"),
        opener=metadata,
        dmi_path=dmi(product),
    )
    assert (MACHINE_TYPE_URL in [u for u, _h, _t in metadata.requests]) is asked
    assert layout["machine_type"] == ("a3-megagpu-8g" if asked else None)


def test_a_set_profile_is_checked_against_the_machine_type(dmi):
    metadata = FakeMetadata({"machine-type": "projects/1/machineTypes/a3-ultragpu-8g"})
    layout, _peer = nic_host.gather(
        FakeModule(load("gcp-debian12-ens4")),
        params(peer="10.128.0.6", network_profile="tcpxo"),
        opener=metadata,
        dmi_path=dmi("Google Compute Engine"),
    )
    assert layout["machine_type"] == "a3-ultragpu-8g"
    with pytest.raises(nic_host.network_profile.ProfileError, match="a3-ultragpu-8g uses gib"):
        nic_host.profile_of(layout, "ens4", "tcpxo")
    # Unanswered, a set profile goes on without the machine type.
    layout, _peer = nic_host.gather(
        FakeModule(load("gcp-debian12-ens4")),
        params(peer="10.128.0.6", gcp_metadata="always", network_profile="gib"),
        opener=FakeMetadata({"ip": "10.128.0.5", "mac": "42:01:0a:80:00:05"}),
        dmi_path=dmi("Google Compute Engine"),
    )
    assert layout["machine_type"] is None


def test_always_without_a_machine_type_answer_is_an_error(dmi):
    with pytest.raises(
        nic.NicError,
        match=r"did not answer the machine type .*give network_profile \(socket, tcpxo or gib\)",
    ):
        nic_host.gather(
            FakeModule(load("gcp-debian12-ens4")),
            params(peer="10.128.0.6", gcp_metadata="always", network_profile="auto"),
            # A server that answers nic0's questions, not the machine type.
            opener=FakeMetadata({"ip": "10.128.0.5", "mac": "42:01:0a:80:00:05"}),
            dmi_path=dmi("Google Compute Engine"),
        )


@pytest.fixture
def metadata_server():
    """A metadata server on loopback (the real one is GCE's): 200 with Metadata-Flavor for
    instance/ keys, 301 for a directory without its slash, 404 otherwise."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            answers = {
                "/v1/instance/network-interfaces/0/ip": "10.128.0.5",
                "/v1/instance/network-interfaces/0/mac": "42:01:0a:80:00:05",
                "/v1/instance/machine-type": "projects/1/machineTypes/a3-megagpu-8g",
            }
            self.server.requests.append((self.path, self.headers.get("Metadata-Flavor")))
            if self.path == "/v1/instance":
                self.send_response(301)
                self.send_header("Location", "/v1/instance/")
                self.end_headers()
                return
            body = answers.get(self.path)
            self.send_response(200 if body else 404)
            self.send_header("Metadata-Flavor", "Google")
            self.end_headers()
            self.wfile.write((body or "not found").encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_the_metadata_server_is_asked_over_plain_http(metadata_server):
    url = f"http://127.0.0.1:{metadata_server.server_port}/v1"
    answer = nic_host.ask_metadata(url, 2.0, keys=("ip", "mac", "machine-type"))
    assert answer == {
        "ip": "10.128.0.5",
        "mac": "42:01:0a:80:00:05",
        "machine-type": "projects/1/machineTypes/a3-megagpu-8g",
    }
    assert {flavor for _path, flavor in metadata_server.requests} == {"Google"}
    # A status other than 200 is the answer's error; a redirect is not followed.
    missing = nic_host.ask_metadata(url + "/nothing", 2.0)
    assert "HTTP Error 404" in missing["error"]
    with pytest.raises(IOError, match="HTTP Error 301"):
        nic_host._open_url(url + "/instance", {"Metadata-Flavor": "Google"}, 2.0)


def test_an_unanswering_metadata_server_is_an_error_within_its_timeout():
    # A listener that accepts and never answers: the timeout ends the question.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
        started = time.monotonic()
        answer = nic_host.ask_metadata(url, 0.3)
    assert "timed out" in answer["error"]
    assert time.monotonic() - started < 5


def test_sysfs_facts_read_pci_addresses_and_rdma_devices(tmp_path):
    # /sys/class/net as the kernel lays it out: device links into the PCI tree, an infiniband
    # folder under an RDMA NIC's device, no device link for a virtual NIC.
    pci = tmp_path / "devices" / "pci0000:00"
    for slot, rdma in (("0000:00:0c.0", False), ("0000:91:00.0", True)):
        (pci / slot / "net").mkdir(parents=True)
        if rdma:
            (pci / slot / "infiniband" / "mlx5_0").mkdir(parents=True)
    net = tmp_path / "class" / "net"
    for name, slot in (
        ("enp0s12", "0000:00:0c.0"),
        ("gpu0rdma0", "0000:91:00.0"),
        ("docker0", None),
    ):
        (net / name).mkdir(parents=True)
        if slot:
            (net / name / "device").symlink_to(pci / slot)
    facts = nic_host.sysfs_facts(["enp0s12", "gpu0rdma0", "docker0"], root=str(net))
    assert facts["enp0s12"]["pci_slot"] == "0000:00:0c.0" and not facts["enp0s12"]["rdma"]
    assert facts["gpu0rdma0"] == {
        "driver": None,
        "speed": None,
        "pci_slot": "0000:91:00.0",
        "rdma": True,
    }
    assert facts["docker0"]["pci_slot"] is None


@pytest.mark.parametrize(
    ("name", "slot"),
    [
        ("enp6s0", "0000:06:00.0"),
        ("enp0s12", "0000:00:0c.0"),
        ("enp192s20", "0000:c0:14.0"),
        ("enp134s0", "0000:86:00.0"),
        ("enp6s0f0", "0000:06:00.0"),
        ("enp6s0f1", "0000:06:00.1"),
        ("enp255s31f7", "0000:ff:1f.7"),
        ("gpu0rdma0", None),
        ("eth0", None),
        ("ens4", None),
        ("enp6s0np0", None),
        ("enp256s0", None),  # no bus 256
        ("enp6s32", None),  # no slot 32
        ("enp6s0f8", None),  # no function 8
        ("", None),
    ],
)
def test_a_predictable_name_encodes_its_pci_address(name, slot):
    assert nic_host.pci_slot_of_name(name) == slot


def test_pci_slots_from_names_fill_only_nics_without_a_pci_device():
    # The local cluster's setting: veth NICs take the addresses their names encode, as GCP's
    # NICs of those names have; a real device's own address is never replaced.
    def sysfs():
        return {
            "enp0s12": {"pci_slot": "0000:00:99.0", "rdma": False},
            "enp6s0": {"pci_slot": None, "rdma": False},
            "gpu0rdma0": {"pci_slot": None, "rdma": True},
            "eth0": {"pci_slot": None, "rdma": False},
        }

    facts = nic_host.with_pci_slots_from_names(sysfs(), True)
    assert facts["enp0s12"] == {"pci_slot": "0000:00:99.0", "rdma": False}
    assert facts["enp6s0"] == {
        "pci_slot": "0000:06:00.0",
        "rdma": False,
        "pci_slot_from_name": True,
    }
    assert facts["gpu0rdma0"] == {"pci_slot": None, "rdma": True}
    assert facts["eth0"] == {"pci_slot": None, "rdma": False}
    assert nic_host.with_pci_slots_from_names(sysfs(), False) == sysfs()


def test_the_option_defaults_off():
    assert nic_host.OPTIONS["pci_slots_from_names"] == {"type": "bool", "default": False}
    assert "pci_slots" not in nic_host.OPTIONS


@pytest.mark.parametrize("from_names", [False, True])
def test_gather_takes_pci_addresses_from_names_only_when_asked(monkeypatch, dmi, from_names):
    # The A3 High fixture's NICs as veth pairs (no PCI device): with the option its GPU NICs are
    # found as on GCP (by the PCI addresses their names encode); without it, none is.
    monkeypatch.setattr(
        nic_host, "sysfs_facts", lambda names: {n: {"pci_slot": None, "rdma": False} for n in names}
    )
    layout, _peer = nic_host.gather(
        FakeModule(load("gcp-a3-high-multinic")),
        params(gcp_metadata="never", network_profile="tcpxo", pci_slots_from_names=from_names),
        dmi_path=dmi("Standard PC"),
    )
    slots = {name: facts["pci_slot"] for name, facts in layout["sysfs"].items()}
    if not from_names:
        assert set(slots.values()) == {None}
        return
    assert slots == {
        "lo": None,
        "enp0s12": "0000:00:0c.0",
        "enp6s0": "0000:06:00.0",
        "enp12s0": "0000:0c:00.0",
        "enp134s0": "0000:86:00.0",
        "enp140s0": "0000:8c:00.0",
        "docker0": None,
    }
    layout["machine_type"] = "a3-highgpu-8g"
    found = nic_host.profile_of(layout, "enp0s12", "tcpxo")
    assert found["gpu"] == ["enp6s0", "enp12s0", "enp134s0", "enp140s0"]
    assert found["problems"] == []


def test_a3_high_layout_gets_the_tcpxo_profile():
    # The A3 High fixture's NICs on the PCI addresses their names encode (enp12s0: bus 0x0c).
    fixture = load("gcp-a3-high-multinic")
    layout = layout_for(fixture, {"options": {}})
    names = [link["name"] for link in nic.parse_links(layout["ip_addr"])]
    slots = {"enp0s12": "0000:00:0c.0"}
    for name in names:
        if name.startswith("enp") and name != "enp0s12":
            slots[name] = f"0000:{int(name[3:].split('s')[0]):02x}:00.0"
    layout["sysfs"] = {n: {"pci_slot": slots.get(n), "rdma": False} for n in names}
    layout["machine_type"] = "a3-highgpu-8g"
    found = nic_host.profile_of(layout, "enp0s12", "auto")
    assert found["profile"] == "tcpxo" and found["control"] == ["enp0s12"]
    assert found["gpu"] == ["enp6s0", "enp12s0", "enp134s0", "enp140s0"]
    assert found["problems"] == []
    assert found["setup"]["env"]["NCCL_FASTRAK_IFNAME"] == ",".join(found["gpu"])


def test_a_gpu_machine_type_without_its_gpu_nics_trains_over_sockets_on_auto():
    # An A3 Mega VM created with its primary NIC only: auto falls back to sockets and says why;
    # asking for tcpxo is an error naming the fix.
    layout = layout_for(load("gcp-debian12-ens4"), {"options": {}})
    layout["sysfs"] = {}
    layout["machine_type"] = "a3-megagpu-8g"
    found = nic_host.profile_of(layout, "ens4", "auto")
    assert found["profile"] == "socket"
    assert found["why"].startswith("machine type a3-megagpu-8g calls for tcpxo, but no GPU NIC")
    assert [p["id"] for p in found["problems"]] == ["gpu-nics-missing"]
    assert found["setup"]["env"]["NCCL_SOCKET_IFNAME"] == "=ens4"
    with pytest.raises(nic_host.network_profile.ProfileError, match="create the VM with its GPU"):
        nic_host.profile_of(layout, "ens4", "tcpxo")


def test_a_metadata_server_that_failed_nic0_is_not_asked_the_machine_type(dmi):
    metadata = FakeMetadata(fail=TimeoutError("timed out"))
    layout, _peer = nic_host.gather(
        FakeModule(load("gcp-debian12-ens4")),
        params(gcp_metadata="always", network_profile="auto"),
        opener=metadata,
        dmi_path=dmi("Google Compute Engine"),
    )
    assert len(metadata.requests) == 1 and layout["machine_type"] is None
    with pytest.raises(nic.NicError, match=r"metadata server did not answer .*gcp_metadata"):
        nic.choose(layout, use_metadata="always")
