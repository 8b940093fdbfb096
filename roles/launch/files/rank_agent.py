# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rank's agent: PID 1 of every rank's container, it runs the training command and stops it
when another rank of the job is gone, without the controller.

    python3 rank_agent.py AGENT.json -- llamafactory-cli train config.yaml

Why: a rank whose process dies is noticed by the others in seconds (its kernel resets their
connections), but a node that vanishes (preempted, partitioned, frozen) resets nothing, and the
others wait in their collective until its timeout. torchrun's elastic agents do not cover it:
they restart a node's own failed workers, and notice new nodes, but a node that left is noticed
only through that same collective timeout. So every agent answers on a TCP port of the training
NIC with its rank's state, and asks every other rank's agent every few seconds:

- a rank that has not answered for `peer_timeout` seconds (after it answered once), or has never
  answered `rendezvous_timeout` seconds after the start, is lost;
- a rank that answers "exited" with a code other than 0 has failed.

Either way this agent stops its own training (SIGTERM to the process group, SIGKILL after
`stop_grace` seconds) and exits with EXIT_PEER_LOST. Liveness is the agent's answer, not the
log: a rank that saves or evaluates for an hour in silence still answers. When its own training
exits the agent answers "exited" for a few more seconds so that the others learn the code, then
exits with the training's code (128 + N for a signal N, as a shell reports it).

AGENT.json: job, rank, address and port to listen on, peers ({rank: address}, every rank's
agent listens on the same port), peer_timeout, rendezvous_timeout, interval, stop_grace.
Python 3.6+, standard library only: it runs in whatever image the job uses.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

EXIT_PEER_LOST = 75  # EX_TEMPFAIL: this rank was fine; another was lost (a restart can cure it)
PREFIX = "[hostnet.llamafactory agent]"


def log(message):
    sys.stderr.write(f"{PREFIX} {message}\n")
    sys.stderr.flush()


def exit_code(returncode):
    """A child's returncode as the container's exit code (a signal N gives 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


class Peer:
    def __init__(self, rank, address):
        self.rank = rank
        self.address = address
        self.first_seen = None
        self.last_seen = None
        self.state = None  # the peer's last answer
        self.warned = False

    def name(self, port):
        return f"rank {self.rank} ({self.address}:{port})"


def judge(peers, now, started, settings):
    """Why this rank must stop, or None. Pure: the agent's decision, unit-tested."""
    port = settings["port"]
    for peer in peers:
        state = peer.state or {}
        if state.get("state") == "exited" and state.get("code") not in (0, None):
            why = state.get("why")
            return "{} exited with code {}{}".format(
                peer.name(port),
                state.get("code"),
                f" ({why})" if why else "",
            )
        if state.get("state") == "exited":
            continue  # finished: no longer expected to answer
        if peer.last_seen is None:
            if settings["rendezvous_timeout"] and now - started > settings["rendezvous_timeout"]:
                return (
                    f"{peer.name(port)} never answered in {settings['rendezvous_timeout']} s "
                    "(rendezvous_timeout): its node is down, its rank was not started, or port "
                    f"{port} is blocked between the nodes"
                )
        elif settings["peer_timeout"] and now - peer.last_seen > settings["peer_timeout"]:
            return (
                f"{peer.name(port)} has not answered for {now - peer.last_seen:.0f} s "
                f"(peer_timeout {settings['peer_timeout']} s): its node is gone, frozen or cut off"
            )
    return None


def ask(peer, port, job, timeout):
    """The peer agent's answer (a dict), or None when it does not answer for this job."""
    try:
        conn = socket.create_connection((peer.address, port), timeout=timeout)
    except (TimeoutError, OSError):
        return None
    try:
        conn.settimeout(timeout)
        data = b""
        while len(data) < 65536 and not data.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
        answer = json.loads(data.decode("utf-8"))
    except (TimeoutError, OSError, ValueError):
        return None
    finally:
        conn.close()
    if not isinstance(answer, dict) or answer.get("job") != job or answer.get("rank") != peer.rank:
        return None
    return answer


class Agent:
    def __init__(self, settings, command):
        self.settings = settings
        self.command = command
        self.peers = sorted(
            (Peer(int(rank), address) for rank, address in settings["peers"].items()),
            key=lambda peer: peer.rank,
        )
        self.state = {"job": settings["job"], "rank": settings["rank"], "state": "starting"}
        self.lock = threading.Lock()
        self.child = None
        self.terminated = False

    def answer(self):
        with self.lock:
            return (json.dumps(self.state) + "\n").encode("utf-8")

    def set_state(self, **state):
        with self.lock:
            self.state.update(state)

    def serve(self, server):
        while True:
            try:
                conn, _peer = server.accept()
            except OSError:
                return
            try:
                conn.settimeout(2)
                conn.sendall(self.answer())
            except OSError:
                pass
            finally:
                conn.close()

    def listen(self):
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((self.settings["address"], self.settings["port"]))
        server.listen(64)
        thread = threading.Thread(target=self.serve, args=(server,))
        thread.daemon = True
        thread.start()
        return server

    def poll_peers(self, now):
        timeout = max(1.0, min(3.0, self.settings["interval"]))
        answers = {}

        def one(peer):
            answers[peer.rank] = ask(peer, self.settings["port"], self.settings["job"], timeout)

        threads = [threading.Thread(target=one, args=(p,)) for p in self.peers]
        for thread in threads:
            thread.daemon = True
            thread.start()
        for thread in threads:
            thread.join(timeout + 1)
        for peer in self.peers:
            answer = answers.get(peer.rank)
            if answer is None:
                continue
            if peer.first_seen is None:
                peer.first_seen = now
            peer.last_seen = now
            peer.state = answer

    def stop_child(self):
        if self.child is None or self.child.poll() is not None:
            return
        try:
            os.killpg(self.child.pid, signal.SIGTERM)
        except OSError:
            return
        deadline = time.time() + self.settings["stop_grace"]
        while self.child.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        if self.child.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.child.pid, signal.SIGKILL)
            self.child.wait()

    def on_signal(self, signum, _frame):
        self.terminated = True
        log(f"rank {self.settings['rank']}: signal {signum}, stopping the training")

    def linger(self):
        """Keep answering until every peer still answering saw the end (at most 2 intervals +
        2 s): a peer that is gone is not waited for."""
        interval = self.settings["interval"]
        deadline = time.time() + 2 * interval + 2
        while time.time() < deadline:
            now = time.time()
            waiting = [
                p
                for p in self.peers
                if (p.state or {}).get("state") != "exited"
                and p.last_seen is not None
                and now - p.last_seen <= 2 * interval
            ]
            if not waiting:
                return
            time.sleep(1)
            self.poll_peers(time.time())

    def run(self):
        settings = self.settings
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        try:
            server = self.listen()
        except OSError as exc:
            log(
                f"rank {settings['rank']}: cannot listen on {settings['address']}:"
                f"{settings['port']} ({exc}): the other ranks are not watched"
            )
            server = None
        if server is not None and self.peers:
            watched = ", ".join(p.name(settings["port"]) for p in self.peers)
            log(
                f"rank {settings['rank']}: watching {watched}; a rank silent for "
                f"{settings['peer_timeout']} s stops this one"
            )
        started = time.time()
        try:
            self.child = subprocess.Popen(self.command, start_new_session=True)
        except OSError as exc:
            log(f"rank {settings['rank']}: cannot start {self.command[0]}: {exc}")
            self.set_state(state="exited", code=127, why=f"cannot start {self.command[0]}")
            if server is not None:
                self.linger()
            return 127
        self.set_state(state="running", pid=self.child.pid, started=started)
        why = None
        while True:
            returncode = self.child.poll()
            if returncode is not None or self.terminated:
                break
            if server is not None:
                now = time.time()
                self.poll_peers(now)
                why = judge(self.peers, now, started, settings)
                if why:
                    break
            slept = 0.0
            while slept < settings["interval"] and not self.terminated:
                if self.child.poll() is not None:
                    break
                time.sleep(0.2)
                slept += 0.2
        if why:
            log(f"rank {settings['rank']}: stopping this rank: {why}")
            self.set_state(state="stopping", why=why)
            self.stop_child()
            code = EXIT_PEER_LOST
            self.set_state(state="exited", code=code, why=f"stopped by its agent: {why}")
        else:
            if self.terminated:
                self.stop_child()
            code = exit_code(self.child.wait())
            self.set_state(state="exited", code=code)
            log(f"rank {settings['rank']}: the training exited with code {code}")
        if server is not None and not self.terminated:
            self.linger()
        return code


def main(argv):
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: rank_agent.py AGENT.json -- COMMAND...\n")
        return 2
    with open(argv[1]) as handle:
        settings = json.load(handle)
    return Agent(settings, argv[3:]).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
