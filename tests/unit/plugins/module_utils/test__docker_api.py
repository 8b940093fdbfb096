"""The collection's Docker access layer (plugins/module_utils/_docker_api.py): the multiplexed
stream decoder over log streams in Docker's framing (tests/unit/fixtures/job/*.multiplexed, see
encode_multiplexed.py there for the format and its source), and the client against a dockerd
stand-in on a unix socket (conftest.py) - JSON calls, streams cut at any byte, stop with its
grace period, listing by label, and the errors when there is no daemon or it is slow."""

import errno
import json
import os
import socket
import struct
from pathlib import Path

import pytest
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _docker_api as api
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _job as job
from job_captures import inspect

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "job"


def frame(stream, payload):
    return bytes([stream, 0, 0, 0]) + struct.pack(">I", len(payload)) + payload


# --- the stream format ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["finished", "killed"])
def test_demux_of_a_log_stream_gives_what_docker_logs_printed(name):
    """The docker CLI splits the same stream into its stdout and stderr."""
    stdout, stderr = api.demux((FIXTURES / f"logs-{name}.multiplexed").read_bytes())
    assert stdout == (FIXTURES / f"logs-{name}.stdout").read_bytes()
    assert stderr == (FIXTURES / f"logs-{name}.stderr").read_bytes()


def test_frames_fed_a_byte_at_a_time_are_the_same_frames():
    data = (FIXTURES / "logs-finished.multiplexed").read_bytes()
    whole = api.FrameDecoder().feed(data)
    decoder, pieces = api.FrameDecoder(), []
    for index in range(len(data)):
        pieces.extend(decoder.feed(data[index : index + 1]))
    decoder.close()
    assert pieces == whole
    assert [stream for stream, _payload in whole].count(api.STDERR) == 2
    assert len(whole) == 8  # one frame per log line: 6 on stdout, 2 on stderr


def test_header_size_is_big_endian_and_stdin_counts_as_stdout():
    long_line = b"x" * 300 + b"\n"  # 0x012d: a size that needs two bytes
    data = frame(2, b"err\n") + frame(0, b"in\n") + frame(1, long_line) + frame(1, b"")
    assert api.FRAME_HEADER.pack(1, len(long_line)) == b"\x01\x00\x00\x00\x00\x00\x01\x2d"
    stdout, stderr = api.demux(data)
    assert stdout == b"in\n" + long_line
    assert stderr == b"err\n"


def test_a_stream_that_ends_inside_a_frame_is_an_error():
    data = frame(1, b"complete\n") + frame(2, b"cut short\n")[:-3]
    with pytest.raises(api.DockerError, match="ended inside a frame"):
        api.demux(data)


def test_raw_output_is_not_taken_for_frames():
    """A TTY container's log is raw text: its first byte is no stream type."""
    raw = (FIXTURES / "logs-finished.stdout").read_bytes()
    with pytest.raises(api.DockerError, match="not a multiplexed stream"):
        api.demux(raw)


# --- the client against a daemon ------------------------------------------------------------


def test_inspect_a_container_and_a_missing_one(dockerd, socket_path):
    dockerd.add_container("llamafactory-demo", inspect("running"))
    docker = api.DockerAPI(socket_path, timeout=10)
    found = docker.inspect_container("llamafactory-demo")
    assert found["Id"] == inspect("running")["Id"]
    assert docker.inspect_container("llamafactory-other") is None
    assert [r[1] for r in dockerd.requests] == [
        "/containers/llamafactory-demo/json",
        "/containers/llamafactory-other/json",
    ]


def test_logs_with_tail_decode_to_the_newest_lines(dockerd, socket_path):
    stream = (FIXTURES / "logs-finished.multiplexed").read_bytes()
    dockerd.add_container("rank0", inspect("exited-0"), stream)
    docker = api.DockerAPI(socket_path, timeout=10)
    stdout, stderr = docker.container_logs("rank0", tail=3)
    (_method, _path, query, _headers, _body) = dockerd.requests[-1]
    assert query == {"stdout": "1", "stderr": "1", "timestamps": "1", "tail": "3"}
    lines, last = job.parse_logs(stdout, stderr)
    everything, newest = job.parse_logs(
        (FIXTURES / "logs-finished.stdout").read_text(),
        (FIXTURES / "logs-finished.stderr").read_text(),
    )
    assert lines == everything[-3:]
    assert last == newest
    assert docker.container_logs("rank0") == (
        (FIXTURES / "logs-finished.stdout").read_text(),
        (FIXTURES / "logs-finished.stderr").read_text(),
    )
    assert dockerd.requests[-1][2]["tail"] == "all"


def test_logs_of_a_tty_container_are_raw(dockerd, socket_path):
    tty = inspect("running")
    tty["Config"]["Tty"] = True
    dockerd.add_container("tty", tty, (FIXTURES / "logs-finished.multiplexed").read_bytes())
    stdout, stderr = api.DockerAPI(socket_path).container_logs("tty", tail=2, tty=True)
    assert stderr == ""
    assert len(stdout.splitlines()) == 2 and stdout.endswith("'text-generation'}}\n")


def test_stop_waits_its_grace_period_and_is_idempotent(dockerd, socket_path):
    dockerd.add_container("rank1", inspect("running"))
    docker = api.DockerAPI(socket_path, timeout=5)
    assert docker.stop_container("rank1", stop_timeout=7) is True
    method, path, query, _headers, _body = dockerd.requests[-1]
    assert (method, path, query) == ("POST", "/containers/rank1/stop", {"t": "7"})
    assert docker.inspect_container("rank1")["State"]["Status"] == "exited"
    assert docker.stop_container("rank1", stop_timeout=7) is False  # 304: not running
    assert docker.stop_container("gone", stop_timeout=7) is False  # 404: removed meanwhile


def test_list_containers_by_label(dockerd, socket_path):
    dockerd.add_container("rank0", inspect("exited-0"))
    dockerd.add_container("rank1", inspect("running"))
    docker = api.DockerAPI(socket_path)
    label = "hostnet.llamafactory.rank"
    names = [c["Names"] for c in docker.list_containers(labels=[label])]
    assert names == [["/rank0"], ["/rank1"]]
    running = docker.list_containers(all_containers=False, labels=[label])
    assert [c["Names"] for c in running] == [["/rank1"]]
    assert docker.list_containers(labels=[f"{label}=7"]) == []
    assert json.loads(dockerd.requests[-1][2]["filters"]) == {"label": [f"{label}=7"]}


def test_a_refused_call_carries_the_daemons_message(dockerd, socket_path):
    docker = api.DockerAPI(socket_path)
    with pytest.raises(api.DockerError) as caught:
        docker.post_json("/containers/nothing/start")
    assert caught.value.status == 404
    assert caught.value.reason == "No such container: nothing"
    assert "POST /containers/nothing/start: 404 No such container: nothing" in str(caught.value)
    assert docker.delete("/containers/nothing") is False


def test_a_json_body_is_sent_as_json(dockerd, socket_path):
    docker = api.DockerAPI(socket_path)
    with pytest.raises(api.DockerError):
        docker.post_json("/containers/create", {"name": "x"}, body={"Image": "busybox"})
    _method, path, query, headers, body = dockerd.requests[-1]
    assert (path, query) == ("/containers/create", {"name": "x"})
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"Image": "busybox"}


def test_no_socket_says_docker_is_missing(tmp_path):
    docker = api.DockerAPI(str(tmp_path / "docker.sock"))
    with pytest.raises(api.DockerUnavailable, match=r"no Docker daemon socket at .*docker\.sock"):
        docker.inspect_container("x")


def test_a_socket_without_a_daemon_says_it_is_not_running(socket_path):
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(socket_path)  # the file stays; nobody listens
    dead.close()
    with pytest.raises(api.DockerUnavailable, match="not running") as caught:
        api.DockerAPI(socket_path).image_id("busybox")
    assert caught.value.status is None


@pytest.mark.skipif(os.geteuid() == 0, reason="root may use any socket")
def test_a_socket_of_another_user_asks_for_become(dockerd, socket_path):
    os.chmod(socket_path, 0)
    with pytest.raises(api.DockerUnavailable, match="become"):
        api.DockerAPI(socket_path).image_id("busybox")


def test_a_slow_daemon_times_out_naming_the_call(dockerd, socket_path):
    dockerd.delay = 1.5
    with pytest.raises(api.DockerError, match=r"did not answer GET /containers/x/json within 0.3"):
        api.DockerAPI(socket_path, timeout=0.3).inspect_container("x")


def test_translate_keeps_errno_meaning():
    docker = api.DockerAPI("/run/x.sock")
    refused = docker._translate(OSError(errno.ECONNREFUSED, "refused"), "GET", "/x", 1)
    assert isinstance(refused, api.DockerUnavailable)
    other = docker._translate(OSError(errno.EPIPE, "broken pipe"), "GET", "/x", 1)
    assert not isinstance(other, api.DockerUnavailable) and "broken pipe" in str(other)
