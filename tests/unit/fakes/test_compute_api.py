"""The fake Compute Engine API (tests/fakes/compute_api.py) keeps the contract the role's tests
rely on, and its proxy serves nothing but the fake."""

import http.client
import importlib.util
import json
import threading
import time
from pathlib import Path

import pytest
import requests

FAKES = Path(__file__).resolve().parents[2] / "fakes"


def load(name):
    spec = importlib.util.spec_from_file_location(name, FAKES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


compute_api = load("compute_api")
compute_contract = load("compute_contract")

BASE = "https://compute.googleapis.com/compute/v1/projects/hlf-test/global"


@pytest.fixture
def fake(tmp_path):
    server = compute_api.Server(tmp_path)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    session = requests.Session()
    session.trust_env = False  # only the fake's proxy, whatever this machine's settings
    info = server.client_info()
    session.proxies = {"https": info["proxy"], "http": info["proxy"]}
    session.verify = info["ca"]
    session.headers["Authorization"] = f"Bearer {info['token']}"
    yield server, session
    session.close()
    server.shutdown()
    server.server_close()
    thread.join(5)
    # Every exchange of the test kept Google's published contract (compute.v1.json).
    assert compute_contract.validate_log(server.compute.history) == []


def rule(name="r1", **fields):
    body = {"name": name, "network": "global/networks/default"}
    body["allowed"] = [{"IPProtocol": "tcp", "ports": ["0-65535"]}]
    body["sourceRanges"] = ["10.0.0.1/32"]
    body.update(fields)
    return body


def wait_done(session, operation):
    deadline = time.monotonic() + 5
    while operation["status"] != "DONE":
        assert time.monotonic() < deadline
        time.sleep(0.05)
        operation = session.get(f"{BASE}/operations/{operation['name']}").json()
    return operation


def test_insert_get_patch_delete_through_operations(fake):
    server, session = fake
    operation = session.post(f"{BASE}/firewalls", json=rule()).json()
    assert operation["kind"] == "compute#operation"
    assert operation["status"] in ("PENDING", "RUNNING")
    done = wait_done(session, operation)
    assert (
        done["targetLink"]
        == "https://www.googleapis.com/compute/v1/projects/hlf-test/global/firewalls/r1"
    )
    got = session.get(done["targetLink"]).json()  # served on www.googleapis.com too
    assert got["network"].endswith("/projects/hlf-test/global/networks/default")
    assert (got["priority"], got["direction"], got["disabled"]) == (1000, "INGRESS", False)

    wait_done(
        session,
        session.patch(
            f"{BASE}/firewalls/r1", json={"name": "r1", "sourceRanges": ["10.0.0.2/32"]}
        ).json(),
    )
    assert session.get(f"{BASE}/firewalls/r1").json()["sourceRanges"] == ["10.0.0.2/32"]
    listed = session.get(
        f"{BASE}/firewalls", params={"filter": '(name = "r1") OR (name = "x")'}
    ).json()
    assert [r["name"] for r in listed["items"]] == ["r1"]
    assert "items" not in session.get(f"{BASE}/firewalls", params={"filter": 'name = "x"'}).json()

    wait_done(session, session.delete(f"{BASE}/firewalls/r1").json())
    assert session.get(f"{BASE}/firewalls/r1").status_code == 404
    assert [e["host"] for e in server.compute.log][-1] == "compute.googleapis.com"


def test_operations_take_their_time(fake):
    server, session = fake
    server.compute.configure({"operation_seconds": 0.5})
    operation = session.post(f"{BASE}/firewalls", json=rule()).json()
    assert session.get(f"{BASE}/operations/{operation['name']}").json()["status"] == "RUNNING"
    assert session.get(f"{BASE}/firewalls/r1").status_code == 404  # not yet
    time.sleep(0.6)
    assert session.get(f"{BASE}/firewalls/r1").status_code == 200  # done, polled or not
    server.compute.configure({"operation_seconds": None})
    operation = session.delete(f"{BASE}/firewalls/r1").json()
    time.sleep(0.3)
    assert session.get(f"{BASE}/operations/{operation['name']}").json()["status"] == "RUNNING"


def error(answer):
    body = answer.json()["error"]
    return answer.status_code, body["code"], body["errors"][0]["reason"], body["message"]


def test_google_errors(fake):
    server, session = fake
    wait_done(session, session.post(f"{BASE}/firewalls", json=rule()).json())
    code, _code, reason, message = error(session.post(f"{BASE}/firewalls", json=rule()))
    assert (code, reason) == (409, "alreadyExists")
    assert message == "The resource 'projects/hlf-test/global/firewalls/r1' already exists"
    assert error(session.post(f"{BASE}/firewalls", json=rule("Bad_Name")))[:3] == (
        400,
        400,
        "invalid",
    )
    assert error(session.post(f"{BASE}/firewalls", json=rule("r2", sourceRanges=["x"])))[0] == 400
    assert (
        error(
            session.patch(
                f"{BASE}/firewalls/r1", json={"name": "r1", "network": "global/networks/hlf-net"}
            )
        )[0]
        == 400
    )
    code, _code, reason, message = error(
        session.post(f"{BASE}/firewalls", json=rule("r3", network="global/networks/nope"))
    )
    assert (code, reason, message) == (
        404,
        "notFound",
        "The resource 'projects/hlf-test/global/networks/nope' was not found",
    )
    missing = session.get(BASE.replace("hlf-test", "hlf-gone") + "/firewalls")
    assert error(missing)[3] == "The resource 'projects/hlf-gone' was not found"
    server.compute.configure({"deny": ["compute.firewalls.update"]})
    code, _code, reason, message = error(
        session.patch(f"{BASE}/firewalls/r1", json={"priority": 5})
    )
    assert (code, reason) == (403, "forbidden")
    resource = "projects/hlf-test/global/firewalls/r1"
    assert message == f"Required 'compute.firewalls.update' permission for '{resource}'"
    assert (
        session.get(f"{BASE}/firewalls/r1", headers={"Authorization": "Bearer wrong"}).status_code
        == 401
    )
    assert error(session.get(f"{BASE}/firewalls", params={"filter": "priority > 5"}))[0] == 400


def test_firewall_list_pages_by_max_results(fake):
    session = fake[1]
    for name in ("r1", "r2", "r3"):
        wait_done(session, session.post(f"{BASE}/firewalls", json=rule(name)).json())
    first = session.get(f"{BASE}/firewalls", params={"maxResults": "2"}).json()
    assert [r["name"] for r in first["items"]] == ["r1", "r2"]
    params = {"maxResults": "2", "pageToken": first["nextPageToken"]}
    second = session.get(f"{BASE}/firewalls", params=params).json()
    assert [r["name"] for r in second["items"]] == ["r3"]
    assert "nextPageToken" not in second
    assert error(session.get(f"{BASE}/firewalls", params={"maxResults": "501"}))[0] == 400
    params = {"filter": 'name = "r1"', "pageToken": first["nextPageToken"]}
    assert error(session.get(f"{BASE}/firewalls", params=params))[0] == 400  # another filter's


def test_a_rules_name_is_required_by_insert_and_patch(fake):
    # The discovery document annotates Firewall.name as required by both methods.
    session = fake[1]
    wait_done(session, session.post(f"{BASE}/firewalls", json=rule()).json())
    for answer in (
        session.post(f"{BASE}/firewalls", json={**rule(), "name": None}),
        session.patch(f"{BASE}/firewalls/r1", json={"priority": 5}),
    ):
        assert error(answer) == (
            400,
            400,
            "required",
            "Required field 'resource.name' not specified",
        )
    assert error(session.patch(f"{BASE}/firewalls/r1", json={"name": "r2"}))[:3] == (
        400,
        400,
        "invalid",
    )


def test_query_parameter_the_method_does_not_take_is_refused(fake):
    session = fake[1]
    answer = session.get(f"{BASE}/firewalls/r1", params={"filter": 'name = "r1"'})
    assert error(answer)[:3] == (400, 400, "invalid")
    assert error(answer)[3].startswith('Invalid JSON payload received. Unknown name "filter"')
    assert answer.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert error(session.delete(f"{BASE}/firewalls/r1", params={"force": "true"}))[0] == 400
    # The method's own and the standard ones are taken.
    params = {"filter": 'name = "x"', "maxResults": "5", "alt": "json", "prettyPrint": "false"}
    assert session.get(f"{BASE}/firewalls", params=params).status_code == 200
    assert session.delete(f"{BASE}/firewalls/r1", params={"requestId": "a"}).status_code == 404


def test_ingress_without_sources_is_open_to_the_world(fake):
    # the real API's default, which makes a missing source so dangerous
    session = fake[1]
    body = rule("r4")
    del body["sourceRanges"]
    wait_done(session, session.post(f"{BASE}/firewalls", json=body).json())
    assert session.get(f"{BASE}/firewalls/r4").json()["sourceRanges"] == ["0.0.0.0/0"]


def test_the_proxy_forwards_nothing(fake):
    server = fake[0]
    host, port = server.server_address
    for request in (
        ("CONNECT", "example.com:443"),
        ("CONNECT", "compute.googleapis.com:80"),
        ("GET", "http://example.com/"),
    ):
        connection = http.client.HTTPConnection(host, port, timeout=5)
        connection.request(*request)
        assert connection.getresponse().status == 403
        connection.close()
    refused = [(e["method"], e["host"]) for e in server.compute.log if e.get("refused")]
    assert refused == [
        ("CONNECT", "example.com:443"),
        ("CONNECT", "compute.googleapis.com:80"),
        ("GET", "http://example.com/"),
    ]


def test_control_api(fake):
    server = fake[0]
    host, port = server.server_address
    connection = http.client.HTTPConnection(host, port, timeout=5)
    connection.request("PUT", "/_fake/firewalls/hlf-test/hand", body=json.dumps({"priority": 5}))
    stored = json.loads(connection.getresponse().read())
    # What every stored rule has is filled in (a patch or delete answers its id and selfLink).
    assert stored["id"].isdigit()
    assert (stored["kind"], stored["name"], stored["priority"]) == ("compute#firewall", "hand", 5)
    assert stored["selfLink"] == f"{compute_api.LINK}projects/hlf-test/global/firewalls/hand"
    connection.request("GET", "/_fake/firewalls")
    assert json.loads(connection.getresponse().read()) == {"hlf-test/hand": stored}
    connection.close()
    assert server.compute.log == []  # control calls are not API traffic


def test_history_outlives_reset_and_clearing_the_log(fake):
    server, session = fake
    session.get(f"{BASE}/firewalls")
    host, port = server.server_address
    connection = http.client.HTTPConnection(host, port, timeout=5)
    for method, path in (("DELETE", "/_fake/requests"), ("POST", "/_fake/reset")):
        connection.request(method, path)
        assert connection.getresponse().read() == b"{}"
    connection.request("GET", "/_fake/history")
    history = json.loads(connection.getresponse().read())
    connection.close()
    assert server.compute.log == []
    assert [(e["method"], e["status"]) for e in history] == [("GET", 200)]
    assert history[0]["response"]["kind"] == "compute#firewallList"
