"""The contract check (tests/compute_contract.py) against Google's Compute Engine v1
discovery document: what it accepts, and one test for each kind of violation it must catch."""

import compute_contract
import pytest

validate_request = compute_contract.validate_request
validate_response = compute_contract.validate_response
validate_log = compute_contract.validate_log

API = "https://compute.googleapis.com/compute/v1/projects/hlf-test"
LINK = "https://www.googleapis.com/compute/v1/projects/hlf-test"
RULE = {
    "kind": "compute#firewall",
    "name": "llamafactory-nodes",
    "network": "global/networks/default",
    "direction": "INGRESS",
    "priority": 1000,
    "allowed": [{"IPProtocol": "tcp", "ports": ["0-65535"]}, {"IPProtocol": "icmp"}],
    "sourceRanges": ["10.128.0.5/32"],
    "logConfig": {"enable": False},
}
STORED = {
    **RULE,
    "id": "1764612345000",
    "creationTimestamp": "2026-12-01T18:00:00.000+00:00",
    "network": f"{LINK}/global/networks/default",
    "selfLink": f"{LINK}/global/firewalls/llamafactory-nodes",
}
OPERATION = {
    "kind": "compute#operation",
    "id": "1764612345001",
    "name": "operation-1764612345001-abcd",
    "operationType": "insert",
    "targetLink": STORED["selfLink"],
    "targetId": STORED["id"],
    "status": "RUNNING",
    "progress": 50,
    "insertTime": "2026-12-01T18:00:00.000+00:00",
    "selfLink": f"{LINK}/global/operations/operation-1764612345001-abcd",
}
NOT_FOUND = {
    "error": {
        "code": 404,
        "message": "The resource 'projects/hlf-test/global/firewalls/x' was not found",
        "errors": [{"message": "...", "domain": "global", "reason": "notFound"}],
    }
}


def entry(method, path, status, response, query=None, body=None, host="compute.googleapis.com"):
    """One entry of the fake's log."""
    return {
        "method": method,
        "host": host,
        "path": path,
        "query": query or {},
        "body": body,
        "status": status,
        "response": response,
    }


# -- what the contract allows ------------------------------------------------------------------


@pytest.mark.parametrize("root", ["https://compute.googleapis.com", "https://www.googleapis.com"])
def test_the_roles_requests_are_methods_of_the_document(root):
    base = f"{root}/compute/v1/projects/hlf-test/global"
    assert validate_request("POST", f"{base}/firewalls", {}, RULE) == []
    patch = {"name": "r1", "sourceRanges": None}  # a null removes a field
    assert validate_request("PATCH", f"{base}/firewalls/r1", {}, patch) == []
    assert validate_request("DELETE", f"{base}/firewalls/r1", {"requestId": ["a-b"]}) == []
    query = {"filter": ['(name = "a") OR (name = "b")'], "alt": ["json"], "prettyPrint": ["false"]}
    assert validate_request("GET", f"{base}/firewalls", query) == []
    assert (
        validate_request("GET", f"{base}/operations/operation-1-ab", {"fields": ["status"]}) == []
    )
    aggregated = f"{root}/compute/v1/projects/hlf-test/aggregated/instances"
    paged = {"filter": ["labels.x = y"], "maxResults": ["500"], "pageToken": ["abc"]}
    assert validate_request("GET", aggregated, paged) == []


def test_the_apis_answers_are_valid():
    assert validate_response("compute.firewalls.get", 200, STORED) == []
    assert validate_response("compute.firewalls.insert", 200, OPERATION) == []
    listed = {"kind": "compute#firewallList", "items": [STORED], "selfLink": "x"}
    assert validate_response("compute.firewalls.list", 200, listed) == []
    assert validate_response("compute.firewalls.get", 404, NOT_FOUND) == []
    unauthenticated = {
        "error": {
            "code": 401,
            "message": "Request had invalid authentication credentials.",
            "errors": [{"message": "Invalid Credentials", "reason": "authError"}],
            "status": "UNAUTHENTICATED",
        }
    }
    assert validate_response("compute.firewalls.list", 401, unauthenticated) == []


def test_maps_and_nested_refs_are_followed():
    instance = {
        "kind": "compute#instance",
        "id": "17",
        "name": "trainer-0",
        "status": "RUNNING",
        "labels": {"llamafactory": "training"},
        "networkInterfaces": [
            {"networkIP": "10.128.0.2", "accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}
        ],
    }
    scope = "zones/us-central1-a"
    answer = {"kind": "compute#instanceAggregatedList", "items": {scope: {"instances": [instance]}}}
    assert validate_response("compute.instances.aggregatedList", 200, answer) == []
    instance["labels"] = {"llamafactory": 1}
    instance["networkInterfaces"][0]["accessConfigs"][0]["type"] = "NAT"
    assert validate_response("compute.instances.aggregatedList", 200, answer) == [
        "compute.instances.aggregatedList: response "
        '$.items["zones/us-central1-a"].instances[0].labels["llamafactory"]: '
        "expected a string, got integer 1",
        "compute.instances.aggregatedList: response "
        '$.items["zones/us-central1-a"].instances[0].networkInterfaces[0].accessConfigs[0].type: '
        "'NAT' is not one of DIRECT_IPV6, ONE_TO_ONE_NAT",
    ]


def test_a_path_parameter_may_span_segments():
    # {+parentName} in reservationSlots.get: "reservations/R/reservationBlocks/B/..."
    parent = "reservations/r/reservationBlocks/b/reservationSubBlocks/s"
    url = f"{API}/zones/us-central1-a/{parent}/reservationSlots/slot-1"
    method, params = compute_contract.contract().match("GET", url)
    assert method.id == "compute.reservationSlots.get"
    assert params["parentName"] == parent
    assert validate_request("GET", url) == []


# -- one test per kind of violation --------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "url", "why"),
    [
        ("GET", f"{API}/global/firewallz", "no method of the document has this path"),
        ("GET", f"{API}/global/firewalls/r1/extra", "no method of the document has this path"),
        ("POST", f"{API}/global/firewalls/r1", "no POST method on this path (only DELETE"),
        (
            "GET",
            "https://example.com/compute/v1/projects/hlf-test/global/firewalls",
            "not under https://compute.googleapis.com/compute/v1/",
        ),
        ("GET", "https://compute.googleapis.com/compute/beta/projects/p/global/firewalls", "not"),
    ],
)
def test_unknown_method_or_path(method, url, why):
    problems = validate_request(method, url)
    assert len(problems) == 1
    assert problems[0].startswith(f"{method} {url}: unknown method: {why}")


def test_bad_path_parameter():
    problems = validate_request("GET", f"{API}/global/firewalls/Bad_Name")
    assert problems == [
        "compute.firewalls.get: path parameter firewall: 'Bad_Name' does not match "
        "[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?|[1-9][0-9]{0,19}"
    ]
    bad_project = "https://compute.googleapis.com/compute/v1/projects/My%20Project/global/firewalls"
    (problem,) = validate_request("GET", bad_project)
    assert problem.startswith("compute.firewalls.list: path parameter project: 'My Project'")


def test_unknown_query_parameter():
    problems = validate_request("GET", f"{API}/global/firewalls/r1", {"filter": ["name = x"]})
    assert problems == ["compute.firewalls.get: query parameter filter: unknown to the method"]
    problems = validate_request("GET", f"{API}/global/firewalls?limit=5&maxResults=5")
    assert problems == ["compute.firewalls.list: query parameter limit: unknown to the method"]


def test_query_parameter_of_wrong_type_or_repeated():
    url = f"{API}/aggregated/instances"
    assert validate_request("GET", url, {"maxResults": ["ten"], "includeAllScopes": ["1"]}) == [
        "compute.instances.aggregatedList: query parameter includeAllScopes: "
        "expected true or false, got '1'",
        "compute.instances.aggregatedList: query parameter maxResults: "
        "expected an integer, got 'ten'",
    ]
    assert validate_request("GET", url, {"maxResults": ["-1"]}) == [
        "compute.instances.aggregatedList: query parameter maxResults: "
        "-1 is out of the uint32 range",
        "compute.instances.aggregatedList: query parameter maxResults: -1 is beyond its minimum 0",
    ]
    assert validate_request("GET", url, {"filter": ["a = b", "c = d"]}) == [
        "compute.instances.aggregatedList: query parameter filter: given 2 times, not repeated"
    ]


def test_wrong_type():
    body = {**RULE, "priority": "1000", "disabled": "no", "sourceRanges": "10.0.0.0/8"}
    assert validate_request("POST", f"{API}/global/firewalls", {}, body) == [
        "compute.firewalls.insert: request $.priority: "
        'expected an integer (int32), got string "1000"',
        "compute.firewalls.insert: request $.sourceRanges: "
        'expected an array, got string "10.0.0.0/8"',
        'compute.firewalls.insert: request $.disabled: expected a boolean, got string "no"',
    ]
    answer = {**OPERATION, "progress": 50.5, "warnings": {"code": "x"}}
    assert validate_response("compute.globalOperations.get", 200, answer) == [
        "compute.globalOperations.get: response $.progress: expected an integer (int32), "
        "got number 50.5",
        "compute.globalOperations.get: response $.warnings: "
        'expected an array, got object {"code": "x"}',
    ]


def test_bad_enum():
    body = {**RULE, "direction": "INBOUND"}
    assert validate_request("POST", f"{API}/global/firewalls", {}, body) == [
        "compute.firewalls.insert: request $.direction: 'INBOUND' is not one of EGRESS, INGRESS"
    ]
    assert validate_response(
        "compute.globalOperations.get", 200, {**OPERATION, "status": "OK"}
    ) == [
        "compute.globalOperations.get: response $.status: 'OK' is not one of DONE, PENDING, RUNNING"
    ]


def test_unknown_property():
    body = {**RULE, "sourceRange": ["10.0.0.0/8"]}
    assert validate_request("POST", f"{API}/global/firewalls", {}, body) == [
        "compute.firewalls.insert: request $.sourceRange: unknown property"
    ]
    answer = {**STORED, "owner": "hostnet", "logConfig": {"enable": True, "sampling": 1.0}}
    assert validate_response("compute.firewalls.get", 200, answer) == [
        "compute.firewalls.get: response $.logConfig.sampling: unknown property",
        "compute.firewalls.get: response $.owner: unknown property",
    ]


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (1764612345000, "expected a string (uint64), got integer 1764612345000"),
        ("17x", "expected a decimal uint64 string, got '17x'"),
        ("-5", "-5 is out of the uint64 range"),
        (str(2**64), f"{2**64} is out of the uint64 range"),
    ],
)
def test_bad_int64_format(value, why):
    assert validate_response("compute.firewalls.get", 200, {**STORED, "id": value}) == [
        f"compute.firewalls.get: response $.id: {why}"
    ]


def test_kind_is_the_schemas():
    answer = {**OPERATION, "kind": "compute#firewall"}
    assert validate_response("compute.firewalls.insert", 200, answer) == [
        "compute.firewalls.insert: response $.kind: 'compute#firewall', not compute#operation"
    ]


def test_null_and_empty_lists_are_not_in_answers():
    answer = {**STORED, "description": None, "targetTags": []}
    assert validate_response("compute.firewalls.get", 200, answer) == [
        "compute.firewalls.get: response $.description: null (the API leaves unset fields out)",
        "compute.firewalls.get: response $.targetTags: "
        "an empty list (the API leaves empty lists out)",
    ]


def test_property_the_method_requires():
    # Firewall.name is annotated as required by compute.firewalls.insert and .patch only.
    url = f"{API}/global/firewalls"
    assert validate_request("PATCH", f"{url}/r1", {}, {"priority": 5}) == [
        "compute.firewalls.patch: request $.name: required by the method"
    ]
    assert validate_request("POST", url, {}, {**RULE, "name": None}) == [
        "compute.firewalls.insert: request $.name: required by the method"
    ]
    assert validate_request("PUT", f"{url}/r1", {}, {"priority": 5}) == []  # update: not annotated


def test_body_where_the_method_takes_none_or_needs_one():
    assert validate_request("DELETE", f"{API}/global/firewalls/r1", {}, {"name": "r1"}) == [
        "compute.firewalls.delete: request $: the method takes no body"
    ]
    assert validate_request("POST", f"{API}/global/firewalls", {}, None) == [
        "compute.firewalls.insert: request $: a Firewall body is required"
    ]
    assert validate_request("POST", f"{API}/global/firewalls", {}, "{not json") == [
        "compute.firewalls.insert: request $: not JSON"
    ]


def test_errors_must_have_googles_shape():
    assert validate_response("compute.firewalls.get", 404, {"message": "not found"}) == [
        "compute.firewalls.get: response $.message: unknown property",
        "compute.firewalls.get: response $.error: missing from an HTTP 404",
    ]
    wrong = {"error": {"code": 400, "message": "x", "status": "NOT_FOUND", "errors": [{"why": 1}]}}
    assert validate_response("compute.firewalls.get", 404, wrong) == [
        "compute.firewalls.get: response $.error.errors[0].why: unknown property",
        "compute.firewalls.get: response $.error.code: 400, not the HTTP status 404",
    ]
    assert validate_response("compute.firewalls.get", 403, {"error": {"code": 403}}) == [
        "compute.firewalls.get: response $.error.message: missing"
    ]


# -- the fake's log ------------------------------------------------------------------------------


def test_log_of_valid_exchanges():
    entries = [
        entry("POST", "/compute/v1/projects/hlf-test/global/firewalls", 200, OPERATION, body=RULE),
        entry("GET", "/compute/v1/projects/hlf-test/global/firewalls/x", 404, NOT_FOUND),
        {"method": "CONNECT", "host": "example.com:443", "path": "x", "refused": True},
    ]
    assert validate_log(entries) == []


def test_log_a_request_out_of_contract_must_have_been_refused():
    path = "/compute/v1/projects/hlf-test/global/firewalls"
    bad = {**RULE, "name": "Bad_Name"}
    refused = {**NOT_FOUND, "error": {**NOT_FOUND["error"], "code": 400}}
    assert validate_log([entry("POST", path, 400, refused, body=bad)]) == []
    (problem,) = validate_log([entry("POST", path, 200, OPERATION, body=bad)])
    assert problem == (
        f"request 0 (POST {path} -> 200): compute.firewalls.insert: request $.name: "
        "'Bad_Name' does not match [a-z](?:[-a-z0-9]{0,61}[a-z0-9])? (yet the fake answered 200)"
    )
    (problem,) = validate_log([entry("PUT", f"{path}/r1/move", 200, OPERATION)])
    assert "unknown method: no method of the document has this path" in problem


def test_log_answers_are_checked_against_the_method():
    path = "/compute/v1/projects/hlf-test/global/operations/operation-1"
    answer = {**OPERATION, "done": True}
    assert validate_log([entry("GET", path, 200, answer, host="www.googleapis.com")]) == [
        f"request 0 (GET {path} -> 200): compute.globalOperations.get: response $.done: "
        "unknown property"
    ]
    html = "<html>Not Found</html>"
    (first, *_rest) = validate_log([entry("GET", f"{path}/x", 404, html)])
    assert first.startswith(f"request 0 (GET {path}/x -> 404): unknown method: response $:")
