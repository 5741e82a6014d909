"""Engine and session factory for PostgreSQL and the embedded SQLite default.

SQLite is made safe for api + worker + scheduler as separate processes: WAL journal,
a busy timeout, and `BEGIN IMMEDIATE` so a transaction takes the write lock up front instead of
failing with "database is locked" when it later tries to upgrade a read lock.

PostgreSQL may sit behind a transaction-pooling PgBouncer, where each transaction can run on a
different server connection: Kurir keeps no state on a server connection beyond one
transaction (`SET LOCAL`, `pg_advisory_xact_lock`), except psycopg's prepared statements,
which the URL parameter `prepare_threshold` controls (see `prepare_threshold_of`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Connection, Engine, create_engine, event, make_url, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry, QueuePool
from sqlalchemy.sql.elements import ClauseElement

from app.db_direct import DirectStatement

log = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 30_000
# A pooled PostgreSQL connection idle longer than this is pinged before it is handed out; one
# used more recently is not (a ping is a round trip, and under load every checkout is recent).
PING_AFTER_IDLE_S = 5.0
_AFTER_COMMIT = "kurir_after_commit"
# A query parameter of a PostgreSQL DATABASE_URL that Kurir hands to psycopg, not to libpq.
PREPARE_THRESHOLD_PARAM = "prepare_threshold"
DEFAULT_POOL_TIMEOUT_S = 30.0


class PoolExhausted(sa_exc.TimeoutError):
    """Every connection of this process's budget stayed in use for the whole wait: the
    process opens no more than its budget (app/budget.py), it fails instead."""


class BudgetedPool(QueuePool):
    """A QueuePool that never overflows and says plainly what happened when it runs dry."""

    def _do_get(self) -> ConnectionPoolEntry:
        try:
            return super()._do_get()
        except sa_exc.TimeoutError:
            raise PoolExhausted(
                f"all {self.size()} database connections of this process's budget were in "
                f"use for {self._timeout:g} s (KURIR_DB_POOL_TIMEOUT_S); none more is opened. "
                "Something holds connections too long, or the budget is too small for this "
                "process's threads: see `kurir doctor` and docs/fleet.md"
            ) from None


def parse_prepare_threshold(raw: str) -> int | None:
    """`none`: never prepare; a whole number N: prepare a query once it has run N times on a
    connection (0: at its first run).

    Raises:
        ValueError: for anything else.
    """
    value = raw.strip().lower()
    if value == "none":
        return None
    if value.isascii() and value.isdigit():
        return int(value)
    raise ValueError(f"{PREPARE_THRESHOLD_PARAM} must be 'none' or a whole number, got {raw!r}")


def prepare_threshold_of(url: str | URL) -> tuple[URL, dict[str, Any]]:
    """The URL without `prepare_threshold`, and the psycopg connect arguments it stood for.

    psycopg turns a query run five times on a connection into a server-side prepared
    statement: it saves PostgreSQL the parse and plan of every later run (measured on the
    publish path: about half of PostgreSQL's CPU per publish), so it stays on by default. A
    prepared statement lives on the server connection, though, and behind a transaction-pooling
    PgBouncer (before 1.21, or without `max_prepared_statements`) the next transaction may run
    on another server connection, where it is missing ("prepared statement "_pg3_0" does not
    exist"), or exists as another client's ("already exists") — or, worst, silently runs that
    client's query instead. `?prepare_threshold=none` turns them off.
    """
    parsed = make_url(url)
    raw = parsed.query.get(PREPARE_THRESHOLD_PARAM)
    if raw is None:
        return parsed, {}
    if isinstance(raw, tuple):  # given more than once: the last one counts
        raw = raw[-1]
    threshold = parse_prepare_threshold(raw)
    stripped = parsed.difference_update_query([PREPARE_THRESHOLD_PARAM])
    return stripped, {"prepare_threshold": threshold}


def make_engine(
    url: str,
    *,
    pool_size: int = 10,
    pool_timeout_s: float = DEFAULT_POOL_TIMEOUT_S,
    application_name: str | None = None,
) -> Engine:
    """Create an engine with the pragmas and pool settings each backend needs.

    The pool holds at most `pool_size` connections, never more (no overflow): a checkout
    that finds them all in use waits `pool_timeout_s`, then raises PoolExhausted.
    `application_name` names the connections to PostgreSQL (`pg_stat_activity`).

    Bound values never reach a log or an exception message (`hide_parameters`): they hold
    encrypted secrets, payloads and API key hashes.

    Raises:
        ValueError: a PostgreSQL URL's `prepare_threshold` is neither `none` nor a number.
    """
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            hide_parameters=True,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
            poolclass=BudgetedPool,
            pool_size=pool_size,
            max_overflow=0,
            pool_timeout=pool_timeout_s,
        )
        _configure_sqlite(engine)
        return engine
    server_url, connect_args = prepare_threshold_of(url)
    if application_name is not None:
        connect_args["application_name"] = application_name
    engine = create_engine(
        server_url,
        poolclass=BudgetedPool,
        pool_size=pool_size,
        max_overflow=0,
        pool_timeout=pool_timeout_s,
        pool_recycle=1800,
        hide_parameters=True,
        connect_args=connect_args,
    )
    _ping_when_idle(engine)
    return engine


def _ping_when_idle(engine: Engine) -> None:
    """`pool_pre_ping`, but only for connections that sat idle: a dead server or a dropped
    connection is still met at checkout (and replaced), without a round trip per transaction.
    """

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < PING_AFTER_IDLE_S:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise DisconnectionError("stale pooled connection") from exc
        if not alive:
            raise DisconnectionError("stale pooled connection")


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the sqlite3 module, decide when transactions begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


class Database:
    """Owns the engine and hands out sessions; the caller owns each transaction."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 10,
        pool_timeout_s: float = DEFAULT_POOL_TIMEOUT_S,
        application_name: str | None = None,
        engine: Engine | None = None,
    ) -> None:
        self.url = url
        self.engine = engine or make_engine(
            url,
            pool_size=pool_size,
            pool_timeout_s=pool_timeout_s,
            application_name=application_name,
        )
        self.Session = sessionmaker(bind=self.engine, expire_on_commit=False)
        # Same pool; each checkout switches the driver to autocommit (no SQL is sent for it).
        self._autocommit_engine = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        self._direct: dict[ClauseElement, DirectStatement] = {}

    @property
    def is_sqlite(self) -> bool:
        return self.engine.dialect.name == "sqlite"

    @property
    def is_postgres(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    @contextmanager
    def begin(self) -> Iterator[Session]:
        """One transaction: commit on success, roll back on error, run after-commit hooks."""
        session = self.Session()
        try:
            with session.begin():
                yield session
            run_after_commit(session)
        finally:
            session.info.pop(_AFTER_COMMIT, None)
            session.close()

    @contextmanager
    def autocommit(self) -> Iterator[Connection]:
        """A connection on which every statement commits on its own.

        For a write that is one atomic statement: one round trip instead of BEGIN, the
        statement and COMMIT.
        """
        with self._autocommit_engine.connect() as connection:
            yield connection

    def direct(self, statement: ClauseElement) -> DirectStatement:
        """`statement` compiled once for this engine and run on the driver in autocommit
        (PostgreSQL; see app.db_direct): for a hot path whose write is one statement."""
        found = self._direct.get(statement)
        if found is None:
            found = self._direct[statement] = DirectStatement(statement, self.engine)
        return found

    def ping(self) -> None:
        with self.engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    def dispose(self) -> None:
        self.engine.dispose()


def after_commit(session: Session, hook: Callable[[], object]) -> None:
    """Run `hook` once this session's transaction has committed (never if it rolls back).

    Used to enqueue work only after the rows it refers to are visible to workers.
    """
    session.info.setdefault(_AFTER_COMMIT, []).append(hook)


def discard_after_commit(session: Session) -> None:
    session.info.pop(_AFTER_COMMIT, None)


def run_after_commit(session: Session) -> None:
    """Call the hooks registered with after_commit; a failing hook never undoes the commit."""
    hooks = session.info.pop(_AFTER_COMMIT, [])
    for hook in hooks:
        try:
            hook()
        except Exception:
            log.warning("after-commit hook failed", exc_info=True)
