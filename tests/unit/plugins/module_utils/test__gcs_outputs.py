"""The job's outputs on Cloud Storage (plugins/module_utils/_gcs_outputs.py), with Google's
client library against gcp-storage-emulator (a Cloud Storage JSON API emulator from PyPI) on
loopback, reached through the client's own emulator setting (STORAGE_EMULATOR_HOST): the
layout, the manifests, the mark written last, the restore and the sync service."""

import json
import os
import socket
import threading
from pathlib import Path

import pytest
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _gcs_outputs as outputs
from gcp_storage_emulator.server import create_server
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

BUCKET = "outputs-test"


@pytest.fixture(scope="module")
def emulator():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    server.start()
    previous = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
    yield storage.Client(project="test", credentials=AnonymousCredentials())
    server.stop()
    if previous is None:
        del os.environ["STORAGE_EMULATOR_HOST"]
    else:
        os.environ["STORAGE_EMULATOR_HOST"] = previous


def store(client, job):
    return outputs.Store(f"gs://{BUCKET}/runs/", job, client=client)


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def node_output(root, node, steps=(5,)):
    """An output folder as a ZeRO-3 LoRA run leaves it on a node (save_on_each_node)."""
    out = root / f"node{node}"
    for step in steps:
        folder = out / f"checkpoint-{step}"
        write(folder / "trainer_state.json", b'{"global_step": %d}' % step)
        write(folder / "adapter_model.safetensors", os.urandom(4096))
        write(
            folder / f"global_step{step}" / f"zero_pp_rank_{node}_optim_states.pt",
            os.urandom(9000),
        )
    write(out / "adapter_model.safetensors", os.urandom(20000))
    write(out / "trainer_log.jsonl", b'{"current_steps": 5}\n')
    (out / "runs").mkdir(exist_ok=True)
    return out


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("gs://bkt", ("bkt", "")),
        ("gs://my-bucket/runs/", ("my-bucket", "runs")),
        ("gs://a.b-c_d/x/y", ("a.b-c_d", "x/y")),
    ],
)
def test_parse_uri(uri, expected):
    assert outputs.parse_uri(uri) == expected


@pytest.mark.parametrize(
    "uri, says",
    [
        ("s3://bkt/x", "is not gs://BUCKET"),
        ("gs://Bucket", "is not gs://BUCKET"),
        ("gs://ab", "is not gs://BUCKET"),
        ("gs://-bkt", "is not gs://BUCKET"),
        ("gs://goog-bkt", "goog"),
        ("gs://" + "a" * 64, "not a valid"),
        ("gs://bkt/a//b", "empty, . or .."),
        ("gs://bkt/../x", "empty, . or .."),
    ],
)
def test_parse_uri_names_what_is_wrong(uri, says):
    with pytest.raises(ValueError, match=says.replace(".", r"\.").replace("(", r"\(")):
        outputs.parse_uri(uri)


def test_a_checkpoint_is_complete_only_when_every_node_sent_its_part(emulator, tmp_path):
    nodes = [node_output(tmp_path, n) for n in (0, 1)]
    s = store(emulator, "job-a")
    assert outputs.sync_checkpoints(s, str(nodes[0]), 0, 2, set()) == ([5], [])
    assert s.checkpoints() == {5: {"complete": False, "nodes": [0]}}
    assert s.newest_complete() is None
    assert outputs.sync_checkpoints(s, str(nodes[1]), 1, 2, set()) == ([5], [])
    # Node 0's next pass marks it, after checking every object against both manifests.
    assert outputs.sync_checkpoints(s, str(nodes[0]), 0, 2, {5}) == ([], [5])
    assert s.newest_complete() == 5
    names = sorted(s.listing("checkpoints", "checkpoint-5"))
    assert "node-1/global_step5/zero_pp_rank_1_optim_states.pt" in names
    assert {"node-0.json", "node-1.json", "COMPLETE.json"} <= set(names)
    # A later pass (a re-run's collect step: nothing in `done`) sends and writes nothing.
    assert outputs.sync_checkpoints(s, str(nodes[1]), 1, 2, set()) == ([], [])
    assert outputs.sync_checkpoints(s, str(nodes[0]), 0, 2, set()) == ([], [])
    # A second pass sends nothing: every object matches.
    assert s.upload_files(*_part(nodes[1], 5), "checkpoints", "checkpoint-5", "node-1") == []


def _part(out, step):
    files = outputs.tree(str(out / f"checkpoint-{step}"))
    return files, {rel: outputs.describe(path) for rel, path in files.items()}


def test_a_damaged_object_keeps_the_checkpoint_incomplete(emulator, tmp_path):
    nodes = [node_output(tmp_path, n) for n in (0, 1)]
    s = store(emulator, "job-b")
    for n in (0, 1):
        outputs.sync_checkpoints(s, str(nodes[n]), n, 2, set())
    blob = s.bucket.blob(s.name("checkpoints", "checkpoint-5", "node-1", "trainer_state.json"))
    blob.upload_from_string(b"not what node 1 wrote")
    done, why = s.mark_complete(5, 2)
    assert not done and "node 1's trainer_state.json is" in why
    with pytest.raises(outputs.OutputsError, match="not complete in the bucket"):
        s.restore_part(str(tmp_path / "fresh"), 5, 1)


def test_a_wiped_node_gets_its_own_part_back_whole(emulator, tmp_path):
    nodes = [node_output(tmp_path, n) for n in (0, 1)]
    s = store(emulator, "job-c")
    for n in (0, 1, 0):
        outputs.sync_checkpoints(s, str(nodes[n]), n, 2, set())
    want = {
        rel: outputs.describe(p) for rel, p in outputs.tree(str(nodes[1] / "checkpoint-5")).items()
    }
    fresh = tmp_path / "fresh-disk"
    fresh.mkdir()
    (fresh / "checkpoint-5.restoring").mkdir()  # a restore that died half way
    assert s.restore_part(str(fresh), 5, 1) == len(want)
    got = {rel: outputs.describe(p) for rel, p in outputs.tree(str(fresh / "checkpoint-5")).items()}
    assert got == want
    assert not (fresh / "checkpoint-5.restoring").exists()
    assert outputs.complete_checkpoints(outputs.checkpoint_listing(str(fresh))) == [5]


def test_the_final_outputs_with_their_manifest(emulator, tmp_path):
    out = node_output(tmp_path, 0)
    s = store(emulator, "job-d")
    assert s.verify_output()[0] is False
    manifest, sent = s.upload_output(str(out))
    assert sorted(sent) == ["MANIFEST.json", "adapter_model.safetensors", "trainer_log.jsonl"]
    assert sorted(manifest["files"]) == ["adapter_model.safetensors", "trainer_log.jsonl"]
    assert s.verify_output(str(out))[:2] == (True, "")
    data = s.bucket.blob(s.name("output", "adapter_model.safetensors")).download_as_bytes()
    assert data == (out / "adapter_model.safetensors").read_bytes()
    assert s.upload_output(str(out))[1] == []  # nothing sent twice
    (out / "trainer_log.jsonl").write_bytes(b"changed\n")
    verified, why, _m = s.verify_output(str(out))
    assert not verified and "differs from" in why


def test_the_probe_names_a_missing_bucket(emulator):
    from google.api_core.exceptions import NotFound

    store(emulator, "job-e").probe(0)
    missing = outputs.Store("gs://no-such-bucket-here/p", "j", client=emulator)
    with pytest.raises(NotFound) as raised:
        missing.probe(0)
    said = outputs.refusal(missing, "probe", raised.value)
    assert "the bucket gs://no-such-bucket-here does not exist" in said
    assert "gcloud storage buckets create gs://no-such-bucket-here" in said


@pytest.mark.parametrize(
    "exc, says",
    [
        # Cloud Storage's words for a missing object, an IAM denial and an access scope too narrow.
        ("NotFound:No such object: bkt/p/j/x", "Cloud Storage refused restore for gs://bkt/p"),
        (
            "Forbidden:gce@p.iam does not have storage.objects.create access",
            "--role roles/storage.objectUser",
        ),
        (
            "Forbidden:Provided scope(s) are not authorized",
            "--scopes cloud-platform",
        ),
        ("ServiceUnavailable:try again", "Cloud Storage refused restore for gs://bkt/p/j: 503"),
    ],
)
def test_a_refusal_names_its_fix(emulator, exc, says):
    from google.api_core import exceptions

    kind, text = exc.split(":", 1)
    said = outputs.refusal(
        outputs.Store("gs://bkt/p", "j", client=emulator),
        "restore",
        getattr(exceptions, kind)(text),
    )
    assert says in said


def test_the_sync_service_sends_while_training_and_ends_after_the_agent(emulator, tmp_path):
    nodes = [node_output(tmp_path, n, steps=()) for n in (0, 1)]
    configs = []
    for n in (0, 1):
        config = {
            "uri": f"gs://{BUCKET}/runs",
            "job": "job-f",
            "node": n,
            "nodes": 2,
            "output_dir": str(nodes[n]),
            "state_file": str(tmp_path / f"state{n}.json"),
            "status_file": str(tmp_path / f"status{n}.json"),
            # The launch restarts the service before the rank starts; here the threads may
            # start after the "agents" wrote their state: any state file counts.
            "launched_at": 1,
            "interval_s": 0.05,
            "settle_s": 30,
            "quiet_s": 0,
        }
        path = tmp_path / f"config{n}.json"
        path.write_text(json.dumps(config))
        configs.append(path)
    codes = {}
    threads = [
        threading.Thread(
            target=lambda n=n: codes.setdefault(
                n, outputs.run_service(str(configs[n]), client=emulator)
            )
        )
        for n in (0, 1)
    ]
    for t in threads:
        t.start()
    # The ranks save checkpoint-3, then checkpoint-6, and end.
    for step in (3, 6):
        for n in (0, 1):
            folder = nodes[n] / f"checkpoint-{step}"
            write(folder / f"global_step{step}" / "shard.pt", os.urandom(5000))
            write(folder / "trainer_state.json", b"{}")
    for n in (0, 1):
        (tmp_path / f"state{n}.json").write_text('{"state": "exited", "code": 0}')
    for t in threads:
        t.join(60)
    assert codes == {0: 0, 1: 0}
    s = store(emulator, "job-f")
    assert sorted(s.checkpoints()) == [3, 6] and s.newest_complete() == 6
    status = json.loads((tmp_path / "status0.json").read_text())
    assert status["uploaded"] == [3, 6] and status["error"] is None


def test_the_sync_program_runs_as_the_role_installs_it(emulator, tmp_path):
    """roles/gcs_outputs installs output_sync.py with the module_utils it needs next to it,
    outside any collection: copied by the role's own list and run so (PYTHONPATH ignored), one
    node's checkpoint reaches the bucket complete."""
    import re
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[4]
    role = root / "roles" / "gcs_outputs"
    tasks = (role / "tasks" / "main.yml").read_text()
    listed = re.findall(r'^    - "?([^"\n]+)"?$', tasks.split("Install the sync program")[1], re.M)
    home = tmp_path / "home"
    home.mkdir()
    for item in listed:
        source = item.replace("{{ role_path }}", str(role))
        source = source if "/" in source else str(role / "files" / source)
        shutil.copy(source, home)
    out = node_output(tmp_path, 0, steps=(4,))
    state = tmp_path / "state.json"
    state.write_text('{"state": "exited", "code": 0}')
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "uri": f"gs://{BUCKET}/runs",
                "job": "job-installed",
                "node": 0,
                "nodes": 1,
                "output_dir": str(out),
                "state_file": str(state),
                "status_file": str(tmp_path / "status.json"),
                "launched_at": 1,
                "interval_s": 0.05,
                "settle_s": 5,
                "quiet_s": 0,
            }
        )
    )
    ran = subprocess.run(
        [sys.executable, "-E", "-s", str(home / "output_sync.py"), str(config)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert store(emulator, "job-installed").newest_complete() == 4
