"""module_utils/_gce_request.py: a Compute Engine request sent again on a connection error (the
gce_instance and gce_instances modules), with GcpSession's token and headers; each write with a
requestId of its own, which Compute Engine uses to ignore a repeat (the fake's side:
test_compute_api's request-id test)."""

import types
import uuid

import pytest
import requests
from ansible_collections.hostnet.llamafactory.plugins.module_utils import (
    _gce_request as gce_request,
)
from ansible_collections.hostnet.llamafactory.plugins.modules import gce_instance, gce_instances


class Refused(Exception):
    pass


def refuse(msg):
    raise Refused(msg)


def flaky(sent):
    """A GcpSession whose every other request meets the proxy dropping its connection."""

    class Session:
        def request(self, method, url, params=None, json=None, headers=None):
            sent.append((method, url, params, json, headers))
            if len(sent) % 2:
                raise requests.exceptions.ProxyError("the proxy dropped the connection")
            return "answer"

    return types.SimpleNamespace(session=Session, _set_headers=lambda _headers: {"h": "1"})


def test_a_request_dropped_on_the_way_is_sent_again_and_a_write_keeps_its_request_id():
    sent, pauses = [], []
    session = flaky(sent)
    answer = gce_request.send(
        session, refuse, "POST", "https://c/instances", body={"name": "a"}, sleep=pauses.append
    )
    assert answer == "answer" and pauses == [1]
    assert sent[0] == sent[1] and uuid.UUID(sent[0][2]["requestId"])
    assert sent[0][3:] == ({"name": "a"}, {"h": "1"})  # the body, GcpSession's headers
    assert gce_request.send(session, refuse, "GET", "https://c/a", {"x": "1"}, sleep=id) == "answer"
    assert sent[2][2] == {"x": "1"}  # a read has no requestId
    assert gce_request.send(session, refuse, "DELETE", "https://c/a", sleep=id) == "answer"
    assert sent[4][2]["requestId"] != sent[0][2]["requestId"]  # one ID per request


def test_a_connection_that_stays_down_is_named_after_the_last_try():
    class Down:
        def request(self, *_args, **_kwargs):
            raise requests.exceptions.ConnectionError("refused")

    session = types.SimpleNamespace(session=Down, _set_headers=lambda _headers: {})
    pauses = []
    with pytest.raises(Refused, match="POST https://c/instances failed 5 times: ConnectionError"):
        gce_request.send(
            session, refuse, "POST", "https://c/instances", body={}, sleep=pauses.append
        )
    assert pauses == [1, 2, 4, 8]


@pytest.mark.parametrize("module", [gce_instance, gce_instances])
def test_both_modules_send_through_it(module, monkeypatch):
    """A stop's or delete's request (gce_instance) and a group's (gce_instances) survive a
    dropped connection; gce_instance names the instance when it gives up."""
    sent = []
    monkeypatch.setattr(gce_request.time, "sleep", lambda _s: None)
    if module is gce_instance:
        client = gce_instance.Instance.__new__(gce_instance.Instance)
        client.project, client.zone, client.name = "p", "us-central1-a", "vm0"
    else:
        client = gce_instances.Group.__new__(gce_instances.Group)
    client.session = flaky(sent)
    client.module = types.SimpleNamespace(fail_json=lambda msg, **_extra: refuse(msg))
    assert client.send("DELETE", "https://c/instances/vm0") == "answer"
    assert len(sent) == 2 and sent[0][2] == sent[1][2]

    class TimesOut:
        def request(self, *_args, **_kwargs):
            raise requests.exceptions.Timeout()

    client.session = types.SimpleNamespace(session=TimesOut, _set_headers=lambda _headers: {})
    where = "p/us-central1-a/vm0: " if module is gce_instance else ""
    with pytest.raises(Refused, match=f"^{where}GET https://c/a failed 5 times: Timeout$"):
        client.send("GET", "https://c/a")


def test_a_vms_delete_and_its_operation_survive_dropped_connections(monkeypatch):
    """gce_instance's delete (when_done: delete) and the read of its operation: each request
    dropped once on the way, then answered."""
    monkeypatch.setattr(gce_request.time, "sleep", lambda _s: None)
    sent = []

    class Session:
        def request(self, method, url, params=None, json=None, headers=None):
            sent.append((method, url))
            if len(sent) % 2:
                raise requests.exceptions.ProxyError("dropped")
            status = "RUNNING" if len(sent) == 2 else "DONE"
            body = {"name": "op-1", "status": status, "selfLink": "https://c/operations/op-1"}
            return types.SimpleNamespace(status_code=200, json=lambda: body, text="")

    client = gce_instance.Instance.__new__(gce_instance.Instance)
    client.project, client.zone, client.name = "p", "us-central1-a", "vm0"
    client.deadline_s, client.poll = 60, 0
    client.session = types.SimpleNamespace(session=Session, _set_headers=lambda _headers: {})
    client.module = types.SimpleNamespace(fail_json=lambda msg, **_extra: refuse(msg))
    assert client.call("delete") == []
    assert [method for method, _url in sent] == ["DELETE", "DELETE", "GET", "GET"]
    assert sent[2][1] == "https://c/operations/op-1"
