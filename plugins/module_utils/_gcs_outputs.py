# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A job's outputs on Cloud Storage (llamafactory_output_uri, gs://BUCKET[/PREFIX]).

Run on the nodes, with Google's client library google-cloud-storage (resumable and parallel
transfers, every object checked against its CRC32C), authenticated as the VM's service account
through the metadata server: by the module gcs_outputs and by the sync service that the launch
starts next to each rank (roles/gcs_outputs/files/output_sync.py, with this file and _job.py
next to it).

Layout under gs://BUCKET/PREFIX/JOB/:

    checkpoints/checkpoint-N/node-R/...       node R's part of checkpoint N (its files there)
    checkpoints/checkpoint-N/node-R.json      its manifest (size and CRC32C of every file),
                                              written once every file arrived whole
    checkpoints/checkpoint-N/COMPLETE.json    written last, by rank 0's node, once every node's
                                              manifest is there and every object matches it
    output/...                                rank 0's final outputs (the adapter or model,
                                              trainer_log.jsonl, all_results.json, the loss plot)
    output/MANIFEST.json                      written last: size, CRC32C and SHA-256 of each

A checkpoint counts only with its COMPLETE.json; a restore downloads one node's part, checks
every file against the manifest and renames the folder into place only then.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json
import os
import re
import shutil
import sys
import time

try:
    from ansible_collections.hostnet.llamafactory.plugins.module_utils._job import (
        CHECKPOINT,
        checkpoint_listing,
        complete_checkpoints,
    )
    from ansible_collections.hostnet.llamafactory.plugins.module_utils._results import (
        file_checksum,
    )
except ImportError:  # the sync service on a node: _job.py and _results.py lie next to this file
    from _job import CHECKPOINT, checkpoint_listing, complete_checkpoints  # type: ignore[no-redef]
    from _results import file_checksum  # type: ignore[no-redef]

URI = re.compile(r"^gs://([a-z0-9][a-z0-9._-]{1,220}[a-z0-9])(/.*)?$")
PREFIX = re.compile(r"^[A-Za-z0-9._/-]*$")
BUCKET_PART = re.compile(r"^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$")
COMPLETE = "COMPLETE.json"
MANIFEST = "MANIFEST.json"
CHUNK = 1 << 20
# Files of the output folder that are not part of the final outputs.
NOT_OUTPUT = ("checkpoint-", "runs", ".")


SCOPES_FIX = (
    "the VM's access scopes must allow Cloud Storage writes (cloud-platform, or "
    "devstorage.read_write: gcloud compute instances set-service-account VM --scopes "
    "cloud-platform, with the VM stopped)"
)


def refusal(store, action, exc):
    """What a refusal of Cloud Storage's (a google.api_core GoogleAPICallError, read by its
    HTTP status) means for the job, with the fix."""
    code, text = getattr(exc, "code", None), str(exc)
    bucket = store.bucket_name
    if code == 404 and "No such object" not in text:
        return (
            "llamafactory_output_uri: the bucket gs://%s does not exist (or this project "
            "cannot see it): create it in the VMs' region, e.g. gcloud storage buckets create "
            "gs://%s --location REGION --uniform-bucket-level-access" % (bucket, bucket)
        )
    if code in (401, 403):
        if "scope" in text.lower():
            fix = SCOPES_FIX
        else:
            fix = (
                "grant the VMs' service account roles/storage.objectUser on the bucket: gcloud "
                "storage buckets add-iam-policy-binding gs://%s --member "
                "serviceAccount:EMAIL --role roles/storage.objectUser" % bucket
            )
        return "llamafactory_output_uri: this node's service account may not use %s (%s): %s" % (
            store.uri,
            text,
            fix,
        )
    return "Cloud Storage refused %s for %s: %s" % (action, store.uri, text)


class OutputsError(Exception):
    """A transfer or check failed; the message says what and where."""


def parse_uri(uri):
    """(bucket, prefix) of gs://BUCKET[/PREFIX], or raise ValueError naming what is wrong.
    The bucket name follows Cloud Storage's rules (cloud.google.com/storage/docs/buckets)."""
    match = URI.match(uri or "")
    if not match:
        raise ValueError(
            "%r is not gs://BUCKET[/PREFIX] (a bucket name of 3-63 lowercase letters, digits, "
            "dashes, underscores and dots, starting and ending with a letter or digit)" % (uri,)
        )
    bucket, path = match.group(1), (match.group(2) or "").strip("/")
    parts = bucket.split(".")
    if bucket.startswith("goog") or "google" in bucket:
        raise ValueError("bucket %r: names may not start with goog or contain google" % bucket)
    if (len(parts) == 1 and len(bucket) > 63) or not all(BUCKET_PART.match(p) for p in parts):
        raise ValueError("bucket %r is not a valid Cloud Storage bucket name" % bucket)
    if "//" in (match.group(2) or "").rstrip("/") or any(p in (".", "..") for p in path.split("/")):
        raise ValueError("%r: the prefix may not hold empty, . or .. parts" % (uri,))
    if not PREFIX.match(path):
        raise ValueError("%r: the prefix may hold letters, digits and ._-/ only" % (uri,))
    return bucket, path


def job_prefix(uri, job):
    bucket, path = parse_uri(uri)
    return bucket, "/".join(p for p in (path, job) if p)


def crc32c_of(path):
    """A file's CRC32C as Cloud Storage reports it (base64 of the big-endian value)."""
    import google_crc32c

    checksum = google_crc32c.Checksum()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            checksum.update(chunk)
    return base64.b64encode(checksum.digest()).decode("ascii")


def tree(folder):
    """Relative path -> absolute path of every file under folder."""
    found = {}
    for root, _dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            found[os.path.relpath(path, folder)] = path
    return found


def output_files(output_dir):
    """The final outputs: the files at the top of the output folder (as job_results brings)."""
    found = {}
    for name in sorted(os.listdir(output_dir)):
        path = os.path.join(output_dir, name)
        if os.path.isfile(path) and not name.startswith(NOT_OUTPUT):
            found[name] = path
    return found


def describe(path):
    return {"size": os.path.getsize(path), "crc32c": crc32c_of(path)}


class Store:
    """One job's folder in a bucket, through google-cloud-storage."""

    def __init__(self, uri, job, client=None, workers=4):
        self.bucket_name, self.prefix = job_prefix(uri, job)
        self.uri = "gs://%s/%s" % (self.bucket_name, self.prefix)
        if client is None:
            from google.cloud import storage

            client = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT") or None)
        self.client = client
        self.bucket = client.bucket(self.bucket_name)
        self.workers = workers

    def name(self, *parts):
        return "/".join([self.prefix] + [p for p in parts if p])

    def listing(self, *parts):
        """Object name (relative to the job's folder/parts) -> {size, crc32c}."""
        base = self.name(*parts) + "/"
        return {
            blob.name[len(base) :]: {"size": blob.size, "crc32c": blob.crc32c}
            for blob in self.client.list_blobs(self.bucket_name, prefix=base)
        }

    def read_json(self, *parts):
        from google.api_core.exceptions import NotFound

        try:
            return json.loads(self.bucket.blob(self.name(*parts)).download_as_bytes())
        except NotFound:
            return None

    def write_json(self, data, *parts):
        blob = self.bucket.blob(self.name(*parts))
        blob.upload_from_string(
            json.dumps(data, indent=2, sort_keys=True) + "\n",
            content_type="application/json",
            checksum="crc32c",
        )

    def upload_files(self, files, described, *parts):
        """Upload {relative: path} under parts, leaving alone the objects that already match
        (`described` holds each file's size and CRC32C); each upload is checked against the
        CRC32C the bucket computed. Returns the names uploaded."""
        there = self.listing(*parts)
        todo = [rel for rel in sorted(files) if there.get(rel) != described[rel]]
        if not todo:
            return []
        from google.cloud.storage import transfer_manager

        pairs = [(rel, self.bucket.blob(self.name(*parts, rel))) for rel in todo]
        results = transfer_manager.upload_many(
            [(files[rel], blob) for rel, blob in pairs],
            upload_kwargs={"checksum": "crc32c"},
            max_workers=self.workers,
            worker_type=transfer_manager.THREAD,
            raise_exception=False,
        )
        errors = [
            "%s: %s" % (pairs[i][0], result)
            for i, result in enumerate(results)
            if isinstance(result, Exception)
        ]
        if errors:
            raise OutputsError("upload to %s failed: %s" % (self.uri, "; ".join(errors[:3])))
        for rel, blob in pairs:
            if blob.crc32c != described[rel]["crc32c"]:
                raise OutputsError(
                    "%s arrived with CRC32C %s, not %s"
                    % (blob.name, blob.crc32c, described[rel]["crc32c"])
                )
        return todo

    # -- checkpoints --------------------------------------------------------------------------

    def checkpoints(self):
        """Step -> {complete: bool, nodes: [node ranks whose manifest is there]}."""
        base = self.name("checkpoints") + "/"
        found = {}
        for blob in self.client.list_blobs(self.bucket_name, prefix=base):
            parts = blob.name[len(base) :].split("/")
            match = CHECKPOINT.match(parts[0])
            if not match or len(parts) != 2:
                continue
            entry = found.setdefault(int(match.group(1)), {"complete": False, "nodes": []})
            node = re.match(r"^node-(\d+)\.json$", parts[1])
            if parts[1] == COMPLETE:
                entry["complete"] = True
            elif node:
                entry["nodes"].append(int(node.group(1)))
        for entry in found.values():
            entry["nodes"].sort()
        return found

    def newest_complete(self):
        steps = [step for step, entry in self.checkpoints().items() if entry["complete"]]
        return max(steps) if steps else None

    def upload_part(self, output_dir, step, node, quiet_s=0):
        """This node's part of checkpoint-step, then its manifest. Returns (manifest, whether
        anything was written), or (None, False) when the folder changed within quiet_s seconds
        (still being written), changed while it was sent, or went away (the trainer removed an
        old checkpoint)."""
        folder = os.path.join(output_dir, "checkpoint-%d" % step)
        try:
            files = tree(folder)
            newest = max([os.path.getmtime(p) for p in files.values()] or [0])
            if time.time() - newest < quiet_s:
                return None, False
            described = dict((rel, describe(path)) for rel, path in files.items())
            sent = self.upload_files(
                files, described, "checkpoints", "checkpoint-%d" % step, "node-%d" % node
            )
            if described != dict((rel, describe(path)) for rel, path in tree(folder).items()):
                return None, False  # changed while it was sent: the next pass takes it again
        except (OSError, IOError):
            return None, False
        manifest = {"step": step, "node": node, "files": described}
        name = ("checkpoints", "checkpoint-%d" % step, "node-%d.json" % node)
        if sent or self.read_json(*name) != manifest:
            self.write_json(manifest, *name)
            return manifest, True
        return manifest, False

    def mark_complete(self, step, nodes):
        """Write COMPLETE.json when every node's manifest is there and every object matches it.
        Returns (done, why-not)."""
        folder = "checkpoint-%d" % step
        there = self.listing("checkpoints", folder)
        for node in range(nodes):
            manifest = self.read_json("checkpoints", folder, "node-%d.json" % node)
            if manifest is None:
                return False, "node %d's part has not arrived" % node
            for rel, want in manifest["files"].items():
                got = there.get("node-%d/%s" % (node, rel))
                if got != want:
                    return False, "node %d's %s is %s in the bucket, not %s" % (
                        node,
                        rel,
                        got,
                        want,
                    )
        self.write_json(
            {"step": step, "nodes": nodes, "at": time.time()}, "checkpoints", folder, COMPLETE
        )
        return True, ""

    def restore_part(self, output_dir, step, node):
        """Download node's part of checkpoint-step into output_dir, each file checked against
        the manifest; the folder takes its place only whole. Returns the number of files."""
        folder = "checkpoint-%d" % step
        if self.read_json("checkpoints", folder, COMPLETE) is None:
            raise OutputsError(
                "%s/checkpoints/%s is not complete in the bucket" % (self.uri, folder)
            )
        manifest = self.read_json("checkpoints", folder, "node-%d.json" % node)
        if manifest is None:
            raise OutputsError(
                "%s/checkpoints/%s has no part of node %d" % (self.uri, folder, node)
            )
        target = os.path.join(output_dir, folder)
        partial = target + ".restoring"
        shutil.rmtree(partial, ignore_errors=True)
        from google.cloud.storage import transfer_manager

        pairs = []
        for rel in sorted(manifest["files"]):
            path = os.path.join(partial, rel)
            if not os.path.dirname(os.path.abspath(path)).startswith(os.path.abspath(partial)):
                raise OutputsError("%s: a file name leaves the folder: %r" % (self.uri, rel))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            pairs.append(
                (self.bucket.blob(self.name("checkpoints", folder, "node-%d" % node, rel)), path)
            )
        results = transfer_manager.download_many(
            pairs,
            download_kwargs={"checksum": "crc32c"},
            max_workers=self.workers,
            worker_type=transfer_manager.THREAD,
            raise_exception=False,
        )
        errors = [str(r) for r in results if isinstance(r, Exception)]
        for rel, want in manifest["files"].items():
            if not errors and describe(os.path.join(partial, rel)) != want:
                errors.append("%s does not match its manifest" % rel)
        if errors:
            shutil.rmtree(partial, ignore_errors=True)
            raise OutputsError(
                "restore of %s/checkpoints/%s failed: %s"
                % (self.uri, folder, "; ".join(errors[:3]))
            )
        if os.path.isdir(target):
            shutil.rmtree(target)
        os.rename(partial, target)
        return len(pairs)

    # -- final outputs ------------------------------------------------------------------------

    def upload_output(self, output_dir):
        """Rank 0's final outputs, then MANIFEST.json. Returns (manifest, uploaded names)."""
        files = output_files(output_dir)
        described = {}
        for rel, path in files.items():
            described[rel] = dict(describe(path), sha256=file_checksum(path))
        uploaded = self.upload_files(
            files,
            dict((r, {"size": d["size"], "crc32c": d["crc32c"]}) for r, d in described.items()),
            "output",
        )
        manifest = {"files": described}
        if uploaded or self.read_json("output", MANIFEST) != manifest:
            self.write_json(manifest, "output", MANIFEST)
            uploaded.append(MANIFEST)
        return manifest, uploaded

    def verify_output(self, output_dir=None):
        """Whether output/ is whole: MANIFEST.json there, every object matching it and, given
        output_dir, every file there matching it too. Returns (verified, why-not, manifest)."""
        manifest = self.read_json("output", MANIFEST)
        if manifest is None:
            return False, "%s/output/%s is missing" % (self.uri, MANIFEST), None
        there = self.listing("output")
        for rel, want in manifest["files"].items():
            got = there.get(rel)
            if got != {"size": want["size"], "crc32c": want["crc32c"]}:
                return (
                    False,
                    "%s/output/%s is %s, not as its manifest says" % (self.uri, rel, got),
                    manifest,
                )
        if output_dir is not None:
            local = output_files(output_dir)
            if sorted(local) != sorted(manifest["files"]):
                return (
                    False,
                    "the bucket's output/ and %s hold different files" % output_dir,
                    manifest,
                )
            for rel, path in local.items():
                if file_checksum(path) != manifest["files"][rel]["sha256"]:
                    return False, "%s differs from %s/output/%s" % (path, self.uri, rel), manifest
        return True, "", manifest

    def probe(self, node):
        """Write, read back and delete a small object: the bucket exists and this node may
        write to it. Raises google.api_core exceptions as the API answered."""
        blob = self.bucket.blob(self.name(".probe", "node-%d" % node))
        blob.upload_from_string(b"hostnet.llamafactory write probe\n", checksum="crc32c")
        blob.download_as_bytes()
        blob.delete()


def sync_checkpoints(store, output_dir, node, nodes, done, quiet_s=0):
    """One pass: upload this node's part of each complete local checkpoint not in `done` (a set
    of steps, updated), and on node 0 mark complete each checkpoint every node has sent.
    Returns the steps uploaded and the ones marked complete."""
    uploaded, marked = [], []
    for step in complete_checkpoints(checkpoint_listing(output_dir)):
        if step in done:
            continue
        manifest, written = store.upload_part(output_dir, step, node, quiet_s)
        if manifest is not None:
            done.add(step)
            if written:
                uploaded.append(step)
    if node == 0:
        for step, entry in sorted(store.checkpoints().items()):
            ready = not entry["complete"] and len(entry["nodes"]) >= nodes
            if ready and store.mark_complete(step, nodes)[0]:
                marked.append(step)
    return uploaded, marked


def agent_ended(state_file, since):
    """Whether the rank's agent (roles/launch/files/rank_agent.py) of the launch at `since`
    (epoch seconds) has exited: its state file, newer than the launch, says so."""
    try:
        if os.path.getmtime(state_file) < since:
            return False
        with open(state_file) as handle:
            return json.load(handle).get("state") == "exited"
    except (OSError, ValueError):
        return False


def run_service(config_path, sleep=time.sleep, now=time.time, client=None):
    """The sync service: while the rank trains, every complete checkpoint this node holds goes
    to the bucket (node 0 marks each complete); it ends after a last pass once the rank's agent
    exited, and (node 0) once every node's part of the newest checkpoint arrived or
    settle_s passed. Writes its progress to config's status_file."""
    with open(config_path) as handle:
        config = json.load(handle)
    store = Store(config["uri"], config["job"], client=client, workers=config.get("workers", 4))
    done, marked, last_error = set(), [], None
    ended_at = None
    # The launch restarts this service just before the rank: an older agent state is stale.
    started = config.get("launched_at") or now()
    while True:
        try:
            # While the rank runs, a checkpoint is sent once its files are quiet for a while.
            quiet = 0 if ended_at is not None else config.get("quiet_s", 5)
            up, new = sync_checkpoints(
                store, config["output_dir"], config["node"], config["nodes"], done, quiet
            )
            marked.extend(new)
            for step in up:
                _say("checkpoint-%d: node %d's part is in %s" % (step, config["node"], store.uri))
            for step in new:
                _say("checkpoint-%d is complete in %s" % (step, store.uri))
            last_error = None
        except Exception as exc:  # noqa: BLE001 - whatever failed is tried again at the next pass
            last_error = "%s: %s" % (type(exc).__name__, exc)
            _say("sync failed, trying again: %s" % last_error)
        _write_status(config.get("status_file"), sorted(done), marked, last_error)
        if ended_at is None:
            if agent_ended(config["state_file"], started):
                ended_at = now()
                continue  # one more pass for what the rank saved last
        else:
            waiting = config["node"] == 0 and any(
                not entry["complete"] for entry in _safe_checkpoints(store).values()
            )
            if not waiting or now() - ended_at > config.get("settle_s", 600):
                return 0
        sleep(config.get("interval_s", 10))


def _safe_checkpoints(store):
    try:
        return store.checkpoints()
    except Exception:  # noqa: BLE001 - the next pass tells
        return {}


def _say(message):
    sys.stderr.write("[hostnet.llamafactory outputs] %s\n" % message)
    sys.stderr.flush()


def _write_status(path, uploaded, marked, error):
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(
            {"uploaded": uploaded, "marked": marked, "error": error, "at": time.time()}, handle
        )
    os.replace(tmp, path)
