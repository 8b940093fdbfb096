"""The pull logic (plugins/module_utils/image_pull.py) over the Engine API's pull events as
captured on the local cluster (tests/unit/fixtures/image_pull, see its README): a two-layer
2 GB pull with progress, an up-to-date pull, and the daemon's errors for bad credentials, no
credentials, an unknown tag or repository, an untrusted certificate and a closed port."""

import base64
import json
import os
import socket
import tempfile
import threading
from pathlib import Path

import pytest
from ansible_collections.hostnet.llamafactory.plugins.module_utils import image_pull as pull

FIXTURES = Path(__file__).parent / "fixtures" / "image_pull"
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
    assert pull.credential_helper("fake", REGISTRY) == {
        "ServerURL": REGISTRY,
        "Username": "u",
        "Secret": "p",
    }
    assert pull.credential_helper("absent", REGISTRY) is None


def test_auth_header_is_base64url_json():
    auth = {"username": "u", "password": "p+/?", "serveraddress": REGISTRY}
    assert json.loads(base64.urlsafe_b64decode(pull.auth_header(auth))) == auth


def test_progress_of_a_two_layer_pull():
    stream = events("pulled-two-layers.jsonl")
    progress = pull.PullProgress()
    downloaded, lines = [], set()
    for event in stream:
        progress.feed(event)
        snapshot = progress.snapshot()
        downloaded.append(snapshot["downloaded"])
        lines.add(pull.describe(snapshot))
    assert downloaded == sorted(downloaded)  # never goes back
    final = progress.snapshot()
    assert final["total"] == final["downloaded"] == final["extracted"] == 98053482 + 662917049
    assert (final["layers"], final["layers_done"]) == (2, 2)
    assert final["status"].startswith("Downloaded newer image")
    assert final["digest"].startswith("sha256:7e522ad5")
    assert not final["error"]
    assert pull.describe(final, elapsed=55) == "760.97 MB, 2 of 2 layers, 55 s".replace(
        "760.97 MB", "761.0 MB"
    )
    assert any("(" in line and "%)" in line and "of 2 layers" in line for line in lines)
    assert any("extracted" in line for line in lines)


def test_progress_midway_shows_bytes_rate_and_extraction():
    stream = events("pulled-two-layers.jsonl")
    progress = pull.PullProgress()
    first_download = next(i for i, e in enumerate(stream) if e.get("status") == "Downloading")
    for event in stream[: first_download + 40]:
        progress.feed(event)
    line = pull.describe(progress.snapshot(), elapsed=3, rate=98.4e6)
    assert " of " in line and "%)" in line and "98.4 MB/s" in line and line.endswith("3 s")
    last_extract = max(i for i, e in enumerate(stream) if e.get("status") == "Extracting")
    progress = pull.PullProgress()
    for event in stream[:last_extract]:
        progress.feed(event)
    line = pull.describe(progress.snapshot(), rate=1e6)
    assert "extracted" in line and "MB/s" not in line  # no download rate once downloaded


def test_progress_of_an_up_to_date_pull():
    progress = pull.PullProgress()
    for event in events("up-to-date.jsonl"):
        progress.feed(event)
    snapshot = progress.snapshot()
    assert snapshot["layers"] == 0 and snapshot["status"].startswith("Image is up to date")


@pytest.mark.parametrize(
    ("fixture", "cause", "fix"),
    [
        ("wrong-password.jsonl", "refused the credentials", "llamafactory_registry_password"),
        ("no-credentials.jsonl", "refused the credentials", "llamafactory_registry_username"),
        ("unknown-tag.jsonl", "does not exist in 198.18.96.5:5000", "llamafactory_image"),
        ("unknown-repository.jsonl", "does not exist", "llamafactory_image"),
        ("untrusted-certificate.jsonl", "does not trust", "certs.d/198.18.96.5:5000/ca.crt"),
        ("connection-refused.jsonl", "cannot reach 198.18.96.5:5001", "firewall"),
    ],
)
def test_errors_are_explained(fixture, cause, fix):
    (event,) = events(fixture)
    progress = pull.PullProgress()
    progress.feed(event)
    assert progress.snapshot()["error"] == event["error"]
    image = "198.18.96.5:5001/team/blank:v1" if "refused" in fixture else f"{REGISTRY}/team/x:v"
    found_cause, found_fix = pull.explain(event["error"], image)
    assert cause in found_cause
    assert fix in found_fix


def test_unknown_error_is_not_explained():
    assert pull.explain("something new", "img") == (None, None)


@pytest.mark.parametrize(
    ("count", "text"), [(0, "0 B"), (999, "999 B"), (1500, "2 kB"), (2.5e9, "2.5 GB")]
)
def test_human_bytes(count, text):
    assert pull.human_bytes(count) == text


class FakeDaemon:
    """A unix-socket HTTP server that answers like dockerd: image inspect (200/404) and a pull
    stream replayed from a fixture in chunks that split the JSON lines."""

    def __init__(self, path, stream_lines, status=200):
        self.path, self.lines, self.status, self.requests = path, stream_lines, status, []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(4)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while True:
            try:
                conn = self.server.accept()[0]
            except OSError:
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += conn.recv(4096)
                request_line, *headers = head.split(b"\r\n\r\n")[0].decode().split("\r\n")
                self.requests.append((request_line, dict(h.split(": ", 1) for h in headers)))
                if request_line.startswith("GET"):
                    body = b'{"message":"No such image"}'
                    conn.sendall(
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(body), body)
                    )
                    continue
                if self.status != 200:
                    body = (
                        b'{"message":"Get \\"https://r/v2/\\": '
                        b'x509: certificate signed by unknown authority"}'
                    )
                    conn.sendall(
                        b"HTTP/1.1 500 Error\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                    )
                    continue
                conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                payload = "".join(line + "\r\n" for line in self.lines).encode()
                for start in range(0, len(payload), 977):  # chunks that cut lines in two
                    piece = payload[start : start + 977]
                    conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                conn.sendall(b"0\r\n\r\n")

    def close(self):
        self.server.close()


@pytest.fixture
def socket_path():
    with tempfile.TemporaryDirectory() as folder:  # short path: unix socket names are limited
        yield os.path.join(folder, "docker.sock")


def test_docker_socket_replays_a_pull_stream(socket_path):
    lines = (FIXTURES / "pulled-two-layers.jsonl").read_text().splitlines()
    daemon = FakeDaemon(socket_path, lines)
    try:
        docker = pull.DockerSocket(socket_path, timeout=10)
        assert docker.image_id(f"{REGISTRY}/team/llamafactory:0.9.5-cpu") is None
        auth = {"username": "trainer", "password": "pw", "serveraddress": REGISTRY}
        got = list(docker.pull(f"{REGISTRY}/team/llamafactory:0.9.5-cpu", auth, read_timeout=10))
    finally:
        daemon.close()
    assert got == [json.loads(line) for line in lines]
    request_line, headers = daemon.requests[1]
    assert request_line.startswith(
        "POST /images/create?fromImage=198.18.96.5%3A5000%2Fteam%2Fllamafactory&tag=0.9.5-cpu "
    )
    assert json.loads(base64.urlsafe_b64decode(headers["X-Registry-Auth"])) == auth


def test_docker_socket_turns_an_http_error_into_an_error_event(socket_path):
    daemon = FakeDaemon(socket_path, [], status=500)
    try:
        got = list(pull.DockerSocket(socket_path).pull("r/img:v1", None, read_timeout=10))
    finally:
        daemon.close()
    assert got == [{"error": 'Get "https://r/v2/": x509: certificate signed by unknown authority'}]
    assert "X-Registry-Auth" not in daemon.requests[0][1]
