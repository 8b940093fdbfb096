"""A stand-in for dockerd for the tests of the collection's Docker access layer
(plugins/module_utils/_docker_api.py) and the modules that use it: a real HTTP/1.1 server
(http.server) on a unix socket in a temporary folder, answering the Engine API calls the
collection makes the way dockerd does - status codes, {"message": ...} error bodies, chunked
streams, and container logs in the multiplexed stream format (8-byte frame headers) unless the
container has a TTY.

Its containers are inspect objects captured on the local cluster (tests/unit/fixtures/job) and
their logs frames as in tests/unit/fixtures/job/*.multiplexed.
"""

import json
import os
import socketserver
import struct
import tempfile
import threading
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, unquote, urlsplit

import pytest


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def frames_of(data: bytes) -> list[tuple[int, bytes]]:
    """The (stream, payload) frames of a multiplexed stream (the fake's own reader, kept apart
    from the decoder under test)."""
    found, offset = [], 0
    while offset < len(data):
        stream, size = struct.unpack(">BxxxL", data[offset : offset + 8])
        found.append((stream, data[offset + 8 : offset + 8 + size]))
        offset += 8 + size
    return found


class FakeDockerd:
    """State: containers (name -> {"inspect": dict, "logs": [(stream, payload bytes)]}), images
    (reference -> ID), the pull stream (JSON lines) or a pull refusal, and every request
    received (method, path, query, headers). `chunk` is the size the streams are cut into (so
    that frames and JSON lines arrive split)."""

    def __init__(self, path):
        self.path = path
        self.containers = {}
        self.images = {}
        self.pull_lines = []
        self.pull_refusal = None  # (status, message)
        self.requests = []
        self.chunk = 61
        self.delay = 0.0
        self.on_kill = None  # called with (name, signal) when a running container is signalled
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # the client address of a unix socket is ''
                pass

            def do_GET(self):
                fake.handle(self, "GET")

            def do_POST(self):
                fake.handle(self, "POST")

            def do_DELETE(self):
                fake.handle(self, "DELETE")

        self.server = _Server(path, Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    # --- setting up ---------------------------------------------------------------------------

    def add_container(self, name, inspect, logs=b""):
        self.containers[name] = {"inspect": inspect, "logs": frames_of(logs)}

    # --- answering ----------------------------------------------------------------------------

    @staticmethod
    def send(handler, status, body=b"", content_type="application/json"):
        handler.send_response(status)
        if status not in (204, 304):
            handler.send_header("Content-Type", content_type)
            handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if status not in (204, 304):
            handler.wfile.write(body)

    def error(self, handler, status, message):
        self.send(handler, status, json.dumps({"message": message}).encode())

    def stream(self, handler, data, content_type):
        handler.send_response(200)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for start in range(0, len(data), self.chunk):
            piece = data[start : start + self.chunk]
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            handler.wfile.flush()
        handler.wfile.write(b"0\r\n\r\n")

    def handle(self, handler, method):
        url = urlsplit(handler.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        self.requests.append((method, url.path, query, dict(handler.headers), body))
        if self.delay:
            threading.Event().wait(self.delay)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        if parts[:1] == ["containers"] and len(parts) == 2 and parts[1] == "json":
            return self.list_containers(handler, query)
        if parts == ["containers", "create"] and method == "POST":
            return self.container_create(handler, query["name"], json.loads(body))
        if parts[:1] == ["containers"] and len(parts) == 2 and method == "DELETE":
            # The Engine API: 204 once removed (force=1 kills a running one first), 404 if none;
            # without force a running container is refused (409).
            container = self.containers.get(parts[1])
            if container is None:
                return self.error(handler, 404, f"No such container: {parts[1]}")
            if container["inspect"]["State"].get("Running") and query.get("force") != "1":
                return self.error(handler, 409, "cannot remove a running container")
            del self.containers[parts[1]]
            return self.send(handler, 204)
        if parts[:1] == ["containers"] and len(parts) == 3:
            container = self.containers.get(parts[1])
            if container is None:
                return self.error(handler, 404, f"No such container: {parts[1]}")
            return getattr(self, "container_" + parts[2])(handler, container, query)
        if parts[:1] == ["images"] and parts[-1] == "json":
            name = "/".join(parts[1:-1])
            if name not in self.images:
                return self.error(handler, 404, f"No such image: {name}")
            return self.send(handler, 200, json.dumps({"Id": self.images[name]}).encode())
        if parts == ["images", "create"] and method == "POST":
            if self.pull_refusal:
                return self.error(handler, *self.pull_refusal)
            data = "".join(line + "\r\n" for line in self.pull_lines).encode()
            return self.stream(handler, data, "application/json")
        return self.error(handler, 404, "page not found")

    def container_json(self, handler, container, query):
        self.send(handler, 200, json.dumps(container["inspect"]).encode())

    def container_logs(self, handler, container, query):
        entries = container["logs"]
        if query.get("tail", "all") != "all":
            entries = entries[-int(query["tail"]) :] if int(query["tail"]) else []
        if query.get("timestamps") != "1":
            entries = [(s, p.split(b" ", 1)[1]) for s, p in entries]
        tty = container["inspect"]["Config"].get("Tty")
        if tty:  # a TTY joins the streams: raw bytes, no frames
            data = b"".join(p for _s, p in entries)
            return self.stream(handler, data, "application/vnd.docker.raw-stream")
        data = b"".join(struct.pack(">BxxxL", s, len(p)) + p for s, p in entries)
        self.stream(handler, data, "application/vnd.docker.multiplexed-stream")

    def container_create(self, handler, name, body):
        # The Engine API: 201 {"Id"}; 404 for an image the daemon lacks, 409 for a name in use.
        if body["Image"] not in self.images:
            return self.error(handler, 404, f"No such image: {body['Image']}")
        if name in self.containers:
            return self.error(handler, 409, f'Conflict. The container name "/{name}" is in use')
        inspect = {
            "Id": f"{len(self.requests):064x}",
            "Name": "/" + name,
            "State": {"Status": "created", "Running": False, "ExitCode": 0},
            "Config": {
                "Image": body["Image"],
                "Cmd": body["Cmd"],
                "Labels": body.get("Labels"),
                "Env": body.get("Env") or [],
                "WorkingDir": body.get("WorkingDir", ""),
            },
            "HostConfig": body["HostConfig"],
        }
        self.add_container(name, inspect)
        self.send(handler, 201, json.dumps({"Id": inspect["Id"], "Warnings": []}).encode())

    def container_start(self, handler, container, query):
        state = container["inspect"]["State"]
        if state.get("Running"):
            return self.send(handler, 304)
        state.update(Status="running", Running=True)
        self.send(handler, 204)

    def container_kill(self, handler, container, query):
        if not container["inspect"]["State"].get("Running"):
            return self.error(handler, 409, "container is not running")
        if self.on_kill:
            self.on_kill(container["inspect"]["Name"].lstrip("/"), query.get("signal", "SIGKILL"))
        self.send(handler, 204)

    def container_stop(self, handler, container, query):
        state = container["inspect"]["State"]
        if not state.get("Running"):
            return self.send(handler, 304)
        state.update(Running=False, Status="exited", ExitCode=143)
        self.send(handler, 204)

    def list_containers(self, handler, query):
        wanted = json.loads(query.get("filters", "{}")).get("label", [])
        found = []
        for name, container in sorted(self.containers.items()):
            inspect = container["inspect"]
            labels = inspect["Config"].get("Labels") or {}
            if query.get("all") != "1" and not inspect["State"].get("Running"):
                continue
            ok = all(
                (w.split("=", 1)[0] in labels)
                if "=" not in w
                else labels.get(w.split("=", 1)[0]) == w.split("=", 1)[1]
                for w in wanted
            )
            if ok:
                found.append(
                    {
                        "Id": inspect["Id"],
                        "Names": ["/" + name],
                        "State": inspect["State"]["Status"],
                        "Labels": labels,
                    }
                )
        self.send(handler, 200, json.dumps(found).encode())


@pytest.fixture
def socket_path():
    with tempfile.TemporaryDirectory() as folder:  # short path: unix socket names are limited
        yield os.path.join(folder, "docker.sock")


@pytest.fixture
def dockerd(socket_path):
    daemon = FakeDockerd(socket_path)
    try:
        yield daemon
    finally:
        daemon.close()
