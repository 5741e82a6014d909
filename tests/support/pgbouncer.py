"""A real PgBouncer in transaction pooling mode in front of the test PostgreSQL database.

Many deployments put PgBouncer (`pool_mode = transaction`) between their processes and
PostgreSQL: a client connection then owns a server connection only for the length of one
transaction, and the next transaction may run on another one. Anything that outlives a
transaction on the server — a prepared statement, a `SET`, a session advisory lock, a temp
table — is then seen by the wrong client or lost. Tests that run through this pooler prove
Kurir keeps none of that.

The pooler is Debian's `pgbouncer` binary (a test skips when it is missing): a config file
in a temporary directory, one child process on a free 127.0.0.1 port, `auth_type = trust`
towards the tests, and the upstream server's own user and password towards PostgreSQL.
PgBouncer refuses to run as root (CI runs as root), so as root it runs as the unprivileged
account the embedded PostgreSQL uses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import make_url

from app.embedded_redis import die_with_parent
from app.ports import free_port
from tests.support.embedded_postgres import _server_user

# Small on purpose: transactions queue for a server connection as they would in production,
# and a test can count the server connections against it.
DEFAULT_POOL_SIZE = 10


class PgBouncerError(RuntimeError):
    """The binary is missing or the pooler did not start."""


def find_pgbouncer() -> str | None:
    """The `pgbouncer` binary (Debian installs it in /usr/sbin, not always on PATH)."""
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/bin")


def _quote(value: str) -> str:
    """A value inside a libpq-style `key=value` connection string of PgBouncer's [databases]."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class PgBouncer:
    """One `pgbouncer` child pooling `upstream_url`'s database in transaction mode.

    Clients connect to `url` (same database name and user as upstream, no password).
    """

    def __init__(self, upstream_url: str, *, pool_size: int = DEFAULT_POOL_SIZE) -> None:
        binary = find_pgbouncer()
        if binary is None:
            raise PgBouncerError("pgbouncer is not installed (apt-get install pgbouncer)")
        self.binary = binary
        self.upstream = make_url(upstream_url)
        self.pool_size = pool_size
        self.root = Path(tempfile.mkdtemp(prefix="kurir-pgbouncer-"))
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.url = ""

    @property
    def database(self) -> str:
        return str(self.upstream.database)

    @property
    def user(self) -> str:
        return str(self.upstream.username or "postgres")

    def _config(self) -> str:
        upstream = {
            "host": self.upstream.host or "127.0.0.1",
            "port": str(self.upstream.port or 5432),
            "dbname": self.database,
            "user": self.user,
        }
        if self.upstream.password:
            upstream["password"] = str(self.upstream.password)
        target = " ".join(f"{key}={_quote(value)}" for key, value in upstream.items())
        settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            "unix_socket_dir": "",
            "auth_type": "trust",
            "auth_file": str(self.root / "userlist.txt"),
            "pool_mode": "transaction",
            "default_pool_size": str(self.pool_size),
            "min_pool_size": "0",
            "reserve_pool_size": "0",
            "max_client_conn": "1000",
            "max_db_connections": str(self.pool_size),
            # Round robin, not PgBouncer's default "most recently used server first": a
            # transaction's successor lands on another server connection, so session state
            # that would break in production breaks in the tests every time, not by chance.
            "server_round_robin": "1",
            "ignore_startup_parameters": "extra_float_digits",
            "logfile": str(self.root / "pgbouncer.log"),
            "pidfile": str(self.root / "pgbouncer.pid"),
            "log_connections": "0",
            "log_disconnections": "0",
        }
        lines = ["[databases]", f"{self.database} = {target}", "", "[pgbouncer]"]
        lines += [f"{key} = {value}" for key, value in settings.items()]
        return "\n".join(lines) + "\n"

    def _run_as(self) -> dict[str, Any]:
        account = _server_user()
        if account is None:
            return {}
        for path in (self.root, *self.root.iterdir()):
            os.chown(path, account.pw_uid, account.pw_gid)
        return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}

    def start(self, timeout_s: float = 30.0) -> str:
        self.port = free_port()
        (self.root / "userlist.txt").write_text(f'"{self.user}" ""\n')
        (self.root / "pgbouncer.ini").write_text(self._config())
        as_user = self._run_as()
        output = (self.root / "stdout.log").open("wb")
        self.process = subprocess.Popen(  # noqa: S603
            [self.binary, str(self.root / "pgbouncer.ini")],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,  # noqa: PLW1509
            **as_user,
        )
        output.close()
        self.url = f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise PgBouncerError(
                    f"pgbouncer exited with {self.process.returncode}: {self._log_tail()}"
                )
            try:
                psycopg.connect(self.url, connect_timeout=1, prepare_threshold=None).close()
                return self.url
            except psycopg.OperationalError:
                time.sleep(0.1)
        self.stop()
        raise PgBouncerError(f"pgbouncer did not answer in {timeout_s:.0f}s: {self._log_tail()}")

    def _log_tail(self) -> str:
        parts = []
        for name in ("stdout.log", "pgbouncer.log"):
            try:
                parts.append((self.root / name).read_text(errors="replace")[-2000:])
            except OSError:
                continue
        return "\n".join(parts) or "(no log)"

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (PgBouncer's immediate shutdown), then remove everything."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)
