"""A free TCP port for a child process to listen on.

The port is chosen here and bound later by another process, so it must not be one the
kernel may hand out meanwhile as the local port of an outgoing connection: a port from the
ephemeral range (bind to 0) loses that race on a busy machine. Ports are therefore drawn
below the ephemeral range, and checked free by binding them once.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000


def _ephemeral_start() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default; other systems' ranges start higher


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that nothing listens on now and the kernel will not pick for itself."""
    ceiling = _ephemeral_start()
    for _ in range(100):
        port = random.randrange(_LOWEST, ceiling) if ceiling > _LOWEST + 1_000 else 0  # noqa: S311 (not a secret)
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise OSError("no free TCP port found below the ephemeral range")
