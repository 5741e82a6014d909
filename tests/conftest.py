"""Shared fixtures: real PostgreSQL and SQLite, real Redis, real HTTP.

Database-touching tests take the `runtime` (or `db`) fixture, which is parametrised over both
backends; PostgreSQL comes from TEST_DATABASE_URL, or, when that is unset, from a throwaway
server the run starts itself (tests/support/embedded_postgres.py). Each backend is migrated
once per session; every test then starts from empty tables (TRUNCATE/DELETE), which also works
when a test runs workers in other threads or processes.
Redis comes from TEST_REDIS_URL, else an embedded redis-server started for the session.
Modules marked `pgbouncer` run their database tests a third time, as backend `pgbouncer`: the
PostgreSQL database through a real PgBouncer in transaction pooling mode
(tests/support/pgbouncer.py), skipped with the reason when `pgbouncer` is not installed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import settings as hypothesis_settings
from sqlalchemy import create_engine, make_url, text
from werkzeug.serving import make_server

from app import migrate
from app import runtime as runtime_mod
from app.clock import utcnow
from app.config import Settings, normalise_database_url
from app.db import Database
from app.embedded_redis import EmbeddedRedis
from app.lifecycle import partitions
from app.models import Base
from app.runtime import Runtime
from tests.support.pgbouncer import PgBouncer, find_pgbouncer

# This machine's speed swings 2x between runs: Hypothesis's per-example deadline would fail
# a property on a slow moment, not on a wrong answer.
hypothesis_settings.register_profile("kurir", deadline=None)
hypothesis_settings.load_profile("kurir")


def _worker_index() -> int:
    """0 outside pytest-xdist, else N for worker gwN."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


def _isolate_parallel_workers() -> None:
    """Under pytest-xdist each worker gets its own PostgreSQL database and Redis db number:
    tests empty both between them, and two workers emptying one store would fail each other.
    Everything downstream (subprocess env, the chaos database) reads the rewritten variables."""
    index = _worker_index()
    if not index:
        return
    raw_db = os.environ.get("TEST_DATABASE_URL")
    if raw_db:
        base = make_url(normalise_database_url(raw_db))
        name = f"{base.database}_w{index}"
        admin = create_engine(base, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            exists = connection.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}
            ).first()
            if not exists:
                connection.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        os.environ["TEST_DATABASE_URL"] = base.set(database=name).render_as_string(
            hide_password=False
        )
    raw_redis = os.environ.get("TEST_REDIS_URL")
    if raw_redis:
        prefix, _, db_number = raw_redis.rpartition("/")
        base_db = int(db_number) if db_number.isdigit() else 0
        os.environ["TEST_REDIS_URL"] = f"{prefix}/{(base_db + index) % 16}"


_isolate_parallel_workers()

_EMBEDDED_POSTGRES: Any = None


def pytest_configure(config: pytest.Config) -> None:
    """With TEST_DATABASE_URL unset, start one throwaway PostgreSQL server for the whole run
    (in the controller, before pytest-xdist starts its workers, which inherit the variable),
    so the PostgreSQL half of the suite runs on a fresh machine instead of skipping.
    KURIR_TEST_POSTGRES=off keeps the old behaviour (PostgreSQL tests skip)."""
    global _EMBEDDED_POSTGRES
    if (
        os.environ.get("TEST_DATABASE_URL")
        or "PYTEST_XDIST_WORKER" in os.environ
        or os.environ.get("KURIR_TEST_POSTGRES", "").lower() == "off"
    ):
        return
    from tests.support.embedded_postgres import EmbeddedPostgres

    _EMBEDDED_POSTGRES = EmbeddedPostgres()
    _EMBEDDED_POSTGRES.start()
    os.environ["TEST_DATABASE_URL"] = _EMBEDDED_POSTGRES.create_database("test")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _EMBEDDED_POSTGRES is not None:
        os.environ.pop("TEST_DATABASE_URL", None)
        _EMBEDDED_POSTGRES.stop()


BACKENDS = ("sqlite", "postgresql")
# The PostgreSQL database again, through PgBouncer (`pool_mode = transaction`); only for
# modules marked `pgbouncer`, so the suite pays for it where it proves something.
POOLED = "pgbouncer"


def _parametrized_by_the_test(metafunc: pytest.Metafunc, name: str) -> bool:
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", ())
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if name in names:
            return True
    return False


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every database test runs on each backend; a test's own `parametrize("backend", ...)`
    narrows that, and a module marked `pgbouncer` adds the pooled one."""
    if "backend" not in metafunc.fixturenames or _parametrized_by_the_test(metafunc, "backend"):
        return
    backends = [*BACKENDS]
    if metafunc.definition.get_closest_marker("pgbouncer"):
        backends.append(POOLED)
    metafunc.parametrize("backend", backends, indirect=True)


# ------------------------------------------------------------------------------- Redis


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = os.environ.get("TEST_REDIS_URL")
    if url:
        yield url
        return
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    yield server.start()
    server.stop()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


# ------------------------------------------------------------------------------- databases


class MigratedDatabase:
    """One migrated database per backend per session, emptied before every test."""

    def __init__(self, url: str) -> None:
        self.url = url
        # The ceiling this shared pool had before pools stopped overflowing (20 + 40).
        self.db = Database(url, pool_size=60)

    def empty(self) -> None:
        tables = [t.name for t in reversed(Base.metadata.sorted_tables)]
        with self.db.engine.begin() as connection:
            if self.db.is_postgres:
                connection.execute(text(f"TRUNCATE {', '.join(tables)} CASCADE"))
                # A retention test may have dropped the days ahead, or left a swapped day's
                # kept partitions: every test starts with the layout a migration leaves.
                for spec in reversed(partitions.SPECS):
                    for part in partitions.partitions(connection, spec, partitions.KEPT):
                        partitions.detach(connection, spec.table, part.name)
                        connection.execute(text(f"DROP TABLE {part.name}"))
                partitions.create_ahead(connection, utcnow())
            else:
                for name in tables:
                    connection.execute(text(f"DELETE FROM {name}"))  # noqa: S608


def _reset_postgres(url: str) -> None:
    db = Database(url, pool_size=1)
    with db.engine.begin() as connection:
        connection.execute(text("DROP SCHEMA IF EXISTS public CASCADE"))
        connection.execute(text("CREATE SCHEMA public"))
    db.dispose()


@pytest.fixture(scope="session")
def migrated_databases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    created: dict[str, Any] = {}
    yield created
    for item in created.values():
        if isinstance(item, MigratedDatabase):
            item.db.dispose()


@pytest.fixture(scope="session")
def pgbouncer_url() -> Iterator[str]:
    """The test PostgreSQL database through a PgBouncer in transaction mode, for the session.

    The URL carries `prepare_threshold=none`, as a deployment behind such a PgBouncer must,
    and every process a test starts is handed the same URL.
    """
    raw = os.environ.get("TEST_DATABASE_URL")
    if not raw:
        pytest.skip("PostgreSQL: TEST_DATABASE_URL is unset")
    if find_pgbouncer() is None:
        pytest.skip("PgBouncer: `pgbouncer` is not installed (apt-get install pgbouncer)")
    bouncer = PgBouncer(normalise_database_url(raw))
    url = bouncer.start()
    yield f"{url}?prepare_threshold=none"
    bouncer.stop()


def _migrated(
    backend: str, cache: dict[str, Any], tmp: Path, request: pytest.FixtureRequest
) -> MigratedDatabase:
    if backend in cache:
        return cache[backend]  # type: ignore[no-any-return]
    if backend == POOLED:
        # The same database the `postgresql` backend migrates, reached through the pooler.
        _migrated("postgresql", cache, tmp, request)
        url = normalise_database_url(request.getfixturevalue("pgbouncer_url"))
        cache[backend] = MigratedDatabase(url)
        return cache[backend]  # type: ignore[no-any-return]
    if backend == "postgresql":
        raw = os.environ.get("TEST_DATABASE_URL")
        if not raw:
            pytest.skip("PostgreSQL: TEST_DATABASE_URL is unset")
        url = normalise_database_url(raw)
        _reset_postgres(url)
    else:
        url = f"sqlite:///{tmp / 'kurir-test.db'}"
    migrate.upgrade(url)
    cache[backend] = MigratedDatabase(url)
    return cache[backend]  # type: ignore[no-any-return]


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """Parametrised by `pytest_generate_tests`."""
    return str(request.param)


@pytest.fixture
def migrated(
    backend: str,
    migrated_databases: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> MigratedDatabase:
    database = _migrated(backend, migrated_databases, tmp_path_factory.getbasetemp(), request)
    database.empty()
    return database


@pytest.fixture
def db(migrated: MigratedDatabase) -> Database:
    return migrated.db


# ------------------------------------------------------------------------------- runtime / app


@pytest.fixture
def settings(migrated: MigratedDatabase, redis_url: str, tmp_path: Path) -> Settings:
    """Settings for one test: both real stores, private targets allowed (receivers on 127.0.0.1)."""
    return Settings(
        data_dir=tmp_path / "data",
        database_url=migrated.url,
        redis_url=redis_url,
        secret_key="test-secret-key",
        allow_private_targets=True,
    )


@pytest.fixture
def runtime(
    settings: Settings, migrated: MigratedDatabase, redis_client: redis.Redis
) -> Iterator[Runtime]:
    rt = Runtime(settings, database=migrated.db)
    runtime_mod.install(rt)
    yield rt
    rt.close()
    runtime_mod.install(None)  # type: ignore[arg-type]


@pytest.fixture
def app(runtime: Runtime) -> Any:
    from app.web import create_app
    from app.web.auth import clear_cache

    clear_cache()
    flask_app = create_app(runtime=runtime)
    flask_app.testing = False  # exercise the real error handlers
    return flask_app


@pytest.fixture
def client(app: Any) -> Any:
    return app.test_client()


class LiveServer:
    """The Flask app on a real socket, for tests that need concurrent real HTTP clients."""

    def __init__(self, app: Any) -> None:
        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        # A short poll interval: shutdown() otherwise waits up to 0.5 s per test.
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def __enter__(self) -> LiveServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.thread.join(5)


@pytest.fixture
def live_server(app: Any) -> Iterator[LiveServer]:
    with LiveServer(app) as server:
        yield server


@pytest.fixture
def admin_token(runtime: Runtime) -> str:
    from app.accounts import create_api_key

    with runtime.db.begin() as session:
        _, token = create_api_key(session, "test-admin", ["admin"])
    return token


@pytest.fixture
def auth(admin_token: str) -> dict[str, str]:
    """Headers for an admin-scoped API call."""
    return {"Authorization": f"Bearer {admin_token}"}
