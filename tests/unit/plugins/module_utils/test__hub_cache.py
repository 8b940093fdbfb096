"""The Hub repository in a node's cache and its copy node to node (module_utils/_hub_cache.py),
on loopback: a folder in huggingface_hub's layout served by serve() and copied by pull()."""

import hashlib
import json
import os
import threading
import time

import pytest
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _hub_cache as hub
from loopback import free_port

COMMIT = "c" * 40
REPO = {
    "key": "model_name_or_path",
    "repo_id": "org/tiny",
    "repo_type": "model",
    "revision": "main",
}


def git_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324


def make_repo(cache, files=None, revision="main"):
    """A downloaded repository as hub_download.py leaves it (blobs named by their ETag, links,
    ref, tree listing, manifest); its folder."""
    files = files or {"config.json": b'{"a": 1}', "model.safetensors": os.urandom(300_000)}
    folder = cache / hub.repo_folder("org/tiny")
    entries, links = [], []
    for name, data in sorted(files.items()):
        etag = hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else git_sha1(data)
        (folder / "blobs").mkdir(parents=True, exist_ok=True)
        (folder / "blobs" / etag).write_bytes(data)
        link = folder / "snapshots" / COMMIT / name
        link.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(folder / "blobs" / etag, link.parent)
        link.symlink_to(target)
        entries.append(
            {"path": f"blobs/{etag}", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        )
        links.append({"path": f"snapshots/{COMMIT}/{name}", "target": target})
    (folder / "refs").mkdir()
    (folder / "refs" / revision).write_text(COMMIT)
    manifest = {"revision": revision, "commit": COMMIT, "files": entries, "links": links}
    manifest["bytes"] = sum(e["size"] for e in entries)
    hub.write_json(str(folder / hub.manifest_name(revision)), manifest)
    return folder


def test_the_folder_is_huggingface_hubs():
    assert hub.repo_folder("meta-llama/Meta-Llama-3-8B") == "models--meta-llama--Meta-Llama-3-8B"
    assert hub.repo_folder("org/data", "dataset") == "datasets--org--data"
    assert hub.manifest_name("refs/pr/1") == "hostnet/refs%2Fpr%2F1.json"


def test_a_complete_repository_is_found_and_a_partial_one_is_not(tmp_path):
    folder = make_repo(tmp_path)
    found = hub.look(str(tmp_path), [REPO])["model_name_or_path"]
    assert found["complete"] and found["commit"] == COMMIT and found["bytes"] > 300_000
    blob = next((folder / "blobs").iterdir())
    blob.write_bytes(b"short")  # a file cut short
    assert not hub.look(str(tmp_path), [REPO])["model_name_or_path"]["complete"]
    (folder / "refs" / "main").write_text("d" * 40)  # the ref moved
    assert "refs/main" in hub.complete(str(folder), "main")[1]
    assert (
        hub.look(str(tmp_path / "none"), [REPO])["model_name_or_path"]["why"] == "not in the cache"
    )


def test_a_blob_is_checked_against_its_name():
    data = b"hello"
    sha256, sha1 = hashlib.sha256(data).hexdigest(), git_sha1(data)
    assert hub.blob_matches_name(sha256, sha256, sha1)
    assert hub.blob_matches_name(sha1, sha256, sha1)
    assert not hub.blob_matches_name("0" * 64, sha256, sha1)
    assert not hub.blob_matches_name("0" * 40, sha256, sha1)
    assert hub.blob_matches_name("a-mirror-etag", sha256, sha1)


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "blobs/../../x", ""])
def test_unsafe_paths_are_refused(path):
    with pytest.raises(hub.HubCacheError):
        hub._safe(path)


@pytest.fixture
def served(tmp_path):
    """rank 0's folder served on a loopback port: (folder, url, state path)."""
    source = make_repo(tmp_path / "rank0")
    port = free_port()
    state = tmp_path / "serve.json"
    thread = threading.Thread(
        target=hub.serve, args=({str(source): "main"}, "127.0.0.1", port, str(state), 20, 3)
    )
    thread.daemon = True
    thread.start()
    for _attempt in range(50):
        if (hub.read_json(str(state)) or {}).get("state") == "serving":
            break
        time.sleep(0.1)
    return source, f"http://127.0.0.1:{port}/{source.name}", state


def test_a_copy_is_the_same_repository_checked_and_resumed(served, tmp_path):
    source, url, _state = served
    folder = tmp_path / "rank1" / hub.repo_folder("org/tiny")
    big = max((source / "blobs").iterdir(), key=lambda p: p.stat().st_size)
    (folder / "blobs").mkdir(parents=True)
    (folder / "blobs" / (big.name + ".incomplete")).write_bytes(big.read_bytes()[:1000])
    state_path = tmp_path / "pull.json"
    hub.pull(url, str(folder), "main", str(state_path))
    state = json.loads(state_path.read_text())
    assert state["state"] == "done", state
    assert (
        state["received"]
        == state["total"]
        == sum(p.stat().st_size for p in (source / "blobs").iterdir())
    )
    assert hub.complete(str(folder), "main")[0]
    for link in (source / "snapshots" / COMMIT).iterdir():
        copy = folder / "snapshots" / COMMIT / link.name
        assert os.readlink(copy) == os.readlink(link)
        assert copy.read_bytes() == link.read_bytes()
    # Again: nothing fetched, every file checked.
    hub.pull(url, str(folder), "main", str(state_path))
    assert json.loads(state_path.read_text())["fetched"] == 0


def test_a_damaged_file_is_refused_and_removed(served, tmp_path):
    source, _url, _state = served
    manifest_path = source / hub.manifest_name("main")
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][0]["sha256"] = "0" * 64  # rank 0's checksum differs from what arrives
    hub.write_json(str(manifest_path), manifest)
    # A new server reads the changed manifest.
    port = free_port()
    state = tmp_path / "serve2.json"
    threading.Thread(
        target=hub.serve,
        args=({str(source): "main"}, "127.0.0.1", port, str(state), 20, 3),
        daemon=True,
    ).start()
    time.sleep(0.5)
    folder = tmp_path / "rank1" / hub.repo_folder("org/tiny")
    source_url = f"http://127.0.0.1:{port}/{source.name}"
    hub.pull(source_url, str(folder), "main", str(tmp_path / "pull.json"))
    result = json.loads((tmp_path / "pull.json").read_text())
    assert result["state"] == "failed" and result["kind"] == "copy"
    assert "arrived damaged" in result["error"]
    assert not list((folder / "blobs").glob("*.incomplete"))
    assert not hub.complete(str(folder), "main")[0]


def test_the_server_serves_only_listed_files_and_a_dead_source_is_named(served, tmp_path):
    _source, url, _state = served
    from urllib.error import HTTPError
    from urllib.request import urlopen

    for path in ("/file/refs/main", "/../manifest"):
        with pytest.raises(HTTPError) as refused:
            urlopen(url + path)  # noqa: S310
        assert refused.value.code == 404
    state_path = tmp_path / "pull.json"
    hub.pull(f"http://127.0.0.1:{free_port()}", str(tmp_path / "x"), "main", str(state_path))
    state = json.loads(state_path.read_text())
    assert state["state"] == "failed" and state["kind"] == "source"


def test_the_server_stops_when_idle(tmp_path):
    source = make_repo(tmp_path / "rank0")
    state = tmp_path / "serve.json"
    started = time.monotonic()
    hub.serve({str(source): "main"}, "127.0.0.1", free_port(), str(state), 30, idle=1)
    assert time.monotonic() - started < 5
    assert json.loads(state.read_text())["state"] == "ended"


def test_nothing_to_serve_is_a_failure(tmp_path):
    state = tmp_path / "serve.json"
    hub.serve({str(tmp_path / "empty"): "main"}, "127.0.0.1", free_port(), str(state), 5)
    assert json.loads(state.read_text())["state"] == "failed"
