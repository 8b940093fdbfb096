"""Small helpers shared by the local-cluster tool: logging, commands with deadlines."""

from __future__ import annotations

import subprocess
import sys
import threading
import time


class ClusterError(RuntimeError):
    """A failure the user can act on; the message names the fix."""


def log(message: str) -> None:
    print(f"[localcluster {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(
    command: list[str], check: bool = True, timeout: float = 600, input_text: str | None = None
) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, input=input_text, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"{command[0]} did not finish within {timeout:.0f} s") from exc
    if check and result.returncode != 0:
        raise ClusterError(
            f"{' '.join(command[:4])} ... failed ({result.returncode}): "
            f"{(result.stderr or result.stdout).strip()[-2000:]}"
        )
    return result


def pipe(producer: list[str], consumer: list[str], what: str, timeout: float = 600) -> None:
    """producer | consumer, both checked, the consumer bounded by `timeout`."""
    with subprocess.Popen(producer, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as first:
        try:
            second = subprocess.run(
                consumer,
                stdin=first.stdout,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            first.kill()
            raise ClusterError(f"{what} did not finish within {timeout:.0f} s") from exc
        finally:
            first.stdout.close()
        first_err = first.stderr.read().decode(errors="replace")
    if first.returncode != 0 or second.returncode != 0:
        raise ClusterError(f"{what} failed: {first_err.strip()} {second.stderr.strip()}".strip())


def stream(command: list[str], prefix: str, deadline_s: float, every: int = 1) -> None:
    """Run a long command, showing every `every`-th output line (progress) and the last ones
    on failure; kill it at the deadline."""
    started = time.monotonic()
    tail: list[str] = []
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as proc:
        timer = threading.Timer(deadline_s, proc.kill)
        timer.start()
        try:
            for count, line in enumerate(proc.stdout):
                tail = [*tail, line.rstrip()][-20:]
                if count % every == 0:
                    log(f"{prefix}[{time.monotonic() - started:4.0f} s] {line.rstrip()[:150]}")
            proc.wait()
        finally:
            timer.cancel()
    if time.monotonic() - started >= deadline_s:
        raise ClusterError(f"{command[0]} ran past its {deadline_s:.0f} s deadline")
    if proc.returncode != 0:
        raise ClusterError(f"{command[0]} failed ({proc.returncode}):\n" + "\n".join(tail))


def wait_until(what: str, probe, deadline_s: float, interval: float = 0.5):
    """Call probe() until it returns a truthy value; fail naming `what` at the deadline."""
    started = time.monotonic()
    last_error = None
    while time.monotonic() - started < deadline_s:
        try:
            value = probe()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - remembered for the message
            last_error = exc
        time.sleep(interval)
    detail = f": {last_error}" if last_error else ""
    raise ClusterError(f"{what} not ready within {deadline_s:.0f} s{detail}")
