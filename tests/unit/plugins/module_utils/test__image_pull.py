"""The node's side of a pull (plugins/module_utils/_image_pull.py): image references, registry
credentials, and the Engine API's pull events as captured on the local cluster
(tests/unit/fixtures/image_pull, see its README) folded into progress - a two-layer pull, an
up-to-date pull, the daemon's errors - and streamed from a dockerd stand-in (conftest.py)."""

import base64
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _image_pull as pull
from ansible_collections.hostnet.llamafactory.plugins.module_utils._docker_api import DockerAPI

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "image_pull"
REGISTRY = "198.18.96.5:5000"


def events(name):
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]


@pytest.mark.parametrize(
    ("name", "registry", "repository", "tag"),
    [
        ("hiyouga/llamafactory:0.9.5", "docker.io", "hiyouga/llamafactory", "0.9.5"),
        ("ubuntu", "docker.io", "ubuntu", "latest"),
        ("library/ubuntu:22.04", "docker.io", "library/ubuntu", "22.04"),
        (
            "us-docker.pkg.dev/proj/train/llamafactory:0.9.5",
            "us-docker.pkg.dev",
            "us-docker.pkg.dev/proj/train/llamafactory",
            "0.9.5",
        ),
        (
            "198.18.96.5:5000/team/blank",
            "198.18.96.5:5000",
            "198.18.96.5:5000/team/blank",
            "latest",
        ),
        ("localhost/img:v1", "localhost", "localhost/img", "v1"),
        ("reg:5000/img@sha256:abc", "reg:5000", "reg:5000/img", "sha256:abc"),
        ("reg:5000/img:v1@sha256:abc", "reg:5000", "reg:5000/img", "sha256:abc"),
        ("team/img:v1", "docker.io", "team/img", "v1"),
    ],
)
def test_split_reference(name, registry, repository, tag):
    assert pull.split_reference(name) == (registry, repository, tag)


def basic(user, password):
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def test_config_auth_reads_auths_like_the_docker_cli():
    config = {"auths": {f"https://{REGISTRY}": {"auth": basic("trainer", "s3:cret")}}}
    auth, source = pull.config_auth(config, REGISTRY)
    assert auth == {"username": "trainer", "password": "s3:cret", "serveraddress": REGISTRY}
    assert source == "auths"


def test_config_auth_docker_hub_key_and_identity_token():
    config = {"auths": {"https://index.docker.io/v1/": {"identitytoken": "tok"}}}
    auth = pull.config_auth(config, "docker.io")[0]
    assert auth == {"identitytoken": "tok", "serveraddress": "docker.io"}


def test_config_auth_cred_helper_comes_first():
    """`gcloud auth configure-docker` writes credHelpers; the helper protocol: `get` with the
    server on stdin answers {"ServerURL", "Username", "Secret"}."""
    asked = []

    def helper(name, server):
        asked.append((name, server))
        return {"ServerURL": server, "Username": "oauth2accesstoken", "Secret": "ya29.token"}

    config = {
        "credHelpers": {"us-docker.pkg.dev": "gcloud"},
        "auths": {"us-docker.pkg.dev": {"auth": basic("stale", "stale")}},
    }
    auth, source = pull.config_auth(config, "us-docker.pkg.dev", helper)
    assert asked == [("gcloud", "us-docker.pkg.dev")]
    assert auth == {
        "username": "oauth2accesstoken",
        "password": "ya29.token",
        "serveraddress": "us-docker.pkg.dev",
    }
    assert source == "credHelpers (docker-credential-gcloud)"


def test_config_auth_cred_helper_without_answer_is_an_error():
    config = {"credHelpers": {"us-docker.pkg.dev": "gcloud"}}
    with pytest.raises(ValueError, match="docker-credential-gcloud"):
        pull.config_auth(config, "us-docker.pkg.dev", lambda name, server: None)


def test_config_auth_creds_store_token_and_anonymous():
    def helper(name, server):
        return {"Username": "<token>", "Secret": "refresh"} if name == "desktop" else None

    auth, source = pull.config_auth({"credsStore": "desktop"}, REGISTRY, helper)
    assert auth == {"identitytoken": "refresh", "serveraddress": REGISTRY}
    assert source.startswith("credsStore")
    assert pull.config_auth({"auths": {"other:5000": {"auth": "x"}}}, REGISTRY) == (
        None,
        "anonymous",
    )
    assert pull.config_auth(None, REGISTRY) == (None, "anonymous")


def test_credential_helper_protocol(tmp_path, monkeypatch):
    """A helper on PATH that follows the protocol; a missing one gives None."""
    script = tmp_path / "docker-credential-fake"
    script.write_text(
        "#!/bin/sh\n"
        '[ "$1" = get ] || exit 2\n'
        "read server\n"
        'printf \'{"ServerURL":"%s","Username":"u","Secret":"p"}\' "$server"\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert pull.credential_helper(run_command, "fake", REGISTRY) == {
        "ServerURL": REGISTRY,
        "Username": "u",
        "Secret": "p",
    }
    assert pull.credential_helper(run_command, "absent", REGISTRY) is None


def test_a_helper_that_hangs_is_given_up(tmp_path, monkeypatch):
    """A helper that never answers (one waiting for a login prompt) ends at the deadline."""
    script = tmp_path / "docker-credential-stuck"
    script.write_text("#!/bin/sh\nexec sleep 60\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    started = time.monotonic()
    assert pull.credential_helper(run_command, "stuck", REGISTRY, timeout=1) is None
    assert time.monotonic() - started < 10


def run_command(argv, data=None, binary_data=False):
    """AnsibleModule.run_command's contract: stdin `data` (with a newline unless
    binary_data), (rc, stdout, stderr) as text."""
    text = data if binary_data or data is None else data + "\n"
    done = subprocess.run(argv, input=text, capture_output=True, text=True, check=False)
    return done.returncode, done.stdout, done.stderr


def test_auth_header_is_base64url_json():
    auth = {"username": "u", "password": "p+/?", "serveraddress": REGISTRY}
    assert json.loads(base64.urlsafe_b64decode(pull.auth_header(auth))) == auth


def test_progress_of_a_two_layer_pull():
    stream = events("pulled-two-layers.jsonl")
    progress = pull.PullProgress()
    downloaded = []
    for event in stream:
        progress.feed(event)
        downloaded.append(progress.snapshot()["downloaded"])
    assert downloaded == sorted(downloaded)  # never goes back
    final = progress.snapshot()
    assert final["total"] == final["downloaded"] == final["extracted"] == 98053482 + 662917049
    assert (final["layers"], final["layers_done"]) == (2, 2)
    assert final["status"].startswith("Downloaded newer image")
    assert final["digest"].startswith("sha256:7e522ad5")
    assert not final["error"]


def test_progress_midway_counts_what_came():
    stream = events("pulled-two-layers.jsonl")
    last_extract = max(i for i, e in enumerate(stream) if e.get("status") == "Extracting")
    progress = pull.PullProgress()
    for event in stream[:last_extract]:
        progress.feed(event)
    snapshot = progress.snapshot()
    assert snapshot["downloaded"] == snapshot["total"]
    assert 0 < snapshot["extracted"] < snapshot["total"]
    assert snapshot["layers_done"] < snapshot["layers"] == 2


def test_progress_of_an_up_to_date_pull():
    progress = pull.PullProgress()
    for event in events("up-to-date.jsonl"):
        progress.feed(event)
    snapshot = progress.snapshot()
    assert snapshot["layers"] == 0 and snapshot["status"].startswith("Image is up to date")


@pytest.mark.parametrize(
    "fixture",
    [
        "wrong-password.jsonl",
        "no-credentials.jsonl",
        "unknown-tag.jsonl",
        "unknown-repository.jsonl",
        "untrusted-certificate.jsonl",
        "connection-refused.jsonl",
    ],
)
def test_errors_end_in_the_snapshot(fixture):
    (event,) = events(fixture)
    progress = pull.PullProgress()
    progress.feed(event)
    assert progress.snapshot()["error"] == event["error"] != ""


def test_pull_streams_the_events_through_the_docker_api(dockerd, socket_path):
    lines = (FIXTURES / "pulled-two-layers.jsonl").read_text().splitlines()
    dockerd.pull_lines = lines
    dockerd.images[f"{REGISTRY}/team/llamafactory:0.9.5-cpu"] = "sha256:7e522ad5"
    docker = DockerAPI(socket_path, timeout=10)
    assert docker.image_id(f"{REGISTRY}/team/llamafactory:0.9.5-cpu") == "sha256:7e522ad5"
    assert docker.image_id(f"{REGISTRY}/team/other:v1") is None
    auth = {"username": "trainer", "password": "pw", "serveraddress": REGISTRY}
    got = list(pull.pull(docker, f"{REGISTRY}/team/llamafactory:0.9.5-cpu", auth, 10))
    assert got == [json.loads(line) for line in lines]
    method, path, query, headers, _body = dockerd.requests[-1]
    assert (method, path) == ("POST", "/images/create")
    assert query == {"fromImage": f"{REGISTRY}/team/llamafactory", "tag": "0.9.5-cpu"}
    assert json.loads(base64.urlsafe_b64decode(headers["X-Registry-Auth"])) == auth


def test_a_refused_pull_is_one_error_event(dockerd, socket_path):
    message = 'Get "https://r/v2/": x509: certificate signed by unknown authority'
    dockerd.pull_refusal = (500, message)
    got = list(pull.pull(DockerAPI(socket_path), "r/img:v1", None, read_timeout=10))
    assert got == [{"error": message}]
    assert "X-Registry-Auth" not in dockerd.requests[-1][3]
