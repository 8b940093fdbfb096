"""The launch's network and host probe, run in a container of the training image with the
launch's network mode (so it sees what a rank would see).

  preflight_probe.py listen --ports P [P...] --seconds N
      accept connections on every port for N seconds, answering each with this node's name
  preflight_probe.py connect --name NODE --bind ADDR --targets JSON --timeout S [--disk PATH]
      from ADDR (the address NCCL/Gloo would use here), reach every target
      [{"node", "address", "port"}], retrying refusals until S; print one JSON report

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


def listen(ports, seconds, name):
    # PID 1 of its container: without a handler SIGTERM is ignored and `docker stop` waits 10 s.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    servers = []
    for port in ports:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", port))  # noqa: S104 (the probe must be reachable on every NIC)
        server.listen(64)
        server.settimeout(0.5)
        servers.append(server)
    print(json.dumps({"listening": ports}), flush=True)
    end = time.time() + seconds

    def serve(server):
        while time.time() < end:
            try:
                connection, _peer = server.accept()
            except OSError:
                continue
            with contextlib.suppress(OSError):
                connection.sendall((json.dumps({"node": name}) + "\n").encode())
            connection.close()

    threads = [threading.Thread(target=serve, args=(s,), daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def reach(bind, target, deadline):
    """One target: {'ok', 'error', 'answer', 'seconds'}; refusals are retried (the peer's
    listener may start a moment later), timeouts are not."""
    started = time.time()
    last = "not tried"
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(max(0.5, min(3.0, deadline - time.time())))
        try:
            if bind:
                sock.bind((bind, 0))
            sock.connect((target["address"], int(target["port"])))
            answer = sock.makefile().readline().strip()
            return {"ok": True, "answer": answer, "seconds": round(time.time() - started, 2)}
        except socket.timeout:  # noqa: UP041 (not TimeoutError before Python 3.10)
            last = "timed out"
            if time.time() >= deadline:
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
    deadline = time.time() + timeout
    results = [None] * len(targets)

    def run(index, target):
        results[index] = dict(target, **reach(bind, target, deadline))

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
    print(json.dumps(report), flush=True)


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
    args = parser.parse_args(argv)
    if args.mode == "listen":
        listen(args.ports, args.seconds, args.name)
    else:
        connect(args.name, args.bind, json.loads(args.targets), args.timeout, args.disk, args.gpus)
    return 0


if __name__ == "__main__":
    sys.exit(main())
