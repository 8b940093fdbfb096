# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rank's agent: PID 1 of every rank's container, it runs the training command, stops it
when another rank of the job is gone, and restarts the job from the newest common checkpoint
after a rank's process was killed - all without the controller.

    python3 rank_agent.py AGENT.json -- llamafactory-cli train config.yaml

Why: a rank whose process dies is noticed by the others in seconds (its kernel resets their
connections), but a node that vanishes (preempted, partitioned, frozen) resets nothing, and the
others wait in their collective until its timeout. torchrun's elastic agents do not cover it:
they restart a node's own failed workers, and notice new nodes, but a node that left is noticed
only through that same collective timeout. So every agent answers on a TCP port of the training
NIC with its rank's state, and asks every other rank's agent every few seconds:

- a rank that has not answered for `peer_timeout` seconds (after it answered once), or has never
  answered `rendezvous_timeout` seconds after the start, is lost;
- a rank whose training ended with a code other than 0 has failed.

Either way this agent stops its own training (SIGTERM to the process group, SIGKILL after
`stop_grace` seconds). Liveness is the agent's answer, not the log: a rank that saves or
evaluates for an hour in silence still answers.

The job's time limit (`deadline`, seconds since the epoch, from the controller's
gcp_instances_max_duration): at it, every agent stops its training and exits with
EXIT_MAX_DURATION, which no restart retries - a cap on cost that holds with the controller gone.

Restarts on the nodes (`max_restarts`): when an attempt ends, every agent publishes how its
rank ended and waits (bounded) for the others' ends. The job restarts when a rank's training was
killed (SIGKILL, not by the OOM killer) and no rank failed in a way a restart cannot cure (out of
memory, a lost or unreachable node: only the controller can start a VM, a stop on purpose, the
same failure at the same step twice). A rank that merely errored (exit 1) after another was
killed is its consequence, not a cause. Then every agent announces the attempt it is ready for
with the complete checkpoints it holds, waits until every other agent announced it too, and
relaunches from the newest checkpoint all of them hold - unless a node holds no checkpoint while
another does (its disk lost): the controller restores or names it. Anything else ends the job:
the agent exits with its training's code (128 + N for a signal N, as a shell reports it), or
EXIT_PEER_LOST when it stopped its training because of another rank.

The network profile's environment (GPU VMs): when AGENT.json has `network` ({env_script,
library_path}), the training starts with env_script sourced (Google's tuned NCCL values for the
plugin), the container's own environment (the image's and the job's values) on top, and
library_path first on LD_LIBRARY_PATH, as Google's recipes run NCCL in a container. The
preflight's smoke test does the same in shell.

AGENT.json: job, rank, address and port to listen on, peers ({rank: address}, every rank's
agent listens on the same port), peer_timeout, rendezvous_timeout, interval, stop_grace,
max_restarts (of the job, restarts_before of them made by the controller before this launch),
output_dir (checkpoints, trainer_log.jsonl), state_file (the agent's state, JSON,
for the controller's wait). Python 3.6+, standard library only: it runs in whatever image the job
uses.
"""

import collections
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

EXIT_PEER_LOST = 75  # EX_TEMPFAIL: this rank was fine; another was lost (a restart can cure it)
EXIT_MAX_DURATION = 124  # as timeout(1): the job ran to its time limit (not retried)
PREFIX = "[hostnet.llamafactory agent]"
CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
# torchrun's summary when a worker died of SIGKILL: its root cause names the signal.
ROOT_CAUSE = "Root Cause (first observed failure)"
KILLED_WORKER = re.compile(r"exitcode\s*:\s*-9\b|Signal 9 \(SIGKILL\)")
# llamafactory-cli when the torchrun it started was killed (subprocess.CalledProcessError).
KILLED_LAUNCHER = re.compile(r"Command '\[.torchrun.*died with <Signals\.SIGKILL: 9>")
RELAUNCH_ARGS = ("resume_from_checkpoint=", "overwrite_output_dir=")

# How an attempt ended on one rank ("kind" of its end):
CURABLE = ("killed",)  # a restart can cure it
# A restart cannot cure these, or must not:
INCURABLE = ("oom", "lost", "unreachable", "stopped", "cannot-start", "max-duration")
# "error" (an exit code of its own) and "peer" (stopped because another rank failed) follow the
# others: a consequence of a kill elsewhere, or the job's own failure when nothing was killed.


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


def _attempt(state):
    return (state or {}).get("attempt", 0)


def judge(peers, now, started, settings, attempt=0):
    """Why this rank must stop, or None. Pure: the agent's decision, unit-tested.
    Returns (kind, why): kind "lost" (silent after answering), "unreachable" (never answered)
    or "peer" (another rank's training ended with an error in this attempt)."""
    port = settings["port"]
    for peer in peers:
        state = peer.state or {}
        ended = state.get("state") in ("exited", "ended")
        if ended and state.get("code") not in (0, None) and _attempt(state) >= attempt:
            why = state.get("why")
            return "peer", "{} exited with code {}{}".format(
                peer.name(port),
                state.get("code"),
                f" ({why})" if why else "",
            )
        if state.get("state") == "exited":
            continue  # finished: no longer expected to answer
        if peer.last_seen is None:
            if settings["rendezvous_timeout"] and now - started > settings["rendezvous_timeout"]:
                return "unreachable", (
                    f"{peer.name(port)} never answered in {settings['rendezvous_timeout']} s "
                    "(rendezvous_timeout): its node is down, its rank was not started, or port "
                    f"{port} is blocked between the nodes"
                )
        elif settings["peer_timeout"] and now - peer.last_seen > settings["peer_timeout"]:
            return "lost", (
                f"{peer.name(port)} has not answered for {now - peer.last_seen:.0f} s "
                f"(peer_timeout {settings['peer_timeout']} s): its node is gone, frozen or cut off"
            )
    return None


def past_deadline(peers, now, settings):
    """Why the job's time limit ends this rank, or None: the deadline passed on this node's
    clock, or another rank already stopped at it (a clock behind by a few seconds must not
    make this rank's stop look like a failure a restart could cure)."""
    deadline = settings.get("deadline")
    if not deadline:
        return None
    limit = settings.get("max_duration")
    named = f"gcp_instances_max_duration ({limit} s)" if limit else "the job's time limit"
    if now >= deadline:
        return f"the job ran to {named}"
    for peer in peers:
        if (peer.state or {}).get("code") == EXIT_MAX_DURATION:
            return f"the job ran to {named} (rank {peer.rank} stopped at it)"
    return None


def classify(code, output, oom):
    """How a rank's own training ended: (kind, why). `output` is the end of its output, `oom`
    whether the kernel's OOM killer killed a process of this container meanwhile."""
    if code == 0:
        return "done", "finished"
    if oom:
        return "oom", f"killed by the kernel's OOM killer (exit {code})"
    if code == 137:
        return "killed", "killed (SIGKILL, exit 137)"
    summary = output[output.rfind(ROOT_CAUSE) :] if ROOT_CAUSE in output else ""
    if summary and KILLED_WORKER.search(summary):
        return "killed", f"a worker was killed (SIGKILL; the launcher exited {code})"
    if KILLED_LAUNCHER.search(output[-4096:]):
        return "killed", f"torchrun was killed (SIGKILL; llamafactory-cli exited {code})"
    return "error", f"exited with code {code}"


def failure_step(ends):
    """The step the job failed at: the newest any rank's trainer log names, or None."""
    return max([end.get("step") or 0 for end in ends.values()] or [0]) or None


def restart_decision(ends, restarts, max_restarts, before=0):
    """Whether the job restarts on the nodes after an attempt. `ends` maps rank -> {kind, why,
    step} for every rank (a rank that did not tell counts as lost), `restarts` this agent's
    restarts so far ({kind, step}), `before` the controller's before this launch. Returns
    (restart, cause, why). Pure, unit-tested."""
    ranks = sorted(ends)
    kinds = [ends[r]["kind"] for r in ranks]
    incurable = [r for r in ranks if ends[r]["kind"] in INCURABLE]
    curable = [r for r in ranks if ends[r]["kind"] in CURABLE]
    step = failure_step(ends)
    first = (incurable or curable or [r for r in ranks if ends[r]["kind"] != "done"] or ranks)[0]
    why = ends[first]["why"]
    cause = why if why.startswith("rank ") else f"rank {first} {why}"
    if all(kind == "done" for kind in kinds):
        return False, None, "finished"
    if incurable:
        kind = ends[first]["kind"]
        reasons = {
            "oom": "out of memory: the same step needs the same memory again",
            "lost": "a node is gone: only the controller (attached or re-attached) starts VMs",
            "unreachable": "a rank never answered: it was not started or its port is blocked",
            "stopped": "stopped on purpose (SIGTERM: playbooks/stop.yml or docker stop)",
            "cannot-start": "the training command cannot start",
        }
        return False, cause, reasons[kind]
    if not curable:
        return (
            False,
            cause,
            (
                "a rank failed on its own: a bad config, a missing dataset or an error in the "
                "training would fail again"
            ),
        )
    if before + len(restarts) >= max_restarts:
        return False, cause, f"no restart left (max_restarts {max_restarts})"
    if restarts and restarts[-1].get("kind") == "killed" and restarts[-1].get("step") == step:
        return False, cause, f"the same failure (killed) at the same step ({step}) twice"
    return True, cause, "a killed rank can be started again"


def complete_checkpoints(output_dir):
    """Steps of the checkpoints this node can resume from: checkpoint-N folders holding the
    trainer state and, when the run used DeepSpeed, their global_stepN shard folder (the rule of
    plugins/module_utils/_job.py complete_checkpoints, which the controller applies)."""
    steps = []
    try:
        names = os.listdir(output_dir)
    except OSError:
        return steps
    for name in names:
        match = CHECKPOINT.match(name)
        if not match:
            continue
        step = int(match.group(1))
        try:
            children = set(os.listdir(os.path.join(output_dir, name)))
        except OSError:
            continue
        if "trainer_state.json" not in children:
            continue
        deepspeed = [c for c in children if c.startswith(("global_step", "zero_")) or c == "latest"]
        if deepspeed and f"global_step{step}" not in children:
            continue
        steps.append(step)
    return sorted(steps)


def missing_checkpoint(mine, theirs):
    """Whether a node holds no checkpoint while another does: starting over would lose the
    training so far, so the agents leave the restart to the controller (which restores the
    node's part from the bucket, or names the node)."""
    held = [list(c) for c in [mine, *theirs]]
    return any(held) and not all(held)


def last_step(output_dir):
    """The last step trainer_log.jsonl names (rank 0's node writes it), or None."""
    try:
        with open(os.path.join(output_dir, "trainer_log.jsonl"), "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 8192))
            lines = handle.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return int(json.loads(line)["current_steps"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def oom_kills():
    """Processes of this container killed by the OOM killer so far (cgroup v2, else v1), or
    None when the cgroup does not say."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path) as handle:
                for line in handle:
                    key, _sep, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def relaunch_command(command, output_dir, resume, fresh):
    """The training command for a restart: the launch's own resume arguments replaced."""
    base = [arg for arg in command if not arg.startswith(RELAUNCH_ARGS)]
    if resume is not None:
        return [*base, f"resume_from_checkpoint={output_dir}/checkpoint-{resume}"]
    return base + (["overwrite_output_dir=true"] if fresh else [])


class NetworkEnvError(Exception):
    """The network profile's environment cannot be made; the message names the fix."""


def network_env(network, environ, shell=None):
    """The training's environment for the network profile `network` ({env_script,
    library_path}; empty for the socket profile: `environ` as it is)."""
    network = network or {}
    env = dict(environ)
    script = network.get("env_script")
    if script:
        if not os.path.isfile(script):
            raise NetworkEnvError(
                f"the network plugin's environment script {script} is not in the container: "
                "the plugin is not installed on this node, or its folder is not mounted "
                "(run the playbook's host setup, or set llamafactory_network_profile=socket)"
            )
        shell = shell or ("/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh")
        # The script's own output goes to stderr: stdout carries the environment, NUL-separated.
        try:
            sourced = subprocess.run(  # noqa: UP022 (capture_output: Python 3.7+)
                [shell, "-c", 'set -a; . "$0" 1>&2; exec env -0', script],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NetworkEnvError(f"sourcing {script} failed: {exc}") from exc
        if sourced.returncode != 0:
            detail = sourced.stderr.decode("utf-8", "replace").strip()[-500:]
            raise NetworkEnvError(f"sourcing {script} failed (exit {sourced.returncode}): {detail}")
        env = dict(
            item.split("=", 1)
            for item in sourced.stdout.decode("utf-8", "replace").split("\0")
            if "=" in item
        )
        env.update(environ)  # the container's values win; the script adds what it lacks
    paths = list(network.get("library_path") or [])
    if paths:
        current = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
        env["LD_LIBRARY_PATH"] = ":".join(dict.fromkeys(paths + current))
    return env


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


class Output:
    """Copies the training's output to the agent's own (the container's log), keeping its end
    for classify()."""

    def __init__(self, size=65536):
        self.size = size
        self.chunks = collections.deque()
        self.kept = 0
        self.lock = threading.Lock()
        self.threads = []
        self.last_at = time.time()  # of the newest output (the wait's stall check)

    def follow(self, source, sink):
        def copy():
            while True:
                try:
                    data = os.read(source.fileno(), 65536)
                except OSError:
                    data = b""
                if not data:
                    source.close()
                    return
                with contextlib.suppress(OSError, ValueError):
                    sink.write(data)
                    sink.flush()
                with self.lock:
                    self.last_at = time.time()
                    self.chunks.append(data)
                    self.kept += len(data)
                    while self.kept - len(self.chunks[0]) >= self.size:
                        self.kept -= len(self.chunks.popleft())

        thread = threading.Thread(target=copy)
        thread.daemon = True
        thread.start()
        self.threads.append(thread)

    def text(self, timeout=5):
        for thread in self.threads:
            thread.join(timeout)
        self.threads = []
        with self.lock:
            data = b"".join(self.chunks)
            self.chunks.clear()
            self.kept = 0
        return data.decode("utf-8", "replace")


class Agent:
    def __init__(self, settings, command):
        self.settings = settings
        self.command = list(command)
        self.peers = sorted(
            (Peer(int(rank), address) for rank, address in settings["peers"].items()),
            key=lambda peer: peer.rank,
        )
        self.state = {
            "job": settings["job"],
            "rank": settings["rank"],
            "state": "starting",
            "attempt": 0,
            "restarts": [],
        }
        self.lock = threading.Lock()
        self.child = None
        self.output = None
        self.terminated = False

    def answer(self):
        quiet = None if self.output is None else round(time.time() - self.output.last_at, 1)
        with self.lock:
            return (json.dumps(dict(self.state, quiet_s=quiet)) + "\n").encode("utf-8")

    def view(self):
        """What this agent knows of every peer, for the state file (the controller's wait reads
        rank 0's instead of asking every node): each peer's last answer and when it came."""
        return dict(
            (
                str(peer.rank),
                {
                    "seen_at": peer.last_seen,
                    "answer": dict(
                        (key, value)
                        for key, value in (peer.state or {}).items()
                        if key in ("state", "attempt", "code", "end", "why", "quiet_s")
                    ),
                },
            )
            for peer in self.peers
        )

    def addresses(self):
        """Every rank's training address as this agent was given them (by rank), for the state
        file: the collect step records them after playbooks/wait.yml, which finds no NIC."""
        found = dict((str(peer.rank), peer.address) for peer in self.peers)
        found[str(self.settings["rank"])] = self.settings["address"]
        return found

    def set_state(self, **state):
        with self.lock:
            self.state.update(state)
            text = json.dumps(dict(self.state, peers=self.view(), addresses=self.addresses()))
        path = self.settings.get("state_file")
        if path:
            with contextlib.suppress(OSError):
                with open(path + ".tmp", "w") as handle:
                    handle.write(text + "\n")
                os.rename(path + ".tmp", path)

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
        self.set_state()  # the peers' view, for the controller's wait

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

    def end_group(self):
        """Kill what the training left in its process group (workers whose launcher died)."""
        with contextlib.suppress(OSError):
            os.killpg(self.child.pid, signal.SIGKILL)

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

    def start(self, command):
        """Start the training; False when it cannot start."""
        self.output = Output()
        try:
            env = network_env(self.settings.get("network"), os.environ)
            self.child = subprocess.Popen(
                command,
                start_new_session=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
        except (OSError, NetworkEnvError) as exc:
            log(f"rank {self.settings['rank']}: cannot start {command[0]}: {exc}")
            return False
        self.output.follow(self.child.stdout, sys.stdout.buffer)
        self.output.follow(self.child.stderr, sys.stderr.buffer)
        return True

    def watch(self, watching):
        """Run one attempt until the training exits, a signal comes or another rank fails.
        Returns (kind, why, code)."""
        settings = self.settings
        attempt = self.state["attempt"]
        started = time.time()
        ooms = oom_kills()
        found = None
        while True:
            returncode = self.child.poll()
            if returncode is not None or self.terminated:
                break
            now = time.time()
            if watching:
                self.poll_peers(now)
            limit = past_deadline(self.peers, now, settings)
            if limit:
                found = ("max-duration", limit)
                break
            if watching:
                found = judge(self.peers, now, started, settings, attempt)
                if found:
                    break
            slept = 0.0
            while slept < settings["interval"] and not self.terminated:
                if self.child.poll() is not None:
                    break
                time.sleep(0.2)
                slept += 0.2
        if found:
            log(f"rank {settings['rank']}: stopping this rank: {found[1]}")
            self.set_state(state="stopping", why=found[1])
        if found or self.terminated:
            self.stop_child()
        code = exit_code(self.child.wait())
        self.end_group()
        output = self.output.text()
        if found:
            return (
                found[0],
                found[1],
                (EXIT_MAX_DURATION if found[0] == "max-duration" else EXIT_PEER_LOST),
            )
        if self.terminated:
            return "stopped", f"stopped on purpose (exit {code})", code
        now_ooms = oom_kills()
        oom = ooms is not None and now_ooms is not None and now_ooms > ooms
        kind, why = classify(code, output, oom)
        log(f"rank {settings['rank']}: the training exited with code {code}")
        return kind, why, code

    def gather(self, attempt, deadline):
        """Every rank's end of `attempt`: {rank: {kind, why, step}}; a rank silent for
        peer_timeout, or that has not told by the deadline, counts as lost."""
        while True:
            now = time.time()
            self.poll_peers(now)
            ends = {}
            for peer in self.peers:
                state = peer.state or {}
                told = state.get("end") and (
                    _attempt(state) > attempt
                    or (_attempt(state) == attempt and state.get("state") in ("ended", "exited"))
                )
                timeout = self.settings["peer_timeout"]
                silent = peer.last_seen is not None and timeout and now - peer.last_seen > timeout
                if told:
                    ends[peer.rank] = state["end"]
                elif silent:
                    ends[peer.rank] = {"kind": "lost", "why": "stopped answering"}
            if len(ends) == len(self.peers) or now > deadline or self.terminated:
                for peer in self.peers:
                    ends.setdefault(peer.rank, {"kind": "lost", "why": "did not say how it ended"})
                return ends
            time.sleep(1)

    def barrier(self, attempt, deadline):
        """Wait until every agent announced `attempt`. Returns their checkpoint lists, or None
        when one gave up or the deadline passed."""
        while time.time() < deadline and not self.terminated:
            self.poll_peers(time.time())
            states = [p.state or {} for p in self.peers]
            if all(_attempt(s) >= attempt for s in states):  # joined (or already through)
                return [s.get("checkpoints") or [] for s in states]
            if any(s.get("state") == "exited" and _attempt(s) < attempt for s in states):
                return None  # gave up
            time.sleep(1)
        return None

    def restart(self, attempt, cause, step):
        """Announce the next attempt, wait for every agent, relaunch from the newest common
        checkpoint. Returns the new command, or None."""
        settings = self.settings
        output_dir = settings.get("output_dir") or ""
        mine = complete_checkpoints(output_dir) if output_dir else []
        self.set_state(state="restarting", attempt=attempt + 1, checkpoints=mine)
        deadline = time.time() + self.settle_s()
        theirs = self.barrier(attempt + 1, deadline)
        if theirs is None:
            log(f"rank {settings['rank']}: not restarted: another rank did not join the restart")
            return None
        if missing_checkpoint(mine, theirs):
            log(
                f"rank {settings['rank']}: not restarted on the nodes: a node holds no checkpoint "
                "while another does (its disk lost or wiped?): the controller restores it from "
                "llamafactory_output_uri, or names it"
            )
            return None
        common = set(mine).intersection(*[set(c) for c in theirs])
        resume = max(common) if common else None
        fresh = resume is None and bool(mine or any(theirs))
        if resume is not None:
            latest = os.path.join(output_dir, f"checkpoint-{resume}", "latest")
            if not os.path.exists(latest):  # DeepSpeed marks the checkpoint on rank 0 only
                with contextlib.suppress(OSError), open(latest, "w") as handle:
                    handle.write(f"global_step{resume}")
        lost = (step or 0) - (resume or 0)
        report = {
            "attempt": attempt + 1,
            "kind": "killed",
            "cause": cause,
            "step": step,
            "resume": resume,
            "lost": lost,
        }
        report["message"] = (
            f"restart {settings.get('restarts_before', 0) + len(self.state['restarts']) + 1} of "
            f"{settings.get('max_restarts', 0)} on the nodes after "
            f"{cause} at step {step if step is not None else '?'}: "
            + (
                f"resuming from checkpoint-{resume}"
                if resume is not None
                else "starting over (no checkpoint every rank holds)"
            )
            + f", {lost} steps lost"
        )
        self.set_state(restarts=[*self.state["restarts"], report])
        log(report["message"])
        return relaunch_command(self.command, output_dir, resume, fresh)

    def settle_s(self):
        """How long agents wait for each other between attempts: a rank's stop, its polls."""
        return self.settings["stop_grace"] + 4 * self.settings["interval"] + 10

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
        self.set_state(state="starting")  # replaces the state file of an earlier launch
        watching = server is not None and bool(self.peers)
        if watching:
            watched = ", ".join(p.name(settings["port"]) for p in self.peers)
            log(
                f"rank {settings['rank']}: watching {watched}; a rank silent for "
                f"{settings['peer_timeout']} s stops this one"
            )
        command = self.command
        while True:
            attempt = self.state["attempt"]
            if not self.start(command):
                kind, why, code = "cannot-start", f"cannot start {command[0]}", 127
            else:
                self.set_state(
                    state="running", pid=self.child.pid, started=time.time(), end=None, code=None
                )
                kind, why, code = self.watch(watching)
            output_dir = settings.get("output_dir")
            end = {"kind": kind, "why": why, "step": last_step(output_dir) if output_dir else None}
            stay = settings.get("max_restarts") and (watching or not self.peers)
            if kind in ("done", *INCURABLE) or self.terminated or not stay:
                break  # nothing the others say can make a restart possible
            self.set_state(state="ended", code=code, end=end, why=why)
            ends = self.gather(attempt, time.time() + self.settle_s())
            ends[settings["rank"]] = end
            again, cause, reason = restart_decision(
                ends,
                self.state["restarts"],
                settings["max_restarts"],
                settings.get("restarts_before", 0),
            )
            if not again:
                log(f"rank {settings['rank']}: not restarted on the nodes: {reason} ({cause})")
                break
            command = self.restart(attempt, cause, failure_step(ends))
            if command is None:
                break
        final = {"state": "exited", "code": code, "end": end}
        if kind in ("peer", "lost", "unreachable", "max-duration"):
            final["why"] = f"stopped by its agent: {why}"
        elif kind == "cannot-start":
            final["why"] = why
        self.set_state(**final)
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
