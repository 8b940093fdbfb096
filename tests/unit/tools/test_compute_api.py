"""The fake Compute Engine API (tools/localcluster/compute_api.py) keeps the contract the role's
tests rely on, and its proxy serves nothing but the fake."""

import functools
import http.client
import json
import threading
import time

import compute_contract
import pytest
import requests
from localcluster import compute_api

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
    request_id = {"requestId": "4f9a3c1e-8d2b-4b7a-9e51-2c6d0f8a7b13"}
    assert session.delete(f"{BASE}/firewalls/r1", params=request_id).status_code == 404


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


# -- instances per zone, a backend, OAuth2 ------------------------------------------------------

ZONE = "https://compute.googleapis.com/compute/v1/projects/box-project/zones/us-central1-a"


class Backend:
    """A backend as gce_control.ClusterBackend is one, in memory: every action recorded; an
    action waits for `release` when it is cleared, raises when `fail` names it."""

    project, zone, networks = "box-project", "us-central1-a", ["default"]

    def __init__(self):
        self.calls, self.rules = [], []
        self.release = threading.Event()
        self.release.set()
        self.fail = None
        self.status = {"vm0": "RUNNING", "vm1": "RUNNING"}
        self.labels = {"vm0": {"llamafactory": "training"}, "vm1": {"role": "web"}}
        self.zones = {"vm0": self.zone, "vm1": self.zone}
        policy = f"{compute_api.LINK}projects/{self.project}/regions/us-central1/resourcePolicies"
        self.extra = {"vm0": {"resourcePolicies": [f"{policy}/compact"]}, "vm1": {}}
        self.preempted = threading.Event()

    def instances(self):
        found = []
        for name, status in self.status.items():
            link = f"{compute_api.LINK}projects/{self.project}/zones/{self.zones[name]}"
            found.append(
                {
                    "kind": "compute#instance",
                    "name": name,
                    "zone": link,
                    "selfLink": f"{link}/instances/{name}",
                    "status": status,
                    "labels": dict(self.labels[name]),
                    **self.extra[name],
                }
            )
        return found

    def insert(self, zone, body):
        self._act("insert", zone, body)
        name, link = body["name"], f"{compute_api.LINK}projects/{self.project}/zones/{zone}"
        self.zones[name], self.status[name] = zone, "RUNNING"
        self.labels[name] = dict(body.get("labels") or {})
        self.extra[name] = {
            "id": "4711",
            "machineType": f"{link}/machineTypes/{body['machineType']}",
            "scheduling": body["scheduling"],
        }

    def preempt(self, name):
        self.calls.append(("preempt", name))
        if self.extra[name]["scheduling"]["instanceTerminationAction"] == "DELETE":
            del self.status[name]
        else:
            self.status[name] = "TERMINATED"
        self.preempted.set()

    def _act(self, verb, name, *args):
        self.calls.append((verb, name, *args))
        self.release.wait(5)
        if self.fail == verb:
            raise RuntimeError(f"{verb} failed")

    def stop(self, name):
        self._act("stop", name)
        self.status[name] = "TERMINATED"

    def start(self, name):
        self._act("start", name)
        self.status[name] = "RUNNING"

    def reset(self, name):
        self._act("reset", name)

    def delete(self, name):
        self._act("delete", name)
        del self.status[name]

    def set_labels(self, name, labels):
        self._act("set_labels", name, labels)
        self.labels[name] = labels

    def firewalls_landed(self, rules):
        self.rules.append([r["name"] for r in rules])

    def resource_policies(self):
        region = f"{compute_api.LINK}projects/{self.project}/regions/us-central1"
        return [
            {
                "kind": "compute#resourcePolicy",
                "id": "4242",
                "creationTimestamp": "2026-12-01T10:00:00.000-00:00",
                "selfLink": f"{region}/resourcePolicies/compact",
                "region": region,
                "name": "compact",
                "status": "READY",
                "groupPlacementPolicy": {"vmCount": 2, "collocation": "COLLOCATED"},
            }
        ]


@pytest.fixture
def boxed(tmp_path):
    backend = Backend()
    server = compute_api.Server(tmp_path, backend=backend)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    session = requests.Session()
    session.trust_env = False
    info = server.client_info()
    session.proxies = {"https": info["proxy"], "http": info["proxy"]}
    session.verify = info["ca"]
    session.headers["Authorization"] = f"Bearer {info['token']}"
    yield server, session, backend
    session.close()
    server.shutdown()
    server.server_close()
    thread.join(5)


def polled_done(session, operation):
    """Poll an operation at its selfLink until it is DONE."""
    deadline = time.monotonic() + 5
    while operation["status"] != "DONE":
        assert time.monotonic() < deadline
        time.sleep(0.05)
        operation = session.get(operation["selfLink"]).json()
    return operation


def test_zonal_list_and_get_read_the_backend(boxed):
    _server, session, backend = boxed
    listed = session.get(f"{ZONE}/instances").json()
    assert listed["kind"] == "compute#instanceList"
    assert [i["name"] for i in listed["items"]] == ["vm0", "vm1"]
    filtered = session.get(
        f"{ZONE}/instances", params={"filter": "labels.llamafactory = training"}
    ).json()
    assert [i["name"] for i in filtered["items"]] == ["vm0"]
    backend.status["vm0"] = "TERMINATED"  # read live at every request
    got = session.get(f"{ZONE}/instances/vm0").json()
    assert got["status"] == "TERMINATED"
    assert got["labelFingerprint"] == compute_api.label_fingerprint({"llamafactory": "training"})
    assert error(session.get(f"{ZONE}/instances/vm9"))[:3] == (404, 404, "notFound")
    other_zone = session.get(ZONE.replace("us-central1-a", "asia-east1-a") + "/instances")
    assert error(other_zone)[3] == (
        "The resource 'projects/box-project/zones/asia-east1-a' was not found"
    )
    aggregated = session.get(
        "https://compute.googleapis.com/compute/v1/projects/box-project/aggregated/instances"
    ).json()
    names = [i["name"] for i in aggregated["items"]["zones/us-central1-a"]["instances"]]
    assert names == ["vm0", "vm1"]


def test_writes_run_the_backend_in_an_operation(boxed):
    _server, session, backend = boxed
    backend.release.clear()  # the backend's stop takes its time
    operation = session.post(f"{ZONE}/instances/vm1/stop").json()
    assert (operation["kind"], operation["operationType"]) == ("compute#operation", "stop")
    assert operation["selfLink"].endswith(
        f"/projects/box-project/zones/us-central1-a/operations/{operation['name']}"
    )
    assert operation["targetLink"].endswith("/zones/us-central1-a/instances/vm1")
    time.sleep(0.2)
    polled = session.get(f"{ZONE}/operations/{operation['name']}").json()
    assert polled["status"] == "RUNNING"
    global_path = f"{BASE.replace('hlf-test', 'box-project')}/operations/{operation['name']}"
    assert session.get(global_path).status_code == 404  # a zonal operation
    backend.release.set()
    polled_done(session, polled)
    assert session.get(f"{ZONE}/instances/vm1").json()["status"] == "TERMINATED"

    code, _code, reason, _message = error(session.post(f"{ZONE}/instances/vm1/reset"))
    assert (code, reason) == (400, "resourceNotReady")  # reset needs a running VM
    polled_done(session, session.post(f"{ZONE}/instances/vm1/start").json())
    polled_done(session, session.post(f"{ZONE}/instances/vm1/reset").json())
    polled_done(session, session.delete(f"{ZONE}/instances/vm1").json())
    assert [c[:2] for c in backend.calls] == [
        ("stop", "vm1"),
        ("start", "vm1"),
        ("reset", "vm1"),
        ("delete", "vm1"),
    ]
    assert session.get(f"{ZONE}/instances/vm1").status_code == 404

    backend.fail = "stop"
    failed = polled_done(session, session.post(f"{ZONE}/instances/vm0/stop").json())
    assert failed["error"]["errors"][0]["message"] == "RuntimeError: stop failed"
    assert session.post(f"{ZONE}/instances/vm0/halt").status_code == 404


def test_set_labels_needs_the_current_fingerprint(boxed):
    server, session, backend = boxed
    fingerprint = session.get(f"{ZONE}/instances/vm1").json()["labelFingerprint"]
    stale = {"labels": {"llamafactory": "training"}, "labelFingerprint": "c3RhbGU="}
    code, _code, reason, _message = error(
        session.post(f"{ZONE}/instances/vm1/setLabels", json=stale)
    )
    assert (code, reason) == (412, "conditionNotMet")
    bad = {"labels": {"Rank": "1"}, "labelFingerprint": fingerprint}
    assert error(session.post(f"{ZONE}/instances/vm1/setLabels", json=bad))[0] == 400
    new = {"llamafactory": "training", "llamafactory-rank": "1"}
    body = {"labels": new, "labelFingerprint": fingerprint}
    done = polled_done(session, session.post(f"{ZONE}/instances/vm1/setLabels", json=body).json())
    assert done["operationType"] == "setLabels"
    assert backend.calls == [("set_labels", "vm1", new)]
    got = session.get(f"{ZONE}/instances/vm1").json()
    assert (got["labels"], got["labelFingerprint"]) == (new, compute_api.label_fingerprint(new))
    # the old fingerprint is stale now
    assert error(session.post(f"{ZONE}/instances/vm1/setLabels", json=body))[0] == 412
    server.compute.configure({"deny": ["compute.instances.setLabels"]})
    body["labelFingerprint"] = got["labelFingerprint"]
    assert error(session.post(f"{ZONE}/instances/vm1/setLabels", json=body))[0] == 403


def test_firewall_writes_that_land_reach_the_backend(boxed):
    _server, session, backend = boxed
    base = BASE.replace("hlf-test", "box-project")
    polled_done(session, session.post(f"{base}/firewalls", json=rule("r1")).json())
    polled_done(session, session.post(f"{base}/firewalls", json=rule("r2")).json())
    polled_done(session, session.delete(f"{base}/firewalls/r1").json())
    assert backend.rules == [["r1"], ["r1", "r2"], ["r2"]]


def test_static_instances_stop_start_and_delete_in_memory(fake):
    server, session = fake
    zone = ZONE.replace("box-project", "hlf-test")
    nic = {"networkIP": "10.128.0.2", "accessConfigs": [{"natIP": "203.0.113.2"}]}
    server.compute.put_instance("hlf-test", "us-central1-a", "a", {"networkInterfaces": [nic]})

    polled_done(session, session.post(f"{zone}/instances/a/stop").json())
    stopped = session.get(f"{zone}/instances/a").json()
    assert stopped["status"] == "TERMINATED"
    assert "natIP" not in stopped["networkInterfaces"][0]["accessConfigs"][0]
    polled_done(session, session.post(f"{zone}/instances/a/start").json())
    started = session.get(f"{zone}/instances/a").json()
    assert started["status"] == "RUNNING"
    assert started["networkInterfaces"][0]["accessConfigs"][0]["natIP"] == "203.0.113.2"
    polled_done(session, session.delete(f"{zone}/instances/a").json())
    assert session.get(f"{zone}/instances/a").status_code == 404


def token_request(server, session, **form):
    return session.post("https://oauth2.googleapis.com/token", data=form)


def test_a_service_account_file_gets_a_token_the_api_accepts(fake, tmp_path):
    import google.auth.transport.requests
    import google.oauth2.service_account

    server, session = fake
    account = json.loads((tmp_path / "service-account.json").read_text())
    assert account["type"] == "service_account"
    assert account["token_uri"] == compute_api.TOKEN_URI
    assert (tmp_path / "service-account.json").stat().st_mode & 0o077 == 0
    credentials = google.oauth2.service_account.Credentials.from_service_account_info(
        account, scopes=["https://www.googleapis.com/auth/compute"]
    )
    plain = requests.Session()
    plain.trust_env, plain.proxies, plain.verify = False, session.proxies, session.verify
    authorized = google.auth.transport.requests.AuthorizedSession(
        credentials, auth_request=google.auth.transport.requests.Request(plain)
    )
    authorized.trust_env, authorized.proxies, authorized.verify = (
        False,
        session.proxies,
        session.verify,
    )
    assert authorized.get(f"{BASE}/firewalls").status_code == 200
    assert credentials.token.startswith("ya29.")
    grants = [e for e in server.compute.log if e["host"] == "oauth2.googleapis.com"]
    assert [(g["path"], g["status"]) for g in grants] == [("/token", 200)]
    authorized.close()


def test_the_token_endpoint_refuses_what_google_refuses(fake, tmp_path):
    import google.auth.crypt
    import google.auth.jwt
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    server, session = fake
    account = json.loads((tmp_path / "service-account.json").read_text())
    signer = google.auth.crypt.RSASigner.from_service_account_info(account)
    now = int(time.time())
    claims = {
        "iss": account["client_email"],
        "aud": account["token_uri"],
        "scope": "https://www.googleapis.com/auth/compute",
        "iat": now,
        "exp": now + 3600,
    }

    def grant(signer=signer, grant_type=compute_api.JWT_BEARER, **changes):
        assertion = google.auth.jwt.encode(signer, {**claims, **changes}).decode()
        answer = token_request(server, session, grant_type=grant_type, assertion=assertion)
        return answer.status_code, answer.json()

    status, body = grant()
    assert status == 200
    assert (body["token_type"], body["expires_in"]) == ("Bearer", 3599)
    bearer = {"Authorization": f"Bearer {body['access_token']}"}
    assert session.get(f"{BASE}/firewalls", headers=bearer).status_code == 200

    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = other_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    forged = google.auth.crypt.RSASigner.from_string(pem)
    assert grant(signer=forged) == (
        400,
        {"error": "invalid_grant", "error_description": "Invalid JWT Signature."},
    )
    assert grant(grant_type="client_credentials")[1]["error"] == "unsupported_grant_type"
    assert grant(exp=now - 10, iat=now - 100)[1]["error"] == "invalid_grant"
    assert grant(exp=now + 7200)[1]["error"] == "invalid_grant"  # longer than an hour
    assert grant(aud="https://example.com/token")[1]["error"] == "invalid_grant"
    assert grant(iss="someone@else.iam.gserviceaccount.com")[1]["error"] == "invalid_grant"
    assert grant(scope="")[1]["error"] == "invalid_scope"
    made_up = {"Authorization": "Bearer ya29.made-up"}
    assert session.get(f"{BASE}/firewalls", headers=made_up).status_code == 401


def test_resource_policies_get_answers_the_backends_placement_policy(boxed):
    server, session, _backend = boxed
    regions = f"https://compute.googleapis.com/compute/v1/projects/{Backend.project}/regions"
    policy = session.get(f"{regions}/us-central1/resourcePolicies/compact")
    assert policy.status_code == 200, policy.text
    assert policy.json()["groupPlacementPolicy"] == {"vmCount": 2, "collocation": "COLLOCATED"}
    assert session.get(f"{regions}/us-central1/resourcePolicies/other").status_code == 404
    assert session.get(f"{regions}/europe-west9/resourcePolicies/compact").status_code == 404
    # vm0 uses it: GCE refuses to delete a policy in use.
    code, _code, reason, message = error(
        session.delete(f"{regions}/us-central1/resourcePolicies/compact")
    )
    assert (code, reason) == (400, "resourceInUseByAnotherResource")
    assert message.endswith(
        "is already being used by 'projects/box-project/zones/us-central1-a/instances/vm0'"
    )
    assert compute_contract.validate_log(server.compute.history) == []


ZONE_A = "https://compute.googleapis.com/compute/v1/projects/hlf-test/zones/us-central1-a"


def zonal_done(session, operation):
    deadline = time.monotonic() + 5
    while operation["status"] != "DONE":
        assert time.monotonic() < deadline
        time.sleep(0.05)
        operation = session.get(operation["selfLink"]).json()
    return operation


def gpu_vm(name, **fields):
    body = {
        "name": name,
        "machineType": "zones/us-central1-a/machineTypes/g2-standard-8",
        "scheduling": {"onHostMaintenance": "TERMINATE"},
        "networkInterfaces": [{"accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}],
    }
    body.update(fields)
    return body


def test_instances_insert_takes_quota_and_capacity_as_gce_does(fake):
    server, session = fake
    region = "https://compute.googleapis.com/compute/v1/projects/hlf-test/regions/us-central1"
    done = zonal_done(session, session.post(f"{ZONE_A}/instances", json=gpu_vm("g0")).json())
    assert "error" not in done
    got = session.get(f"{ZONE_A}/instances/g0").json()
    assert (got["status"], got["scheduling"]["provisioningModel"]) == ("RUNNING", "STANDARD")
    quotas = {q["metric"]: q for q in session.get(region).json()["quotas"]}
    assert (quotas["NVIDIA_L4_GPUS"]["usage"], quotas["CPUS"]["usage"]) == (1.0, 8.0)
    assert quotas["IN_USE_ADDRESSES"]["usage"] == 1.0
    # 409 for a name taken; GPUs cannot live-migrate; an unknown machine type is named.
    assert session.post(f"{ZONE_A}/instances", json=gpu_vm("g0")).status_code == 409
    answer = session.post(f"{ZONE_A}/instances", json=gpu_vm("g1", scheduling={}))
    assert "do not support live migration" in error(answer)[3]
    answer = session.post(
        f"{ZONE_A}/instances",
        json=gpu_vm("g1", machineType="zones/us-central1-a/machineTypes/zz-1"),
    )
    assert error(answer)[3] == (
        "Invalid value for field 'resource.machineType': 'zones/us-central1-a/machineTypes/zz-1'. "
        "Machine type with name 'zz-1' does not exist in zone 'us-central1-a'."
    )
    # A quota reached: the insert is accepted and its operation ends with QUOTA_EXCEEDED.
    server.compute.configure({"quotas": {"us-central1": {"NVIDIA_L4_GPUS": 1}}})
    done = zonal_done(session, session.post(f"{ZONE_A}/instances", json=gpu_vm("g1")).json())
    assert done["error"]["errors"] == [
        {
            "code": "QUOTA_EXCEEDED",
            "message": "Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 1.0 in region us-central1.",
        }
    ]
    # A spot VM takes the preemptible quota; a zone's capacity spent: a stock-out.
    spot = {"onHostMaintenance": "TERMINATE", "provisioningModel": "SPOT"}
    done = zonal_done(
        session, session.post(f"{ZONE_A}/instances", json=gpu_vm("s1", scheduling=spot)).json()
    )
    assert "error" not in done
    assert session.get(f"{ZONE_A}/instances/s1").json()["scheduling"] == {
        "onHostMaintenance": "TERMINATE",
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "STOP",
        "preemptible": True,
        "automaticRestart": False,
    }
    server.compute.configure({"capacity": {"us-central1-a": {"g2-standard-8": 2}}})
    done = zonal_done(
        session, session.post(f"{ZONE_A}/instances", json=gpu_vm("s2", scheduling=spot)).json()
    )
    assert done["error"]["errors"][0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert session.get(f"{ZONE_A}/instances/s2").status_code == 404
    machine = session.get(f"{ZONE_A}/machineTypes/g2-standard-8").json()
    assert (machine["guestCpus"], machine["accelerators"]) == (
        8,
        [{"guestAcceleratorType": "nvidia-l4", "guestAcceleratorCount": 1}],
    )


# -- creating, preempting and deleting VMs; placement policies; zone operations ----------------

REGION = "https://compute.googleapis.com/compute/v1/projects/hlf-test/regions/us-central1"
PREEMPTED = 'operationType = "compute.instances.preempted"'


def control(server, method, path, body=None):
    """A call to the fake's control API: (status, JSON answer)."""
    host, port = server.server_address
    connection = http.client.HTTPConnection(host, port, timeout=5)
    connection.request(method, f"/_fake/{path}", body=json.dumps(body) if body else None)
    response = connection.getresponse()
    answer = response.status, json.loads(response.read())
    connection.close()
    return answer


def vm(name, machine="e2-standard-4", **fields):
    body = {
        "name": name,
        "machineType": f"zones/us-central1-a/machineTypes/{machine}",
        "networkInterfaces": [{"accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}],
    }
    body.update(fields)
    return body


def created(session, body, zone=ZONE_A):
    done = zonal_done(session, session.post(f"{zone}/instances", json=body).json())
    assert "error" not in done, done
    return session.get(f"{zone}/instances/{body['name']}").json()


def usage(session, region=REGION):
    return {q["metric"]: q["usage"] for q in session.get(region).json()["quotas"]}


def test_a_write_sent_again_with_its_request_id_is_answered_with_the_first_operation(fake):
    """A client that lost the answer to an insert (a dropped connection) sends it again with the
    same requestId: GCE acts once and answers with the first operation."""
    _server, session = fake
    request_id = {"requestId": "9b2f6e4a-1c3d-4e5f-8a7b-0c1d2e3f4a5b"}
    first = session.post(f"{ZONE_A}/instances", params=request_id, json=gpu_vm("r0")).json()
    again = session.post(f"{ZONE_A}/instances", params=request_id, json=gpu_vm("r0"))
    assert again.status_code == 200 and again.json()["name"] == first["name"]
    assert "error" not in zonal_done(session, first)
    listed = session.get(f"{ZONE_A}/instances").json()["items"]
    assert [i["name"] for i in listed].count("r0") == 1
    # Another requestId is another request: the name is taken.
    other = {"requestId": "0d1e2f3a-4b5c-4d6e-8f7a-9b0c1d2e3f4a"}
    assert session.post(f"{ZONE_A}/instances", params=other, json=gpu_vm("r0")).status_code == 409
    bad = session.post(f"{ZONE_A}/instances", params={"requestId": "x1"}, json=gpu_vm("r1"))
    assert error(bad)[3] == "Invalid value for field 'requestId': 'x1'. Must be a valid UUID."


def test_an_inserted_instance_is_answered_as_gce_answers_it(fake):
    _server, session = fake
    body = vm(
        "v0",
        machineType=f"{compute_api.LINK}projects/hlf-test/zones/us-central1-a/machineTypes/"
        "n2-standard-4",
        labels={"llamafactory": "training"},
        metadata={"items": [{"key": "startup-script", "value": "true"}]},
        disks=[{"boot": True, "autoDelete": True, "initializeParams": {"diskSizeGb": "50"}}],
        serviceAccounts=[{"email": "default", "scopes": ["https://x/auth/cloud-platform"]}],
    )
    operation = session.post(f"{ZONE_A}/instances", json=body).json()
    assert (operation["operationType"], operation["status"]) == ("insert", "RUNNING")
    assert (
        operation["targetLink"]
        == f"{compute_api.LINK}projects/hlf-test/zones/us-central1-a/instances/v0"
    )
    zonal_done(session, operation)
    got = session.get(f"{ZONE_A}/instances/v0").json()
    assert (got["kind"], got["status"], got["id"].isdigit()) == (
        "compute#instance",
        "RUNNING",
        True,
    )
    assert got["machineType"].endswith(
        "/projects/hlf-test/zones/us-central1-a/machineTypes/n2-standard-4"
    )
    assert got["labelFingerprint"] == compute_api.label_fingerprint({"llamafactory": "training"})
    assert got["metadata"]["items"] == body["metadata"]["items"] and got["metadata"]["fingerprint"]
    assert got["scheduling"] == {
        "provisioningModel": "STANDARD",
        "automaticRestart": True,
        "onHostMaintenance": "MIGRATE",
    }
    nic = got["networkInterfaces"][0]
    assert nic["network"].endswith("/projects/hlf-test/global/networks/default")
    assert nic["subnetwork"].endswith("/projects/hlf-test/regions/us-central1/subnetworks/default")
    assert nic["networkIP"].startswith("10.128.")
    assert nic["accessConfigs"][0]["natIP"]
    assert got["disks"][0]["source"].endswith("/zones/us-central1-a/disks/v0")
    assert got["disks"][0]["diskSizeGb"] == "50"
    assert got["serviceAccounts"][0]["email"].endswith("-compute@developer.gserviceaccount.com")
    # No external address asked: none given; every VM its own internal address.
    other = created(session, vm("v1", networkInterfaces=[{}]))
    assert "accessConfigs" not in other["networkInterfaces"][0]
    assert other["networkInterfaces"][0]["networkIP"] != nic["networkIP"]
    assert usage(session)["N2_CPUS"] == 4.0 and usage(session)["E2_CPUS"] == 4.0


def test_insert_refuses_what_gce_refuses(fake):
    server, session = fake
    post = functools.partial(session.post, f"{ZONE_A}/instances")
    assert error(post(json=vm("Bad_Name")))[:3] == (400, 400, "invalid")
    assert error(post(json={"name": "v0"}))[:3] == (400, 400, "required")
    assert (
        "URL to a valid Compute resource" in error(post(json=vm("v0", machineType="e2-small")))[3]
    )
    other_zone = vm("v0", machineType="zones/us-central1-b/machineTypes/e2-standard-4")
    assert "different scope" in error(post(json=other_zone))[3]
    spot = {"provisioningModel": "SPOT", "instanceTerminationAction": "HIBERNATE"}
    assert error(post(json=vm("v0", scheduling=spot)))[:3] == (400, 400, "invalid")
    migrating = {"provisioningModel": "SPOT", "onHostMaintenance": "MIGRATE"}
    assert "preemptible be false" in error(post(json=vm("v0", scheduling=migrating)))[3]
    attached = vm(
        "v0",
        machine="n1-standard-4",
        guestAccelerators=[{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 1}],
    )
    assert "live migration" in error(post(json=attached))[3]
    assert error(post(json=vm("v0", labels={"Bad": "x"})))[0] == 400
    policy = ["projects/hlf-test/regions/us-central1/resourcePolicies/nope"]
    assert error(post(json=vm("v0", resourcePolicies=policy)))[:3] == (404, 404, "notFound")
    network = [{"network": "global/networks/nope"}]
    assert error(post(json=vm("v0", networkInterfaces=network)))[0] == 404
    server.compute.configure({"deny": ["compute.instances.create"]})
    assert error(post(json=vm("v0")))[:3] == (403, 403, "forbidden")
    assert session.get(f"{ZONE_A}/instances/v0").status_code == 404


def test_capacity_is_freed_by_stop_and_delete_and_taken_by_start(fake):
    server, session = fake
    server.compute.configure({"capacity": {"us-central1-a": {"g2-standard-8": 1}}})
    created(session, gpu_vm("g0"))
    done = zonal_done(session, session.post(f"{ZONE_A}/instances", json=gpu_vm("g1")).json())
    assert done["error"]["errors"][0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert "does not have enough resources" in done["error"]["errors"][0]["message"]
    zonal_done(session, session.post(f"{ZONE_A}/instances/g0/stop").json())
    created(session, gpu_vm("g1"))  # a stopped VM holds no capacity
    done = zonal_done(session, session.post(f"{ZONE_A}/instances/g0/start").json())
    assert done["error"]["errors"][0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert session.get(f"{ZONE_A}/instances/g0").json()["status"] == "TERMINATED"
    zonal_done(session, session.delete(f"{ZONE_A}/instances/g1").json())
    assert "error" not in zonal_done(session, session.post(f"{ZONE_A}/instances/g0/start").json())
    # Quota: what a deleted VM took is free again.
    server.compute.configure({"capacity": {}, "quotas": {"us-central1": {"NVIDIA_L4_GPUS": 1}}})
    assert usage(session)["NVIDIA_L4_GPUS"] == 1.0
    zonal_done(session, session.delete(f"{ZONE_A}/instances/g0").json())
    assert usage(session)["NVIDIA_L4_GPUS"] == 0.0
    created(session, gpu_vm("g2"))


def test_parallel_inserts_cannot_both_take_the_last_slot(fake):
    server, session = fake
    server.compute.configure(
        {"operation_seconds": 0.3, "capacity": {"us-central1-a": {"g2-standard-8": 1}}}
    )
    first = session.post(f"{ZONE_A}/instances", json=gpu_vm("g0")).json()
    second = session.post(f"{ZONE_A}/instances", json=gpu_vm("g1")).json()
    assert session.post(f"{ZONE_A}/instances", json=gpu_vm("g0")).status_code == 409  # pending
    assert "error" not in zonal_done(session, first)
    assert zonal_done(session, second)["error"]["errors"][0]["code"] == (
        "ZONE_RESOURCE_POOL_EXHAUSTED"
    )


def test_newer_gpus_quotas_are_enforced_but_not_listed(fake):
    # compute.v1.json's Quota enum has no NVIDIA_H100_GPUS: regions.get cannot list it, the
    # insert's QUOTA_EXCEEDED names it.
    server, session = fake
    machine = session.get(f"{ZONE_A}/machineTypes/a3-ultragpu-8g").json()
    assert (machine["guestCpus"], machine["memoryMb"]) == (224, 3022848)
    assert machine["accelerators"] == [
        {"guestAcceleratorType": "nvidia-h200-141gb", "guestAcceleratorCount": 8}
    ]
    assert error(session.get(f"{ZONE_A}/machineTypes/z9-huge-1"))[0] == 404
    server.compute.configure({"quotas": {"us-central1": {"NVIDIA_H100_GPUS": 4}}})
    a3 = gpu_vm("h0", machineType="zones/us-central1-a/machineTypes/a3-highgpu-8g")
    done = zonal_done(session, session.post(f"{ZONE_A}/instances", json=a3).json())
    assert done["error"]["errors"][0]["message"] == (
        "Quota 'NVIDIA_H100_GPUS' exceeded.  Limit: 4.0 in region us-central1."
    )
    spot = {"provisioningModel": "SPOT", "onHostMaintenance": "TERMINATE"}
    created(session, {**a3, "scheduling": spot})  # against PREEMPTIBLE_NVIDIA_H100_GPUS
    listed = usage(session)
    assert "NVIDIA_H100_GPUS" not in listed
    assert listed["PREEMPTIBLE_NVIDIA_H100_GPUS"] == 8.0
    # No preemptible quota: a spot VM counts against the standard one (GCE's rule).
    quotas = {"NVIDIA_H100_GPUS": 4, "PREEMPTIBLE_NVIDIA_H100_GPUS": 0}
    server.compute.configure({"quotas": {"us-central1": quotas}})
    done = zonal_done(
        session,
        session.post(f"{ZONE_A}/instances", json={**a3, "name": "h1", "scheduling": spot}).json(),
    )
    assert done["error"]["errors"][0]["code"] == "QUOTA_EXCEEDED"


def test_the_zones_that_exist_are_configured(fake):
    server, session = fake
    server.compute.configure({"zones": ["us-east1-b"]})
    east = ZONE_A.replace("us-central1-a", "us-east1-b")
    assert session.get(f"{east}/instances").status_code == 200
    assert error(session.get(f"{ZONE_A}/instances"))[0] == 404
    region = session.get(REGION.replace("us-central1", "us-east1")).json()
    assert region["zones"] == [f"{compute_api.LINK}projects/hlf-test/zones/us-east1-b"]
    assert session.get(REGION).status_code == 404


def test_resource_policies_insert_get_and_delete(fake):
    _server, session = fake
    body = {
        "name": "grp-compact",
        "groupPlacementPolicy": {"collocation": "COLLOCATED", "vmCount": 2},
    }
    operation = session.post(f"{REGION}/resourcePolicies", json=body).json()
    assert operation["region"] == f"{compute_api.LINK}projects/hlf-test/regions/us-central1"
    assert "/regions/us-central1/operations/" in operation["selfLink"]
    assert session.post(f"{REGION}/resourcePolicies", json=body).status_code == 409  # pending
    zonal_done(session, operation)  # polled at regionOperations.get
    policy = session.get(f"{REGION}/resourcePolicies/grp-compact").json()
    assert (policy["status"], policy["groupPlacementPolicy"]) == (
        "READY",
        body["groupPlacementPolicy"],
    )
    assert error(session.post(f"{REGION}/resourcePolicies", json=body))[:3] == (
        409,
        409,
        "alreadyExists",
    )
    bad = {"name": "p2", "groupPlacementPolicy": {"collocation": "SPREAD"}}
    assert error(session.post(f"{REGION}/resourcePolicies", json=bad))[0] == 400
    link = "projects/hlf-test/regions/us-central1/resourcePolicies/grp-compact"
    got = created(session, gpu_vm("g0", resourcePolicies=[link]))
    assert got["resourcePolicies"] == [compute_api.LINK + link]
    code, _code, reason, message = error(session.delete(f"{REGION}/resourcePolicies/grp-compact"))
    assert (code, reason) == (400, "resourceInUseByAnotherResource")
    assert "projects/hlf-test/zones/us-central1-a/instances/g0" in message
    zonal_done(session, session.delete(f"{ZONE_A}/instances/g0").json())
    done = zonal_done(session, session.delete(f"{REGION}/resourcePolicies/grp-compact").json())
    assert done["operationType"] == "delete"
    assert session.get(f"{REGION}/resourcePolicies/grp-compact").status_code == 404
    assert session.get(f"{REGION}/operations/nope").status_code == 404


def test_preemption_is_a_system_operation_then_a_stop_or_a_delete(fake):
    server, session = fake
    spot = {"provisioningModel": "SPOT", "onHostMaintenance": "TERMINATE"}
    created(session, gpu_vm("s0", scheduling=spot))
    created(session, gpu_vm("s1", scheduling={**spot, "instanceTerminationAction": "DELETE"}))
    created(session, gpu_vm("g0"))
    target = {"project": "hlf-test", "zone": "us-central1-a"}
    status, answer = control(server, "POST", "preempt", {**target, "name": "g0"})
    assert (status, answer["error"]["code"]) == (400, 400)  # a standard VM is not preempted
    assert control(server, "POST", "preempt", {**target, "name": "nope"})[0] == 404
    assert usage(session)["PREEMPTIBLE_NVIDIA_L4_GPUS"] == 2.0

    status, answer = control(server, "POST", "preempt", {**target, "name": "s0"})
    assert status == 200 and answer["operation"].startswith("systemevent-")
    stopped = session.get(f"{ZONE_A}/instances/s0").json()
    assert stopped["status"] == "TERMINATED"
    assert "natIP" not in stopped["networkInterfaces"][0]["accessConfigs"][0]
    assert control(server, "POST", "preempt", {**target, "name": "s0"})[0] == 400  # not running
    listed = session.get(f"{ZONE_A}/operations", params={"filter": PREEMPTED}).json()
    assert listed["kind"] == "compute#operationList"
    [event] = listed["items"]
    assert (event["name"], event["status"], event["user"]) == (
        answer["operation"],
        "DONE",
        "system",
    )
    assert event["statusMessage"] == "Instance was preempted."
    assert event["targetLink"] == stopped["selfLink"]

    control(server, "POST", "preempt", {**target, "name": "s1"})
    assert session.get(f"{ZONE_A}/instances/s1").status_code == 404  # its action: DELETE
    s1 = f'targetLink = "{stopped["selfLink"][:-1]}1"'
    for expression in (f"({PREEMPTED}) ({s1})", f"({PREEMPTED}) AND ({s1})"):
        found = session.get(f"{ZONE_A}/operations", params={"filter": expression}).json()
        assert [op["targetLink"][-2:] for op in found["items"]] == ["s1"]
    assert usage(session)["PREEMPTIBLE_NVIDIA_L4_GPUS"] == 0.0
    everything = session.get(f"{ZONE_A}/operations").json()["items"]
    assert [op["operationType"] for op in everything] == [
        "insert",
        "insert",
        "insert",
        "compute.instances.preempted",
        "compute.instances.preempted",
    ]
    page = session.get(f"{ZONE_A}/operations", params={"maxResults": "2"}).json()
    assert len(page["items"]) == 2 and page["nextPageToken"]
    newest = session.get(f"{ZONE_A}/operations", params={"orderBy": "creationTimestamp desc"})
    assert newest.json()["items"][0]["targetLink"].endswith("/s1")
    assert error(session.get(f"{ZONE_A}/operations", params={"filter": "status > 1"}))[0] == 400


def test_a_backend_inserts_and_preempts_its_vms(boxed):
    server, session, backend = boxed
    zone_b = ZONE.replace("us-central1-a", "us-central1-b")
    spot = {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "onHostMaintenance": "TERMINATE",
    }
    body = gpu_vm("spot0", machineType="zones/us-central1-b/machineTypes/g2-standard-8")
    body["scheduling"] = spot
    backend.release.clear()  # the backend's insert takes its time
    operation = session.post(f"{zone_b}/instances", json=body).json()
    time.sleep(0.2)
    assert session.get(operation["selfLink"]).json()["status"] == "RUNNING"
    server.compute.configure({"capacity": {"us-central1-b": {"g2-standard-8": 1}}})
    full = session.post(f"{zone_b}/instances", json={**body, "name": "spot1"}).json()
    assert (
        polled_done(session, full)["error"]["errors"][0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    )
    backend.release.set()
    assert "error" not in polled_done(session, operation)
    [(verb, zone, given)] = [c for c in backend.calls if c[0] == "insert"]
    assert (verb, zone, given["machineType"]) == ("insert", "us-central1-b", "g2-standard-8")
    assert given["scheduling"] == {**spot, "preemptible": True, "automaticRestart": False}
    # The backend's VM, in its own zone.
    assert session.get(f"{zone_b}/instances/spot0").json()["status"] == "RUNNING"
    assert session.get(f"{ZONE}/instances/spot0").status_code == 404

    assert control(server, "POST", "preempt", {"zone": "us-central1-a", "name": "vm0"})[0] == 400
    status, answer = control(server, "POST", "preempt", {"zone": "us-central1-b", "name": "spot0"})
    assert status == 200
    assert backend.preempted.wait(5)
    assert backend.calls[-1] == ("preempt", "spot0")
    events = session.get(f"{zone_b}/operations", params={"filter": PREEMPTED}).json()["items"]
    assert [e["name"] for e in events] == [answer["operation"]]
    assert session.get(f"{zone_b}/instances/spot0").status_code == 404

    backend.fail = "insert"
    server.compute.configure({"capacity": {}})
    failed = polled_done(session, session.post(f"{zone_b}/instances", json=body).json())
    assert failed["error"]["errors"][0]["message"] == "RuntimeError: insert failed"
    assert compute_contract.validate_log(server.compute.history) == []
