"""The launch's network and host probe, run in a container of the training image with the
launch's network mode (so it sees what a rank would see).

  preflight_probe.py listen --ports P [P...] --seconds N
      accept connections on every port for N seconds, answering each with this node's name
  preflight_probe.py connect --name NODE --bind ADDR --targets JSON --timeout S [--disk PATH]
      from ADDR (the address NCCL/Gloo would use here), reach every target
      [{"node", "address", "port"}], retrying refusals until S; print one JSON report
  preflight_probe.py probe --name NODE --ports P [P...] --expect N [N...] --bind ADDR
                           --targets JSON --timeout S --seconds T [--disk PATH]
                           [--collect PORT | --collector ADDR:PORT]
      both in one process (the preflight's one container per node, started on every node
      before any is read): listen, reach every target - refusals retried until S seconds after
      the go (SIGUSR1, sent once every node's probe runs), a timeout final after S - print the
      report (a port it could not listen on in "listen_error"), then answer until each port has
      had its N connections, once the go came, or T seconds passed.
      Rank 0's probe (--collect PORT) gathers the others' reports: each (--collector) says hello
      to it from the start, takes its go from it (rank 0's SIGUSR1, passed on) and sends its
      report back; rank 0's report holds them ("gathered"), so the controller reads one node.
      One whose report rank 0 has ends at the latest 2 s after the go's timeout (every peer's
      reach is final by then). A probe that cannot reach the collector still prints its report
      and takes its go by SIGUSR1, to be read by itself.

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
import traceback


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


class Collector:
    """Rank 0's side of the gathering: every other probe says hello on `port`, gets the go on
    the same connection once this probe has it, and sends its report back."""

    def __init__(self, port, expected, go):
        self.expected = set(expected)
        self.go = go  # set by this probe's SIGUSR1
        self.lock = threading.Lock()
        self.registered = set()
        self.reports = {}
        self.stop = threading.Event()
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.server.bind(("0.0.0.0", port))  # noqa: S104 (every node's NIC, bridge included)
        except OSError:
            self.server.close()
            raise
        self.server.listen(256)
        self.server.settimeout(0.2)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stop.is_set():
            try:
                connection, _peer = self.server.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection):
        with contextlib.closing(connection):
            try:
                name = json.loads(_line(connection, time.time() + 5) or b"{}").get("hello")
                if name not in self.expected:
                    return
                with self.lock:
                    self.registered.add(name)
                while not self.go.is_set():
                    if self.stop.is_set():
                        return
                    self.go.wait(0.2)
                connection.sendall(b'{"go": true}\n')
                report = json.loads(_line(connection, time.time() + 60) or b"{}").get("report")
                if not isinstance(report, dict):
                    return
                with self.lock:
                    self.reports.setdefault(name, report)
                connection.sendall(b'{"ok": true}\n')
            except (OSError, ValueError):
                return

    def settled(self, now, go_at, timeout):
        """Every peer reported; or, 2 s after the go, every peer that said hello did (the
        others cannot reach rank 0: they are read by themselves); or the go's timeout passed."""
        with self.lock:
            if set(self.reports) >= self.expected:
                return True
            if now >= go_at + 2 and set(self.reports) >= self.registered:
                return True
        return now >= go_at + timeout + 2

    def gathered(self):
        with self.lock:
            return dict(self.reports)

    def close(self):
        self.stop.set()
        self.server.close()


def _line(connection, until):
    """One line read from `connection` (bytes, without its newline) before `until`; None when the
    peer closed or the time passed."""
    data = b""
    while b"\n" not in data:
        left = until - time.time()
        if left <= 0:
            return None
        connection.settimeout(min(left, 1.0))
        try:
            chunk = connection.recv(65536)
        except socket.timeout:  # noqa: UP041 (not TimeoutError before Python 3.10)
            continue
        if not chunk:
            return None
        data += chunk
    return data.split(b"\n", 1)[0]


class Courier:
    """A probe's side of the gathering: hello to rank 0's collector (retried until `deadline`),
    the go from it, then this probe's report once it is given. `delivered` once rank 0
    acknowledged it; `went` once the go came this way (the report is on its way)."""

    def __init__(self, collector, name, go, deadline):
        host, _colon, port = collector.rpartition(":")
        self.address = (host, int(port))
        self.name, self.go, self.deadline = name, go, deadline
        self.report = []
        self.went = threading.Event()
        self.delivered = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while time.time() < self.deadline and not self.delivered:
            try:
                connection = socket.create_connection(self.address, timeout=3)
            except OSError:
                time.sleep(0.3)
                continue
            with contextlib.closing(connection):
                try:
                    self._once(connection)
                except (OSError, ValueError):
                    time.sleep(0.3)
            if self.went.is_set():
                return  # the go came this way; the report went or could not: not again

    def _once(self, connection):
        connection.sendall((json.dumps({"hello": self.name}) + "\n").encode())
        line = _line(connection, self.deadline)
        if line is None or not json.loads(line).get("go"):
            return
        self.went.set()
        self.go.set()
        while not self.report and time.time() < self.deadline:
            time.sleep(0.05)
        if not self.report:
            return
        connection.sendall((json.dumps({"report": self.report[0]}) + "\n").encode())
        answer = _line(connection, time.time() + 10)
        self.delivered = answer is not None and bool(json.loads(answer).get("ok"))

    def send(self, report):
        self.report.append(report)

    def finish(self):
        """Wait for the report's delivery when the go came this way (at most 10 s more)."""
        if self.went.is_set():
            self.thread.join(12)


class Go:
    """When every node's probe runs: SIGUSR1 here, or the collector's word (an Event with the
    time it was set)."""

    def __init__(self):
        self.event = threading.Event()
        self.at = None

    def set(self):
        if self.at is None:
            self.at = time.time()
        self.event.set()

    def is_set(self):
        return self.event.is_set()

    def wait(self, seconds):
        return self.event.wait(seconds)


def probe(
    name, bind, targets, timeout, disk, gpus, ports, expect, seconds, collect=None, collector=None
):
    """The listener and the connect in one process; see the module docstring."""
    started = time.time()
    go = Go()
    # Setting an Event from a handler could wait on its lock: the handler only marks the time.
    signalled = []
    signal.signal(signal.SIGUSR1, lambda _signum, _frame: signalled.append(time.time()))
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    threading.Thread(target=_pass_on_signal, args=(signalled, go), daemon=True).start()
    try:
        listener = Listener(ports, name)
        listen_error = ""
    except OSError as exc:
        listener, listen_error = None, f"cannot listen on {ports}: {exc}"
    gatherer, collect_error = None, ""
    if collect:
        try:
            gatherer = Collector(collect, [t["node"] for t in targets if t["node"] != name], go)
        except OSError as exc:
            collect_error = f"cannot gather the reports on port {collect}: {exc}"
    courier = Courier(collector, name, go, started + seconds) if collector else None
    print(json.dumps({"listening": ports if listener else []}), flush=True)

    def refusals_until():
        return min(started + seconds, (go.at if go.is_set() else float("inf")) + timeout)

    report = connect_report(name, bind, targets, disk, gpus, refusals_until, started + timeout)
    report["listen_error"] = listen_error
    if collect:
        report["collect_error"] = collect_error
        if gatherer:
            while time.time() < started + seconds:
                if go.is_set() and gatherer.settled(time.time(), go.at, timeout):
                    break
                time.sleep(0.05)
            report["gathered"] = gatherer.gathered()
    print(json.dumps(report), flush=True)
    if courier:
        courier.send(report)
    expected = {port: expect[index] for index, port in enumerate(ports)}
    healthy = not listen_error and all(result["ok"] for result in report["results"])
    while listener and time.time() < started + seconds:
        if go.is_set() and listener.has(expected):
            break
        if courier and courier.delivered and (not healthy or time.time() > go.at + timeout + 2):
            break  # rank 0 has the report; the preflight stops, or every reach is final by now
        time.sleep(0.1)
    if listener:
        listener.close()
    if courier:
        courier.finish()
        if not courier.delivered:  # its container goes when it ends: stay to be read
            _stay(started + seconds)
    if gatherer:
        gatherer.close()
    return 3 if listen_error else 0


def _stay(until):
    """Sleep until `until` (SIGTERM ends it sooner)."""
    while time.time() < until:
        time.sleep(0.2)


def _pass_on_signal(signalled, go):
    while not signalled:
        time.sleep(0.05)
    go.set()


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
    gather = both.add_mutually_exclusive_group()
    gather.add_argument("--collect", type=int, help="rank 0: gather the others' reports here")
    gather.add_argument("--collector", help="rank 0's ADDR:PORT, to send this report to")
    args = parser.parse_args(argv)
    if args.mode == "listen":
        listen(args.ports, args.seconds, args.name)
    elif args.mode == "connect":
        connect(args.name, args.bind, json.loads(args.targets), args.timeout, args.disk, args.gpus)
    else:
        if len(args.expect) != len(args.ports):
            parser.error("--expect needs one count per port of --ports")
        if not args.collector:
            return probe(*_probe_args(args))
        # Its container goes when it ends (auto-removed): a failure stays to be read.
        try:
            return probe(*_probe_args(args))
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            sys.stderr.flush()
            _stay(time.time() + args.seconds)
            return 1
    return 0


def _probe_args(args):
    return (
        args.name,
        args.bind,
        json.loads(args.targets),
        args.timeout,
        args.disk,
        args.gpus,
        args.ports,
        args.expect,
        args.seconds,
        args.collect,
        args.collector,
    )


if __name__ == "__main__":
    sys.exit(main())
