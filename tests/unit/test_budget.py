"""Connection budgets: the arithmetic of app/budget.py, and pools that never open more."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import event, text

from app import budget
from app.budget import ProcessKind
from app.config import Settings, load_settings
from app.db import Database, PoolExhausted
from app.processes.leadership import Leadership
from app.processes.scheduler import build_scheduler
from app.runtime import Runtime

ITEM_FLEET = {
    ProcessKind.API: 2,
    ProcessKind.WORKER: 4,
    ProcessKind.SCHEDULER: 2,
    ProcessKind.CLI: 1,
}


def test_the_default_fleet_fits_a_postgresql_of_100_connections() -> None:
    settings = Settings()
    table = budget.budgets(settings)
    # kurir api: 2 server processes of 8 request threads + 2 each.
    assert (table[ProcessKind.API].postgres, table[ProcessKind.API].processes) == (10, 2)
    assert table[ProcessKind.API].postgres_total == 20
    assert table[ProcessKind.WORKER].postgres == 6
    assert table[ProcessKind.SCHEDULER].postgres == settings.scheduler_threads + 1 == 5
    assert table[ProcessKind.CLI].postgres == 2
    fleet = budget.fleet(settings, ITEM_FLEET)
    assert fleet.postgres == 2 * 20 + 4 * 6 + 2 * 5 + 2 == 76
    assert fleet.postgres <= budget.postgres_room(100, 3)
    assert fleet.redis == 2 * 20 + 4 * 12 + 2 * 4 + 2 == 98


def test_budgets_follow_the_settings() -> None:
    settings = load_settings(
        {
            "KURIR_API_WORKERS": "3",
            "KURIR_API_THREADS": "16",
            "KURIR_SCHEDULER_THREADS": "2",
            "KURIR_WORKER_THREADS": "64",
        }
    )
    table = budget.budgets(settings)
    assert table[ProcessKind.API].postgres_total == 3 * 18
    assert table[ProcessKind.SCHEDULER].postgres == 3
    # A worker's sending threads never touch the database: its budget does not grow with them.
    assert table[ProcessKind.WORKER].postgres == budget.WORKER_POSTGRES
    line = budget.fleet(settings, {ProcessKind.API: 2}).lines[0]
    assert (line.postgres, line.redis) == (2 * 3 * 18, 2 * 3 * 18)
    assert budget.fleet(settings, {}).postgres == 0
    assert budget.postgres_room(10, 30) == 0


def test_each_runtime_sizes_and_names_its_pools_by_its_kind(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, redis_url="redis://127.0.0.1:1/0")
    for kind in ProcessKind:
        runtime = Runtime(settings, kind=kind)
        try:
            expected = budget.budget_for(settings, kind)
            pool = runtime.db.engine.pool
            assert pool.size() == expected.postgres  # type: ignore[attr-defined]
            assert pool._max_overflow == 0  # type: ignore[attr-defined]
            redis_pool = runtime.redis.connection_pool
            assert redis_pool.max_connections == expected.redis_pool
            assert redis_pool.connection_kwargs["client_name"] == f"kurir-{kind}"
        finally:
            runtime.close()
    # Built without a kind: everything in one process, the ceiling it always had.
    embedded = Runtime(settings)
    assert embedded.kind is ProcessKind.EMBEDDED
    assert embedded.budget.postgres == 3 * max(10, settings.worker_threads + 2)


def test_the_scheduler_runs_jobs_on_its_budgeted_threads(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, scheduler_threads=3)
    runtime = Runtime(settings, kind=ProcessKind.SCHEDULER)
    leadership = Leadership(runtime.db, ttl_s=3, renew_s=0.5)
    scheduler = build_scheduler(runtime, leadership, jobs=[])
    executor = scheduler._executors["default"]  # type: ignore[attr-defined]
    assert executor._pool._max_workers == 3
    assert runtime.budget.postgres == 3 + 1  # and the lease keeper


def _counting(db: Database) -> list[int]:
    opened: list[int] = []

    @event.listens_for(db.engine, "connect")
    def _on_connect(*_args: object) -> None:
        opened.append(1)

    return opened


def test_a_pool_never_opens_more_than_its_budget_and_fails_after_the_wait(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'k.db'}", pool_size=3, pool_timeout_s=0.3)
    opened = _counting(db)
    held = [db.engine.raw_connection() for _ in range(3)]  # checked out, no transaction
    started = time.monotonic()
    with pytest.raises(PoolExhausted, match="all 3 database connections") as caught:
        db.engine.connect()
    assert time.monotonic() - started >= 0.3
    assert "KURIR_DB_POOL_TIMEOUT_S" in str(caught.value)
    assert len(opened) == 3
    for connection in held:
        connection.close()
    db.dispose()


def test_a_waiting_thread_gets_the_connection_given_back(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'k.db'}", pool_size=2, pool_timeout_s=10)
    opened = _counting(db)
    held = [db.engine.raw_connection() for _ in range(2)]
    got: list[float] = []

    def wait_for_one() -> None:
        started = time.monotonic()
        with db.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        got.append(time.monotonic() - started)

    waiter = threading.Thread(target=wait_for_one)
    waiter.start()
    time.sleep(0.2)  # the waiter is blocked on the pool meanwhile (asserted below)
    assert not got
    held.pop().close()
    waiter.join(10)
    assert got and got[0] >= 0.2
    assert len(opened) == 2
    for connection in held:
        connection.close()
    db.dispose()


def test_many_threads_share_a_small_pool_without_opening_more(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'k.db'}", pool_size=3, pool_timeout_s=30)
    opened = _counting(db)
    failures: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                with db.engine.connect() as connection:
                    connection.execute(text("SELECT 1"))
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    threads = [threading.Thread(target=work) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures
    assert len(opened) <= 3
    db.dispose()
