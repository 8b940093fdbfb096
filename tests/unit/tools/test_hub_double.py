"""The box's Hub double (tools/localcluster/hub_double.py) against the contract huggingface_hub
relies on through HF_ENDPOINT: the revision and tree APIs, resolve with its headers and Range,
the Hub's errors, the counted requests and the shared rate. The real client against it: the
cluster tests (test_launch.py, test_hub_fetch.py)."""

import hashlib
import json
import time
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import pytest
from localcluster.hub_double import HubDouble, git_sha1

WEIGHTS = bytes(range(256)) * 4096  # 1 MiB


@pytest.fixture
def hub():
    double = HubDouble().start()
    double.add_repo("org/tiny", {"config.json": b'{"a": 1}', "model.safetensors": WEIGHTS})
    double.add_repo("org/gated", {"config.json": b"{}"}, gated=True, granted={"hf_granted"})
    double.tokens.update({"hf_granted", "hf_other"})
    yield double
    double.stop()


def get(hub, path, method="GET", token=None, headers=None):
    headers = dict(headers or {})
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with urlopen(Request(hub.url + path, method=method, headers=headers)) as answer:  # noqa: S310
            return answer.status, dict(answer.headers), answer.read()
    except HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_the_revision_api_gives_the_commit_and_the_files(hub):
    status, _headers, body = get(hub, "/api/models/org/tiny/revision/main?blobs=true")
    info = json.loads(body)
    assert status == 200 and info["sha"] == hub.repo("org/tiny").commit
    siblings = {s["rfilename"]: s for s in info["siblings"]}
    assert siblings["model.safetensors"]["lfs"]["sha256"] == hashlib.sha256(WEIGHTS).hexdigest()
    assert siblings["config.json"]["blobId"] == git_sha1(b'{"a": 1}')
    assert "lfs" not in siblings["config.json"]
    tree = json.loads(get(hub, f"/api/models/org/tiny/tree/{info['sha']}?recursive=True")[2])
    assert {t["path"] for t in tree} == {"config.json", "model.safetensors"}


def test_resolve_carries_the_commit_etag_and_ranges(hub):
    commit = hub.repo("org/tiny").commit
    status, headers, _body = get(hub, "/org/tiny/resolve/main/model.safetensors", method="HEAD")
    sha = hashlib.sha256(WEIGHTS).hexdigest()
    assert status == 200 and headers["X-Repo-Commit"] == commit
    assert headers["ETag"] == f'"{sha}"' and headers["X-Linked-Etag"] == f'"{sha}"'
    assert headers["X-Linked-Size"] == str(len(WEIGHTS)) == headers["Content-Length"]
    status, headers, body = get(
        hub, f"/org/tiny/resolve/{commit}/model.safetensors", headers={"Range": "bytes=1000-"}
    )
    assert status == 206 and body == WEIGHTS[1000:]
    assert headers["Content-Range"] == f"bytes 1000-{len(WEIGHTS) - 1}/{len(WEIGHTS)}"
    status, headers, _body = get(hub, "/org/tiny/resolve/main/config.json", method="HEAD")
    config_etag = git_sha1(b'{"a": 1}')
    assert headers["ETag"] == f'"{config_etag}"' and "X-Linked-Etag" not in headers


@pytest.mark.parametrize(
    "path, token, status, code",
    [
        ("/api/models/org/none/revision/main", None, 401, "RepoNotFound"),
        ("/api/models/org/none/revision/main", "hf_other", 404, "RepoNotFound"),
        ("/api/models/org/tiny/revision/v9", None, 404, "RevisionNotFound"),
        ("/org/tiny/resolve/main/nothing.json", None, 404, "EntryNotFound"),
        ("/org/gated/resolve/main/config.json", None, 401, "GatedRepo"),
        ("/org/gated/resolve/main/config.json", "hf_other", 403, "GatedRepo"),
        ("/api/models/org/tiny/revision/main", "hf_unknown", 401, None),
    ],
)
def test_errors_are_the_hubs(hub, path, token, status, code):
    got, headers, _body = get(hub, path, token=token)
    assert got == status
    assert headers.get("X-Error-Code") == code
    if code is None:
        assert headers["X-Error-Message"] == "Invalid credentials in Authorization header"


def test_a_gated_repository_opens_to_a_granted_token(hub):
    assert get(hub, "/api/models/org/gated/revision/main")[0] == 200  # its card is public
    assert get(hub, "/org/gated/resolve/main/config.json", token="hf_granted")[0] == 200  # noqa: S106


def test_requests_are_counted(hub):
    get(hub, "/org/tiny/resolve/main/model.safetensors")
    get(hub, "/org/tiny/resolve/main/config.json", method="HEAD")
    assert [(r.method, r.status) for r in hub.requests] == [("GET", 200), ("HEAD", 200)]
    assert len(hub.downloads("org/tiny")) == 1 and hub.sent() == len(WEIGHTS)
    hub.reset()
    assert hub.requests == []


def test_the_rate_is_shared_by_every_connection():
    double = HubDouble(rate=4 * len(WEIGHTS)).start()  # 4 MiB/s
    try:
        double.add_repo("org/tiny", {"model.safetensors": WEIGHTS})
        started = time.monotonic()
        get(double, "/org/tiny/resolve/main/model.safetensors")
        get(double, "/org/tiny/resolve/main/model.safetensors")
        assert 0.4 < time.monotonic() - started < 2
    finally:
        double.stop()
