"""The local cluster's GCE metadata server, in-process on a loopback port: the real server's
contract (headers, 403/404/405, listings, recursive JSON, alt, ETags, wait_for_change)."""

import hashlib
import http.client
import json
import os
import threading
import time

import pytest
from localcluster import cluster, gce_metadata, spec

V1 = "/computeMetadata/v1/"
GOOGLE = {"Metadata-Flavor": "Google"}


def document(**instance_changes) -> dict:
    doc = gce_metadata.vm_document(
        project="hostnet-box",
        zone="us-central1-a",
        name="vm0",
        instance_id=gce_metadata.numeric_id("demo/vm0", digits=19),
        machine_type="n2-standard-4",
        ip="198.18.0.10",
        mac="02:42:c6:12:00:0a",
        prefix=24,
        gateway="198.18.0.1",
        mtu=1460,
        external_ip="198.19.0.10",
        tags=["llamafactory", "ssh"],
        attributes={"startup-script": "echo hi", "enable-oslogin": "FALSE"},
    )
    doc["instance"].update(instance_changes)
    return doc


def write(path, doc) -> None:
    """As publish() does inside the VM: a new file renamed over the old one."""
    path.with_suffix(".new").write_text(json.dumps(doc))
    os.replace(path.with_suffix(".new"), path)


@pytest.fixture
def server(tmp_path):
    path = tmp_path / "instance.json"
    write(path, document())
    log = tmp_path / "requests.log"
    running = gce_metadata.serve(str(path), "127.0.0.1", 0, request_log=str(log))
    yield running, path, log
    running.shutdown()


def get(server, path, headers=None, method="GET", timeout=10):
    headers = GOOGLE if headers is None else headers
    running = server[0]
    connection = http.client.HTTPConnection("127.0.0.1", running.server_port, timeout=timeout)
    connection.request(method, path, headers=headers)
    response = connection.getresponse()
    body = response.read().decode()
    connection.close()
    return response, body


def test_a_key_answers_text_with_the_flavor_header_and_an_etag(server):
    response, body = get(server, V1 + "instance/network-interfaces/0/ip")
    assert (response.status, body) == (200, "198.18.0.10")
    assert response.getheader("Metadata-Flavor") == "Google"
    assert response.getheader("Content-Type") == "application/text"
    assert response.getheader("Server") == "Metadata Server for VM"
    assert response.getheader("ETag") == gce_metadata.etag_of(b"198.18.0.10")
    assert get(server, V1 + "instance/network-interfaces/0/mac")[1] == "02:42:c6:12:00:0a"
    assert get(server, V1 + "instance/network-interfaces/0/subnetmask")[1] == "255.255.255.0"
    assert get(server, V1 + "instance/network-interfaces/0/mtu")[1] == "1460"


def test_the_predefined_keys(server):
    values = {
        "instance/name": "vm0",
        "instance/hostname": "vm0.us-central1-a.c.hostnet-box.internal",
        "instance/preempted": "FALSE",
        "instance/maintenance-event": "NONE",
        "instance/tags": '["llamafactory", "ssh"]',
        "instance/attributes/startup-script": "echo hi",
        "instance/network-interfaces/0/access-configs/0/external-ip": "198.19.0.10",
        "instance/network-interfaces/0/access-configs/0/type": "ONE_TO_ONE_NAT",
        "project/project-id": "hostnet-box",
        "instance/service-accounts/default/scopes": (
            "https://www.googleapis.com/auth/cloud-platform\n"
        ),
    }
    for key, value in values.items():
        assert get(server, V1 + key)[1] == value, key
    number = get(server, V1 + "project/numeric-project-id")[1]
    assert len(number) == 12 and number.isdigit()
    assert get(server, V1 + "instance/zone")[1] == f"projects/{number}/zones/us-central1-a"
    assert get(server, V1 + "instance/machine-type")[1] == (
        f"projects/{number}/machineTypes/n2-standard-4"
    )
    assert get(server, V1 + "instance/network-interfaces/0/network")[1] == (
        f"projects/{number}/networks/default"
    )
    instance_id = get(server, V1 + "instance/id")[1]
    assert len(instance_id) == 19 and instance_id.isdigit()
    email = get(server, V1 + "instance/service-accounts/default/email")[1]
    assert email == f"{number}-compute@developer.gserviceaccount.com"


def test_refusals(server):
    for headers, reason in (
        ({}, "Missing Metadata-Flavor:Google header"),
        ({"Metadata-Flavor": "google"}, "Missing Metadata-Flavor:Google header"),
        ({**GOOGLE, "X-Forwarded-For": "10.0.0.1"}, "X-Forwarded-For"),
    ):
        response, body = get(server, V1 + "instance/name", headers=headers)
        assert response.status == 403 and reason in body
        assert response.getheader("Metadata-Flavor") == "Google"
    for path in ("instance/nope", "instance/name/", "instance/tags/0", "elsewhere", "/x"):
        response, _body = get(server, path if path.startswith("/") else V1 + path)
        assert response.status == 404, path
        assert response.getheader("Metadata-Flavor") == "Google"
    response, _body = get(server, V1 + "instance/name", method="POST")
    assert response.status == 405
    response, _body = get(server, V1 + "instance/name?alt=xml")
    assert response.status == 400


def test_directories_list_their_keys_and_redirect_without_the_slash(server):
    assert get(server, V1)[1] == "instance/\nproject/\n"
    listed = get(server, V1 + "instance/")[1].splitlines()
    for key in ("attributes/", "hostname", "id", "machine-type", "maintenance-event", "name"):
        assert key in listed
    for key in ("network-interfaces/", "preempted", "service-accounts/", "tags", "zone"):
        assert key in listed
    assert get(server, V1 + "instance/network-interfaces/")[1] == "0/\n"
    assert get(server, V1 + "instance/network-interfaces/0/")[1].splitlines() == [
        "access-configs/",
        "gateway",
        "ip",
        "mac",
        "mtu",
        "network",
        "subnetmask",
    ]
    # Custom metadata and service accounts keep their names as given.
    assert get(server, V1 + "instance/attributes/")[1] == "startup-script\nenable-oslogin\n"
    accounts = get(server, V1 + "instance/service-accounts/")[1].splitlines()
    assert accounts[0] == "default/" and accounts[1].endswith(
        "-compute@developer.gserviceaccount.com/"
    )
    assert get(server, V1 + "instance/service-accounts/default/")[1].splitlines() == [
        "aliases",
        "email",
        "scopes",
        "token",
    ]
    response, body = get(server, V1 + "instance/network-interfaces?recursive=true")
    assert response.status == 301 and body == ""
    assert response.getheader("Location") == V1 + "instance/network-interfaces/?recursive=true"


def test_recursive_json_has_camel_case_keys(server):
    response, body = get(server, V1 + "instance/?recursive=true")
    assert response.getheader("Content-Type") == "application/json"
    instance = json.loads(body)
    nic0 = instance["networkInterfaces"][0]
    assert (nic0["ip"], nic0["mac"]) == ("198.18.0.10", "02:42:c6:12:00:0a")
    assert nic0["accessConfigs"] == [{"externalIp": "198.19.0.10", "type": "ONE_TO_ONE_NAT"}]
    assert isinstance(instance["id"], int)
    assert instance["machineType"].endswith("/machineTypes/n2-standard-4")
    assert instance["maintenanceEvent"] == "NONE"
    assert instance["attributes"]["startup-script"] == "echo hi"
    project = json.loads(get(server, V1 + "project/?recursive=true")[1])
    assert project["projectId"] == "hostnet-box"
    flat = get(server, V1 + "instance/network-interfaces/?recursive=true&alt=text")[1]
    assert "0/access-configs/0/external-ip 198.19.0.10\n" in flat
    assert "0/ip 198.18.0.10\n" in flat


def test_alt_picks_the_format(server):
    assert get(server, V1 + "instance/name?alt=json")[1] == '"vm0"'
    assert get(server, V1 + "instance/id?alt=json")[1].isdigit()
    assert json.loads(get(server, V1 + "instance/tags?alt=json")[1]) == ["llamafactory", "ssh"]
    assert json.loads(get(server, V1 + "instance/network-interfaces/0/?alt=json")[1])[0] == (
        "access-configs/"
    )


def test_the_token_endpoint(server):
    response, body = get(server, V1 + "instance/service-accounts/default/token")
    token = json.loads(body)
    assert response.getheader("Content-Type") == "application/json"
    assert set(token) == {"access_token", "expires_in", "token_type"}
    assert token["token_type"] == "Bearer"  # noqa: S105 (a token type, not a secret)
    assert 0 < token["expires_in"] <= 3600
    assert get(server, V1 + "instance/service-accounts/nobody/token")[0].status == 404


def test_a_rewritten_document_is_served(server):
    _running, path, _log = server
    write(path, document(maintenanceEvent="MIGRATE_ON_HOST_MAINTENANCE"))
    deadline = time.monotonic() + 3
    while get(server, V1 + "instance/maintenance-event")[1] == "NONE":
        assert time.monotonic() < deadline, "the rewritten document was not re-read"
        time.sleep(0.05)
    # A broken file is not served: the last good document stays.
    path.write_text("{not json")
    time.sleep(4 * gce_metadata.POLL_S)
    assert get(server, V1 + "instance/maintenance-event")[1] == "MIGRATE_ON_HOST_MAINTENANCE"


@pytest.mark.parametrize("key", ["preempted", "maintenance-event"])
def test_wait_for_change_wakes_when_the_file_changes(server, key):
    _running, path, _log = server
    first, _body = get(server, V1 + f"instance/{key}")
    etag = first.getheader("ETag")
    changed = {"preempted": "TRUE", "maintenance-event": "TERMINATE_ON_HOST_MAINTENANCE"}[key]
    camel = {"preempted": "preempted", "maintenance-event": "maintenanceEvent"}[key]
    timer = threading.Timer(0.5, write, args=(path, document(**{camel: changed})))
    started = time.monotonic()
    timer.start()
    try:
        response, body = get(
            server, V1 + f"instance/{key}?wait_for_change=true&last_etag={etag}&timeout_sec=30"
        )
    finally:
        timer.cancel()
    elapsed = time.monotonic() - started
    assert (response.status, body) == (200, changed)
    assert 0.5 <= elapsed < 2.5, elapsed
    assert response.getheader("ETag") != etag


def test_wait_for_change_answers_at_once_on_another_etag_and_at_the_timeout(server):
    started = time.monotonic()
    response, body = get(server, V1 + "instance/preempted?wait_for_change=true&last_etag=stale")
    assert (response.status, body) == (200, "FALSE")
    assert time.monotonic() - started < 1
    started = time.monotonic()
    response, body = get(server, V1 + "instance/preempted?wait_for_change=true&timeout_sec=1")
    assert (response.status, body) == (200, "FALSE")
    assert 1 <= time.monotonic() - started < 2
    response, _body = get(server, V1 + "instance/preempted?wait_for_change=true&timeout_sec=x")
    assert response.status == 400


def test_requests_are_logged_when_asked(server):
    get(server, V1 + "instance/name")
    get(server, V1 + "instance/id", headers={})
    assert server[2].read_text().splitlines() == [
        "GET /computeMetadata/v1/instance/name Google",
        "GET /computeMetadata/v1/instance/id None",
    ]


def test_no_document_answers_503(tmp_path):
    running = gce_metadata.serve(str(tmp_path / "missing.json"), "127.0.0.1", 0)
    try:
        response, _body = get((running,), V1 + "instance/name")
        assert response.status == 503
    finally:
        running.shutdown()


def test_kebab_and_numeric_ids():
    assert gce_metadata.kebab("numericProjectId") == "numeric-project-id"
    assert gce_metadata.kebab("externalIp") == "external-ip"
    assert gce_metadata.numeric_id("a", 12) == gce_metadata.numeric_id("a", 12)
    assert gce_metadata.numeric_id("a", 12) != gce_metadata.numeric_id("b", 12)


def test_the_document_the_cluster_publishes_for_a_vm(tmp_path):
    definition = spec.load(name="md", shift=7, zone="europe-west4-b", zones=["europe-west4-b"])
    vm1 = definition.vms[1]
    doc = cluster.metadata_document(definition, vm1, "02:42:c6:12:e0:0b")
    path = tmp_path / "instance.json"
    write(path, doc)
    running = gce_metadata.serve(str(path), "127.0.0.1", 0)
    try:
        served = json.loads(get((running,), V1 + "?recursive=true")[1])
    finally:
        running.shutdown()
    instance = served["instance"]
    assert (instance["name"], instance["hostname"]) == (
        "vm1",
        "vm1.europe-west4-b.c.hostnet-box.internal",
    )
    assert instance["zone"].endswith("/zones/europe-west4-b")
    assert instance["machineType"].endswith("/machineTypes/n2-standard-4")
    nic0 = instance["networkInterfaces"][0]
    assert (nic0["ip"], nic0["mac"], nic0["mtu"]) == ("198.18.224.11", "02:42:c6:12:e0:0b", 1460)
    assert (nic0["gateway"], nic0["subnetmask"]) == ("198.18.224.1", "255.255.255.0")
    assert nic0["accessConfigs"][0]["externalIp"] == "198.19.224.11"
    assert served["project"]["projectId"] == "hostnet-box"
    # Ids differ between VMs and between clusters, as GCE's do.
    other = cluster.metadata_document(spec.load(name="demo"), vm1, "x")["instance"]["id"]
    assert (
        len(
            {
                instance["id"],
                other,
                cluster.metadata_document(definition, definition.vms[0], "x")["instance"]["id"],
            }
        )
        == 3
    )


def test_a_plain_vms_document_is_unchanged_byte_for_byte():
    """What publish() writes for a VM without GPU NICs, as before GPU layouts existed (the
    sha256 of the document of test_the_document's arguments, taken from the earlier code)."""
    doc = gce_metadata.vm_document(
        project="hostnet-box",
        zone="us-central1-a",
        name="vm0",
        instance_id=gce_metadata.numeric_id("demo/vm0", digits=19),
        machine_type="n2-standard-4",
        ip="198.18.0.10",
        mac="02:42:c6:12:00:0a",
        prefix=24,
        gateway="198.18.0.1",
        mtu=1460,
        external_ip="198.19.0.10",
        tags=["llamafactory", "ssh"],
        attributes={"startup-script": "echo hi"},
    )
    text = json.dumps(doc, indent=2, sort_keys=True)
    assert hashlib.sha256(text.encode()).hexdigest() == (
        "20b2bebcb335db120748a83bbd708baf7d1a33972c780344b92cc65b855c59e9"
    )
    definition = spec.load(name="md", shift=7)
    assert (
        len(
            cluster.metadata_document(definition, definition.vms[0], "x")["instance"][
                "networkInterfaces"
            ]
        )
        == 1
    )


def test_a_gpu_vm_lists_every_nic_in_gcps_order(tmp_path):
    definition = spec.load(
        name="gpubox",
        shift=6,
        vms=[
            {"name": "vm0", "machine_type": "a3-megagpu-8g"},
            {"name": "vm1", "machine_type": "a3-ultragpu-8g"},
        ],
    )
    mega, ultra = definition.vms
    doc = cluster.metadata_document(definition, mega, "02:42:c6:12:c0:0a", macs={"enp6s0": "m6"})
    path = tmp_path / "instance.json"
    write(path, doc)
    running = gce_metadata.serve(str(path), "127.0.0.1", 0)
    try:
        nics = json.loads(get((running,), V1 + "instance/network-interfaces/?recursive=true")[1])
        listed = get((running,), V1 + "instance/network-interfaces/")[1]
    finally:
        running.shutdown()
    numeric = doc["project"]["numericProjectId"]
    assert len(nics) == 9 and listed.splitlines() == [f"{i}/" for i in range(9)]
    assert (nics[0]["ip"], nics[0]["mtu"]) == ("198.18.192.10", 1460)
    assert nics[0]["network"] == f"projects/{numeric}/networks/default"
    assert nics[1] == {
        "gateway": "198.18.208.1",
        "ip": "198.18.208.10",
        "mac": "m6",
        "mtu": 8244,
        "network": f"projects/{numeric}/networks/gpubox-gpu0",
        "subnetmask": "255.255.255.0",
    }
    assert nics[2]["mac"] == "02:42:c6:12:d1:0a"  # not given: Docker's, from the address
    assert [n["ip"] for n in nics[1:]] == [f"198.18.{208 + i}.10" for i in range(8)]
    assert ["accessConfigs" in n for n in nics] == [True] + [False] * 8

    nics = cluster.metadata_document(definition, ultra, "x")["instance"]["networkInterfaces"]
    assert [(n["ip"], n["mtu"], n["network"].rsplit("/", 1)[1]) for n in nics[:3]] == [
        ("198.18.192.11", 1460, "default"),
        ("198.18.207.11", 8896, "gpubox-net-1"),  # the second control NIC (net-1)
        ("198.18.216.11", 8896, "gpubox-rdma-net"),
    ]
    assert len(nics) == 10


def test_a_spot_vms_document_says_its_scheduling_and_preemption():
    from localcluster import gce_metadata as gm

    common = dict(
        project="hostnet-box",
        zone="us-central1-b",
        name="spot-0",
        instance_id=1,
        machine_type="n2-standard-4",
        ip="198.18.0.10",
        mac="02:42:c6:12:00:0a",
        prefix=24,
        gateway="198.18.0.1",
        mtu=1460,
        external_ip="198.19.0.10",
    )
    standard = gm.vm_document(**common)["instance"]
    assert standard["preempted"] == "FALSE"
    assert standard["scheduling"] == {
        "automaticRestart": "TRUE",
        "onHostMaintenance": "MIGRATE",
        "preemptible": "FALSE",
    }
    assert set(standard["serviceAccounts"]) == {
        "default",
        standard["serviceAccounts"]["default"]["email"],
    }
    spot = gm.vm_document(
        **common,
        scheduling={"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"},
        attributes={"ssh-keys": "gce:ssh-ed25519 AAAA"},
        service_accounts=[{"email": "trainer@p.iam.gserviceaccount.com", "scopes": ["s"]}],
        preempted=True,
    )["instance"]
    assert spot["preempted"] == "TRUE"
    assert spot["scheduling"] == {
        "automaticRestart": "FALSE",
        "onHostMaintenance": "TERMINATE",
        "preemptible": "TRUE",
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
    }
    assert spot["attributes"] == {"ssh-keys": "gce:ssh-ed25519 AAAA"}
    assert spot["serviceAccounts"]["default"]["email"] == "trainer@p.iam.gserviceaccount.com"
    assert set(spot["serviceAccounts"]) == {"default", "trainer@p.iam.gserviceaccount.com"}
    answer = gm.answer_for({"instance": spot}, gm.ROOT + "instance/scheduling/preemptible", {})
    assert answer.body == b"TRUE"
    answer = gm.answer_for({"instance": spot}, gm.ROOT + "instance/preempted", {})
    assert answer.body == b"TRUE"
