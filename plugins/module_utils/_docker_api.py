# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's one way to the Docker daemon on a node: the Engine API over its unix socket.

Standard library only (no `requests`, no Docker SDK, no docker CLI): GET, POST and DELETE with
JSON answers, streamed answers (a pull's JSON lines, a container's log stream) with a timeout on
every wait, and errors that say what is wrong - no daemon, no permission, a slow daemon, or the
daemon's own message for a refused call.

Used by the modules image_pull, job_status, node_facts, preflight_probe and hub_cache.
community.docker's client
(community.docker/plugins/module_utils/_api) is private to that collection and needs `requests`
on the node, so the collection keeps this small one of its own.

Engine API reference: https://docs.docker.com/reference/api/engine/ (the calls here exist since
API 1.24, Docker 1.12; none is version-prefixed, so the daemon answers with its own version).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import json
import socket
import struct

try:
    from http.client import HTTPConnection, HTTPException
    from urllib.parse import quote, urlencode
except ImportError:  # pragma: no cover (Python 2 is not supported by the collection)
    HTTPConnection = object
    HTTPException = Exception

DEFAULT_SOCKET = "/var/run/docker.sock"
DEFAULT_TIMEOUT = 60
# The options of the modules that reach the daemon (the doc fragment hostnet.llamafactory.docker).
OPTIONS = dict(
    docker_socket=dict(type="path", default=DEFAULT_SOCKET),
    docker_timeout=dict(type="int", default=DEFAULT_TIMEOUT),
)

# The multiplexed stream (a container's output without a TTY): frames of an 8-byte header
# [STREAM_TYPE, 0, 0, 0, SIZE1, SIZE2, SIZE3, SIZE4] and SIZE bytes of payload, the size a
# big-endian uint32; STREAM_TYPE 0 is stdin (written on stdout), 1 stdout, 2 stderr.
# Docker Engine API, "Attach to a container" (POST /containers/{id}/attach), "Stream format";
# GET /containers/{id}/logs answers in the same format.
STDIN, STDOUT, STDERR = 0, 1, 2
FRAME_HEADER = struct.Struct(">BxxxL")


class DockerError(Exception):
    """A call the daemon refused or could not answer. `status` is the HTTP status and `reason`
    the daemon's own message (both None when there was no answer)."""

    def __init__(self, message, status=None, reason=None):
        Exception.__init__(self, message)
        self.status = status
        self.reason = reason


class DockerUnavailable(DockerError):
    """No daemon to talk to: the socket is missing, refuses connections or is not ours to use."""


class UnixHTTPConnection(HTTPConnection):
    """HTTP/1.1 over a unix socket (the Host header says localhost, as the docker CLI's does)."""

    def __init__(self, path, timeout):
        HTTPConnection.__init__(self, "localhost", timeout=timeout)
        self.socket_path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except Exception:
            sock.close()
            raise
        self.sock = sock


def _daemon_message(body):
    """The daemon's {"message": ...} error body as text (or the body itself)."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    try:
        message = json.loads(text).get("message")
    except (ValueError, AttributeError):
        message = None
    return (message or text).strip()


class FrameDecoder(object):
    """Splits a multiplexed stream, fed in chunks of any size, into (stream, payload) frames."""

    def __init__(self):
        self.buffered = b""

    def feed(self, chunk):
        self.buffered += chunk
        frames = []
        while len(self.buffered) >= FRAME_HEADER.size:
            stream, size = FRAME_HEADER.unpack_from(self.buffered)
            if stream not in (STDIN, STDOUT, STDERR):
                raise DockerError(
                    "not a multiplexed stream: frame header %r (a container with a TTY sends "
                    "raw output)" % self.buffered[: FRAME_HEADER.size]
                )
            end = FRAME_HEADER.size + size
            if len(self.buffered) < end:
                break
            frames.append((stream, self.buffered[FRAME_HEADER.size : end]))
            self.buffered = self.buffered[end:]
        return frames

    def close(self):
        """Checks the stream ended at a frame boundary."""
        if self.buffered:
            raise DockerError(
                "the multiplexed stream ended inside a frame (%d bytes left over)"
                % len(self.buffered)
            )


def demux(data):
    """A whole multiplexed stream as (stdout bytes, stderr bytes); stdin frames count as stdout."""
    decoder = FrameDecoder()
    out, err = [], []
    for stream, payload in decoder.feed(data):
        (err if stream == STDERR else out).append(payload)
    decoder.close()
    return b"".join(out), b"".join(err)


class DockerAPI(object):
    """The Engine API over the daemon's unix socket. Each call opens its own connection, so one
    object may be used from a forked process too. `timeout` bounds every wait for the daemon
    (connecting, and each read of an answer) unless a call gives its own."""

    def __init__(self, socket_path=DEFAULT_SOCKET, timeout=DEFAULT_TIMEOUT):
        self.socket_path = socket_path
        self.timeout = timeout

    @classmethod
    def from_params(cls, params):
        """The client a module's OPTIONS (docker_socket, docker_timeout) name."""
        return cls(params["docker_socket"], params["docker_timeout"])

    # --- HTTP -----------------------------------------------------------------------------

    @staticmethod
    def url(path, query=None):
        if not query:
            return path
        return path + "?" + urlencode(sorted((k, v) for k, v in query.items() if v is not None))

    def open(self, method, path, query=None, body=None, headers=None, timeout=None):
        """Sends a request and returns (connection, response) with the body unread; the caller
        closes the connection. A JSON-serialisable `body` is sent as JSON."""
        timeout = self.timeout if timeout is None else timeout
        headers = dict(headers or {})
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode("utf-8")
            headers.setdefault("Content-Type", "application/json")
        connection = UnixHTTPConnection(self.socket_path, timeout)
        target = self.url(path, query)
        try:
            connection.request(method, target, body=body, headers=headers)
            response = connection.getresponse()
        except Exception as exc:  # noqa: BLE001 (each kind is translated, the rest re-raised)
            connection.close()
            raise self._translate(exc, method, target, timeout) from None
        return connection, response

    def _translate(self, exc, method, target, timeout):
        where = self.socket_path
        if isinstance(exc, socket.timeout):
            return DockerError(
                "the Docker daemon at %s did not answer %s %s within %s s"
                % (where, method, target, timeout)
            )
        code = getattr(exc, "errno", None)
        if code in (errno.ENOENT, errno.ENOTDIR):
            return DockerUnavailable(
                "there is no Docker daemon socket at %s: is Docker installed and running? (the "
                "docker_engine role installs it)" % where
            )
        if code == errno.ECONNREFUSED:
            return DockerUnavailable(
                "nothing answers on %s: the Docker daemon is not running (systemctl status docker)"
                % where
            )
        if code in (errno.EACCES, errno.EPERM):
            return DockerUnavailable(
                "no permission to use %s: run the task with become: true (or as a member of the "
                "docker group)" % where
            )
        if isinstance(exc, (HTTPException, OSError)):
            return DockerError(
                "%s %s on %s failed: %s" % (method, target, where, exc or type(exc).__name__)
            )
        return exc

    @staticmethod
    def _refused(method, target, status, body):
        reason = _daemon_message(body)[:500]
        return DockerError(
            "docker: %s %s: %s %s" % (method, target, status, reason), status=status, reason=reason
        )

    def request(self, method, path, query=None, body=None, headers=None, timeout=None, ok=(200,)):
        """The whole answer as (status, body bytes). A status outside `ok` raises DockerError
        with the daemon's message."""
        connection, response = self.open(method, path, query, body, headers, timeout)
        try:
            try:
                data = response.read()
            except (socket.timeout, HTTPException, OSError) as exc:
                raise self._translate(exc, method, self.url(path, query), timeout) from None
        finally:
            connection.close()
        if response.status not in ok:
            raise self._refused(method, self.url(path, query), response.status, data)
        return response.status, data

    def get_json(self, path, query=None, timeout=None):
        """GET a JSON answer; None when the daemon answers 404 (no such object)."""
        status, data = self.request("GET", path, query, timeout=timeout, ok=(200, 404))
        return None if status == 404 else json.loads(data.decode("utf-8"))

    def post_json(self, path, query=None, body=None, headers=None, timeout=None, ok=(200, 201)):
        """POST; the JSON answer, or None for an empty one (204, 304)."""
        _status, data = self.request("POST", path, query, body, headers, timeout, ok)
        return json.loads(data.decode("utf-8")) if data.strip() else None

    def delete(self, path, query=None, timeout=None):
        """DELETE; False when there was nothing to delete (404)."""
        status, _data = self.request("DELETE", path, query, timeout=timeout, ok=(200, 204, 404))
        return status != 404

    def stream(self, method, path, query=None, body=None, headers=None, timeout=None):
        """Yields the answer's bytes as they come; `timeout` bounds each wait for the next
        chunk. A refused call raises DockerError with the daemon's message."""
        connection, response = self.open(method, path, query, body, headers, timeout)
        target = self.url(path, query)
        try:
            if response.status != 200:
                raise self._refused(method, target, response.status, response.read())
            while True:
                try:
                    chunk = response.read1(65536)
                except (socket.timeout, HTTPException, OSError) as exc:
                    raise self._translate(exc, method, target, timeout) from None
                if not chunk:
                    return
                yield chunk
        finally:
            connection.close()

    def stream_json(self, method, path, query=None, body=None, headers=None, timeout=None):
        """Yields the JSON objects of a JSON-lines answer (a pull's progress events)."""
        buffered = b""
        for chunk in self.stream(method, path, query, body, headers, timeout):
            buffered += chunk
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                if line.strip():
                    yield json.loads(line.decode("utf-8"))
        if buffered.strip():
            yield json.loads(buffered.decode("utf-8"))

    # --- Engine API calls -------------------------------------------------------------------

    @staticmethod
    def _name(name):
        return quote(name, safe="")

    def inspect_container(self, name):
        """GET /containers/NAME/json: the container's inspect object, or None when absent."""
        return self.get_json("/containers/%s/json" % self._name(name))

    def container_logs(self, name, tail=None, timestamps=True, tty=False, timeout=None):
        """GET /containers/NAME/logs: (stdout text, stderr text) of the newest `tail` lines (all
        when None). Without a TTY the answer is the multiplexed stream, decoded here; with one
        (`tty`, from the inspect's Config.Tty) it is raw and all of it counts as stdout."""
        query = {
            "stdout": "1",
            "stderr": "1",
            "timestamps": "1" if timestamps else "0",
            "tail": "all" if tail is None else str(int(tail)),
        }
        chunks = self.stream(
            "GET", "/containers/%s/logs" % self._name(name), query, timeout=timeout
        )
        if tty:
            return b"".join(chunks).decode("utf-8", "replace"), ""
        decoder = FrameDecoder()
        out, err = [], []
        for chunk in chunks:
            for stream, payload in decoder.feed(chunk):
                (err if stream == STDERR else out).append(payload)
        decoder.close()
        return b"".join(out).decode("utf-8", "replace"), b"".join(err).decode("utf-8", "replace")

    def stop_container(self, name, stop_timeout=10):
        """POST /containers/NAME/stop?t=S: True when it was stopped, False when it was not
        running (304) or is gone (404, removed since it was looked at). The wait for the answer
        allows the daemon its SIGTERM-to-SIGKILL time."""
        status, _data = self.request(
            "POST",
            "/containers/%s/stop" % self._name(name),
            {"t": str(int(stop_timeout))},
            timeout=self.timeout + int(stop_timeout),
            ok=(204, 304, 404),
        )
        return status == 204

    def create_container(self, name, body):
        """POST /containers/create?name=NAME with the container's config: its ID."""
        created = self.post_json("/containers/create", {"name": name}, body=body, ok=(201,))
        return created["Id"]

    def start_container(self, name):
        """POST /containers/NAME/start (304: it ran already)."""
        self.request("POST", "/containers/%s/start" % self._name(name), ok=(204, 304))

    def kill_container(self, name, signal):
        """POST /containers/NAME/kill?signal=SIG: False when it was not running (409)."""
        status, _data = self.request(
            "POST",
            "/containers/%s/kill" % self._name(name),
            {"signal": signal},
            ok=(204, 409),
        )
        return status == 204

    def remove_container(self, name):
        """DELETE /containers/NAME?force=1 (a running one is killed): False when it was gone."""
        return self.delete("/containers/%s" % self._name(name), {"force": "1"})

    def list_containers(self, all_containers=True, labels=None):
        """GET /containers/json: the containers (all, or only running ones), those carrying
        every label of `labels` (a list of "key" or "key=value") when given."""
        query = {"all": "1" if all_containers else "0"}
        if labels:
            query["filters"] = json.dumps({"label": list(labels)})
        return self.get_json("/containers/json", query) or []

    def image_id(self, name):
        """GET /images/NAME/json: the local image's ID, or None when the daemon lacks it."""
        found = self.get_json("/images/%s/json" % quote(name, safe="/:@"))
        return found["Id"] if found else None

    def pull_image(self, repository, tag, registry_auth=None, timeout=None):
        """POST /images/create: yields the pull's progress events. `registry_auth` is the
        X-Registry-Auth header's value; `timeout` bounds each wait for the next event. A refusal
        before the stream starts comes as one {"error": message} event, like one in the stream."""
        headers = {"X-Registry-Auth": registry_auth} if registry_auth else {}
        query = {"fromImage": repository, "tag": tag}
        try:
            yield from self.stream_json("POST", "/images/create", query, None, headers, timeout)
        except DockerError as exc:
            if exc.status is None:
                raise
            yield {"error": exc.reason or str(exc)}
