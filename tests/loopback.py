"""Loopback helpers for the unit tests that run servers of their own (the ranks' agent, the
preflight probe, the stand-in job)."""

import socket


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
