# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Download one Hugging Face Hub repository into the node's cache, once, with the image's own
huggingface_hub (run by hostnet.llamafactory.hub_cache in a container of the job's image).

    python3 hub_download.py ARGS.json

ARGS.json: repo_id, repo_type, revision, cache (HF_HUB_CACHE in the container), state (where
the progress and the result are written, JSON), seconds (the deadline). The token is read by
huggingface_hub from HF_TOKEN_PATH (a 0600 file), the endpoint from HF_ENDPOINT. Only the files
LLaMA-Factory loads are fetched (select()); snapshot_download resumes a file that a run left
half-done. Every blob is checked against its name (the Hub's ETag: SHA-256 of an LFS file, git
SHA-1 of another), then the manifest (hostnet/REVISION.json) is written: the other nodes copy
what it lists.
"""

import contextlib
import fnmatch
import hashlib
import json
import os
import sys
import threading
import time

# Weights and exports LLaMA-Factory (transformers) never loads: a Llama-3 repository's original/
# checkpoint alone is 16 GB.
SKIPPED = (
    ".gitattributes",
    "original/*",
    "*.pth",
    "*.gguf",
    "*.onnx",
    "*.onnx_data",
    "*.msgpack",
    "*.h5",
    "*.ot",
    "*.tflite",
    "*.mlmodel",
    "onnx/*",
    "openvino/*",
    "coreml/*",
)
MANIFEST_DIR = "hostnet"
CHUNK = 1 << 20


def select(names):
    """The repository's files LLaMA-Factory needs: all but SKIPPED, and without the PyTorch
    .bin weights when the same model is there as safetensors (transformers prefers them)."""
    kept = [n for n in names if not any(fnmatch.fnmatch(n, p) for p in SKIPPED)]
    top = [n for n in kept if "/" not in n]
    if any(n.endswith(".safetensors") for n in top):
        kept = [
            n
            for n in kept
            if not (
                "/" not in n
                and (n.endswith(".bin") or n.endswith(".bin.index.json"))
                and n.startswith("pytorch_model")
            )
        ]
    return sorted(kept)


def classify(exc):
    """(kind, message) of a download error, by huggingface_hub's exception classes' names
    (not imported: this stays importable without it)."""
    names = [cls.__name__ for cls in type(exc).__mro__]
    text = str(exc).strip().splitlines()
    first = " ".join(line for line in text[:4] if line)[:600]
    if "GatedRepoError" in names:
        return "gated", first
    if "RevisionNotFoundError" in names:
        return "revision", first
    if "RepositoryNotFoundError" in names:
        return "not-found", first
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if status in (401, 403):
        return "token", first
    if "LocalEntryNotFoundError" in names or any(
        n in names for n in ("ConnectError", "TimeoutException", "ConnectionError", "OSError")
    ):
        if "No space left" in first:
            return "disk", first
        return "unreachable", first
    return "failed", f"{type(exc).__name__}: {first}"


def blob_ok(path, name):
    sha256, sha1 = hashlib.sha256(), hashlib.sha1()  # noqa: S324 - git's object id
    sha1.update(f"blob {os.path.getsize(path)}\0".encode("ascii"))
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            sha256.update(block)
            sha1.update(block)
    digest = sha256.hexdigest()
    if len(name) == 64:
        return digest == name, digest
    if len(name) == 40:
        return sha1.hexdigest() == name, digest
    return True, digest


def write_json(path, data):
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
    os.replace(temporary, path)


def folder_bytes(folder):
    total = 0
    for root, _dirs, names in os.walk(os.path.join(folder, "blobs")):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, name))
    return total


def manifest(folder, revision, commit, hashes):
    snapshot = os.path.join(folder, "snapshots", commit)
    links, files = [], []
    for root, dirs, names in os.walk(snapshot):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            relative = os.path.relpath(path, folder)
            target = os.readlink(path)
            blob = os.path.normpath(os.path.join(os.path.dirname(relative), target))
            links.append({"path": relative, "target": target})
            files.append({"path": blob, "size": os.path.getsize(path), "sha256": hashes[blob]})
    tree = os.path.join(folder, "trees", commit + ".json")
    if os.path.isfile(tree):
        digest = blob_ok(tree, "")[1]
        files.append(
            {"path": f"trees/{commit}.json", "size": os.path.getsize(tree), "sha256": digest}
        )
    # A link to the snapshot the ranks can be pointed at without the commit (a Hub dataset's
    # entry in the nodes' dataset_info.json).
    link = os.path.join(folder, MANIFEST_DIR, revision.replace("/", "%2F") + ".snapshot")
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.lexists(link):
        os.remove(link)
    os.symlink("../snapshots/" + commit, link)
    links.append({"path": os.path.relpath(link, folder), "target": "../snapshots/" + commit})
    unique = dict((f["path"], f) for f in files)
    return {
        "revision": revision,
        "commit": commit,
        "files": [unique[k] for k in sorted(unique)],
        "links": links,
        "bytes": sum(f["size"] for f in unique.values()),
    }


def download(args, state):
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.file_download import repo_folder_name

    repo_id, repo_type, revision = (
        args["repo_id"],
        args.get("repo_type") or "model",
        args["revision"],
    )
    cache = args["cache"]
    api = HfApi()
    info = api.repo_info(repo_id, repo_type=repo_type, revision=revision, files_metadata=True)
    sizes = dict((s.rfilename, s.size or 0) for s in info.siblings or [])
    wanted = select(list(sizes))
    folder = os.path.join(cache, repo_folder_name(repo_id=repo_id, repo_type=repo_type))
    state.update(
        commit=info.sha, total=sum(sizes[n] for n in wanted), files=len(wanted), folder=folder
    )
    state["before"] = folder_bytes(folder)
    done = threading.Event()

    def report():
        while not done.wait(1):
            state["received"] = folder_bytes(folder)
            write_json(args["state"], state)

    thread = threading.Thread(target=report)
    thread.daemon = True
    thread.start()
    try:
        # The commit, not the branch: every file of one snapshot, and no second revision call.
        snapshot_download(
            repo_id, repo_type=repo_type, revision=info.sha, cache_dir=cache, allow_patterns=wanted
        )
    finally:
        done.set()
    refs = os.path.join(folder, "refs", revision)
    os.makedirs(os.path.dirname(refs), exist_ok=True)
    if revision != info.sha:
        with open(refs, "w") as handle:
            handle.write(info.sha)
    hashes, bad = {}, []
    snapshot = os.path.join(folder, "snapshots", info.sha)
    for name in wanted:
        path = os.path.join(snapshot, name)
        blob = os.path.normpath(
            os.path.join(os.path.dirname(os.path.relpath(path, folder)), os.readlink(path))
        )
        ok, digest = blob_ok(os.path.join(folder, blob), os.path.basename(blob))
        hashes[blob] = digest
        if not ok:
            bad.append(name)
    if bad:
        for name in bad:  # a damaged blob goes, so that the next run fetches it again
            path = os.path.join(snapshot, name)
            os.remove(os.path.realpath(path))
            os.remove(path)
        raise RuntimeError("damaged on the way (checksum): {}".format(", ".join(bad)))
    if revision == info.sha:
        with open(refs, "w") as handle:
            handle.write(info.sha)
    found = manifest(folder, revision, info.sha, hashes)
    os.makedirs(os.path.join(folder, MANIFEST_DIR), exist_ok=True)
    write_json(os.path.join(folder, MANIFEST_DIR, revision.replace("/", "%2F") + ".json"), found)
    state.update(received=folder_bytes(folder), bytes=found["bytes"])


def main(argv):
    with open(argv[1]) as handle:
        args = json.load(handle)
    state = {"state": "downloading", "started": time.time(), "received": 0, "total": None}
    write_json(args["state"], state)
    try:
        download(args, state)
        state.update(state="done", ended=time.time())
    except Exception as exc:  # noqa: BLE001 - every failure is reported, classified
        kind, message = classify(exc)
        state.update(state="failed", kind=kind, error=message, ended=time.time())
    write_json(args["state"], state)
    return 0 if state["state"] == "done" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
