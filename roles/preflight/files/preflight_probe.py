"""The launch's network and host probe, run in a container of the training image with the
launch's network mode (so it sees what a rank would see).

  preflight_probe.py listen --ports P [P...] --seconds N
      accept connections on every port for N seconds, answering each with this node's name
  preflight_probe.py connect --name NODE --bind ADDR --targets JSON --timeout S [--disk PATH]
      from ADDR (the address NCCL/Gloo would use here), reach every target
      [{"node", "address", "port"}], retrying refusals until S; print one JSON report
  preflight_probe.py probe --name NODE --ports P [P...] --expect N [N...] --bind ADDR
                           --targets JSON --timeout S --seconds T [--disk PATH]
      both in one process (the preflight's one container per node, started on every node
      before any is read): listen, reach every target - refusals retried until S seconds after
      SIGUSR1 (sent once every node's probe runs), a timeout final after S - print the report
      (a port it could not listen on in "listen_error"), then answer until each port has had
      its N connections, once SIGUSR1 came, or T seconds passed

Stdlib only: it runs in whatever image the job uses.
"""

import argparse
import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time


class Listener:
    """Every port answered in a thread of its own, each connection counted."""

    def __init__(self, ports, name):
        self.name = name
        self.counts = dict.fromkeys(ports, 0)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.servers = []
        for port in ports:
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                server.bind(("0.0.0.0", port))  # noqa: S104 (reachable on every NIC)
            except OSError:
                server.close()
                self.close()
                raise
            server.listen(128)
            server.settimeout(0.2)
            self.servers.append((port, server))
        for port, server in self.servers:
            threading.Thread(target=self._serve, args=(port, server), daemon=True).start()

    def _serve(self, port, server):
        while not self.stop.is_set():
            try:
                connection, _peer = server.accept()
            except OSError:
                continue
            with contextlib.suppress(OSError):
                connection.sendall((json.dumps({"node": self.name}) + "\n").encode())
            connection.close()
            with self.lock:
                self.counts[port] += 1

    def has(self, expected):
        with self.lock:
            return all(self.counts[port] >= n for port, n in expected.items())

    def close(self):
        self.stop.set()
        for _port, server in self.servers:
            server.close()


def probe(name, bind, targets, timeout, disk, gpus, ports, expect, seconds):
    """The listener and the connect in one process; see the module docstring."""
    started = time.time()
    go = []  # the time SIGUSR1 came
    signal.signal(signal.SIGUSR1, lambda _signum, _frame: go or go.append(time.time()))
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    try:
        listener = Listener(ports, name)
        listen_error = ""
    except OSError as exc:
        listener, listen_error = None, f"cannot listen on {ports}: {exc}"
    print(json.dumps({"listening": ports if listener else []}), flush=True)

    def refusals_until():
        return min(started + seconds, (go[0] if go else float("inf")) + timeout)

    report = connect_report(name, bind, targets, disk, gpus, refusals_until, started + timeout)
    report["listen_error"] = listen_error
    print(json.dumps(report), flush=True)
    expected = {port: expect[index] for index, port in enumerate(ports)}
    while listener and time.time() < started + seconds:
        if go and listener.has(expected):
            break
        time.sleep(0.1)
    if listener:
        listener.close()
    return 3 if listen_error else 0


def listen(ports, seconds, name):
    # PID 1 of its container: without a handler SIGTERM is ignored and `docker stop` waits 10 s.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    listener = Listener(ports, name)  # a port already taken raises: the exit names it
    print(json.dumps({"listening": ports}), flush=True)
    time.sleep(seconds)
    listener.close()


def reach(bind, target, deadline, timeouts_until=None):
    """One target: {'ok', 'error', 'answer', 'seconds'}; refusals are retried until `deadline`
    (the peer's listener may start a moment later; a callable gives it anew each time), time-outs
    until `timeouts_until` (default: the deadline)."""
    until = deadline if callable(deadline) else (lambda: deadline)
    started = time.time()
    last = "not tried"
    while True:
        deadline = until()
        final = min(deadline, timeouts_until) if timeouts_until else deadline
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(max(0.5, min(3.0, final - time.time())))
        try:
            if bind:
                sock.bind((bind, 0))
            sock.connect((target["address"], int(target["port"])))
            answer = sock.makefile().readline().strip()
            return {"ok": True, "answer": answer, "seconds": round(time.time() - started, 2)}
        except socket.timeout:  # noqa: UP041 (not TimeoutError before Python 3.10)
            last = "timed out"
            if time.time() >= final:
                break
        except OSError as exc:
            code = errno.errorcode.get(exc.errno, str(exc.errno))
            last = f"{os.strerror(exc.errno) if exc.errno else exc} ({code})"
            if exc.errno == errno.EADDRNOTAVAIL or time.time() >= deadline:
                break
            time.sleep(0.3)
        finally:
            sock.close()
    return {"ok": False, "error": last, "seconds": round(time.time() - started, 2)}


def source_address(address):
    """The address this container would send from towards `address` (what it advertises)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((address, 9))
        return probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()


def count_gpus():
    """GPUs this container sees (nvidia-smi is put in by the NVIDIA runtime), None if unknown."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU "))


def package_versions(names=("llamafactory", "torch", "deepspeed", "transformers")):
    """Installed versions (None when absent), from the package metadata: no heavy import."""
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8
        return {}
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def newest_checkpoint(folder):
    """The newest checkpoint-N folder under the output folder and its size in bytes (the next
    checkpoint needs as much room), or {} when there is none."""
    steps = []
    for entry in os.listdir(folder) if os.path.isdir(folder) else []:
        if entry.startswith("checkpoint-") and entry[len("checkpoint-") :].isdigit():
            steps.append(int(entry[len("checkpoint-") :]))
    if not steps:
        return {}
    path = os.path.join(folder, f"checkpoint-{max(steps)}")
    size = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                size += os.path.getsize(os.path.join(root, name))
    return {"checkpoint": max(steps), "checkpoint_bytes": size}


def connect(name, bind, targets, timeout, disk, gpus=False):
    report = connect_report(name, bind, targets, disk, gpus, time.time() + timeout)
    print(json.dumps(report), flush=True)


def connect_report(name, bind, targets, disk, gpus, deadline, timeouts_until=None):
    """Every target reached at once (reach's deadlines), with this container's view: source
    address, packages, disk, GPUs."""
    results = [None] * len(targets)

    def run(index, target):
        results[index] = dict(target, **reach(bind, target, deadline, timeouts_until))

    threads = [threading.Thread(target=run, args=(i, t)) for i, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report = {
        "node": name,
        "bind": bind,
        "hostname": socket.gethostname(),
        "source": source_address(targets[0]["address"]) if targets else None,
        "results": results,
        "packages": package_versions(),
    }
    if disk:
        usage = shutil.disk_usage(disk)
        report["disk"] = {"path": disk, "free": usage.free, "total": usage.total}
        report["disk"].update(newest_checkpoint(disk))
    if gpus:
        report["gpus"] = count_gpus()
    return report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    listener = sub.add_parser("listen")
    listener.add_argument("--ports", type=int, nargs="+", required=True)
    listener.add_argument("--seconds", type=float, default=60)
    listener.add_argument("--name", default=socket.gethostname())
    connector = sub.add_parser("connect")
    connector.add_argument("--name", required=True)
    connector.add_argument("--bind", default="")
    connector.add_argument("--targets", required=True)
    connector.add_argument("--timeout", type=float, default=10)
    connector.add_argument("--disk", default="")
    connector.add_argument("--gpus", action="store_true", help="count the GPUs it sees")
    both = sub.add_parser("probe")
    both.add_argument("--name", required=True)
    both.add_argument("--ports", type=int, nargs="+", required=True)
    both.add_argument("--expect", type=int, nargs="+", required=True, help="connections per port")
    both.add_argument("--bind", default="")
    both.add_argument("--targets", required=True)
    both.add_argument("--timeout", type=float, default=5)
    both.add_argument("--seconds", type=float, default=60)
    both.add_argument("--disk", default="")
    both.add_argument("--gpus", action="store_true")
    args = parser.parse_args(argv)
    if args.mode == "listen":
        listen(args.ports, args.seconds, args.name)
    elif args.mode == "connect":
        connect(args.name, args.bind, json.loads(args.targets), args.timeout, args.disk, args.gpus)
    else:
        if len(args.expect) != len(args.ports):
            parser.error("--expect needs one count per port of --ports")
        return probe(
            args.name,
            args.bind,
            json.loads(args.targets),
            args.timeout,
            args.disk,
            args.gpus,
            args.ports,
            args.expect,
            args.seconds,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
