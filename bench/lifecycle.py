"""A month of history, then retention with the system live.

    BENCH_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/kurir_month \\
        .venv/bin/python bench/lifecycle.py [--days 30] [--scale 1.0] [--retain-days 7]
            [--publishes 400] [--rate 100] [--drain 2000] [--workers 2] [--repeat 60]
            [--retention-yield N]

Loads `--days` days of history into a fresh database (BENCH_DATABASE_URL, WIPED and migrated;
by default SQLite in a temporary directory): at `--scale` of 2 million deliveries a day
(default 1: the full 2 million, 60 million for the month, cut to what a quarter of the
disk's free space holds; loading runs at about 4,000 deliveries a second on a 2-core machine,
so `--scale 0.01`, 20,000 a day, is a run of about 20 minutes; the row counts are printed).
Every event goes to one endpoint; one delivery in ten took two attempts; one in a
hundred died, and its dead letter is closed (resent or discarded) four times in five and
open the fifth; one in a thousand is still retrying. Open letters and retrying deliveries are
unfinished and must survive retention whatever their age; the bench counts them after.

Then, with `--workers` `kurir worker` processes delivering to a local receiver:

  before     table and index sizes; dead-letter search and delivery-log page p50/p95
  alone      `--publishes` publishes paced at `--rate` through the API (in-process Flask),
             then a backlog of `--drain` deliveries drained by the workers; publish
             latency counted from each send, and from when the pacing meant to send it
             (a stall delays every publish due during it, not only the one it holds)
  retention  the same two phases while `app.lifecycle.purge.run` runs in a process of its
             own (as the scheduler runs it), horizons `--retain-days` back, while a sampler
             reads PostgreSQL's `pg_locks` every 50 ms: the strongest lock retention's backend
             held, and whether anyone waited on a lock; the slowest publishes are shown
             beside what retention was doing then
  after      sizes, searches and pages again, right away and (PostgreSQL) once autovacuum
             has cleaned up after the purge, which on the first run over a month of history
             is a vacuum of most of `events` (on a server without autovacuum, after a
             `VACUUM (ANALYZE)` in its place); the unfinished rows counted

Rates move with the machine's neighbours; each phase prints its own CPU figures.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import func, insert, select, text  # noqa: E402

from app.clock import utcnow  # noqa: E402
from app.ids import id_at  # noqa: E402
from app.models import (  # noqa: E402
    Attempt,
    DeadLetter,
    Delivery,
    Endpoint,
    Event,
    Partner,
)

FULL_SCALE_PER_DAY = 2_000_000
# What a delivery of this bench's shape takes on disk, all its rows and index entries
# (event, delivery, 1.1 attempts; measured on PostgreSQL 15): the disk check's estimate.
BYTES_PER_DELIVERY = 2_600
DISK_SHARE = 0.25  # of the free space, at most
CHUNK = 2_000
WARM_S = 5.0  # paced publishes before the measured phases
UID = "acme"
TYPE_NAME = "order.paid"  # the type bench/deliver.py's Kurir registers
RECEIVER_PATH = "/hook"


@dataclass
class Loaded:
    events: int = 0
    deliveries: int = 0
    attempts: int = 0
    dead_letters: int = 0
    open_letters: int = 0
    retrying: int = 0


# ---------------------------------------------------------------------------- loading


def _per_day(scale: float, days: int, where: Path) -> tuple[int, str]:
    """Deliveries a day at `scale`, cut to what the disk holds; and why, in words."""
    wanted = int(FULL_SCALE_PER_DAY * scale)
    room = int(shutil.disk_usage(where).free * DISK_SHARE / BYTES_PER_DELIVERY / days)
    if room < wanted:
        return room, f"{room:,}/day (the disk's room; {scale:g} of 2 M/day asked)"
    return wanted, f"{wanted:,}/day ({wanted / FULL_SCALE_PER_DAY:.2%} of 2 M/day)"


def _make_days(db: Any, start: datetime, days: int) -> None:
    """PostgreSQL: the day partitions of the history about to be loaded, as the scheduler
    would have made them ahead on each of those days (the rows would otherwise land in the
    default partition, and retention would delete rows instead of dropping days)."""
    from app.lifecycle import partitions

    if db.engine.dialect.name != "postgresql":
        return
    with db.engine.begin() as connection:
        for spec in partitions.SPECS:
            if partitions.is_partitioned(connection, spec.table):
                for offset in range(days + 1):
                    partitions.create(connection, spec, start + timedelta(days=offset))


def _load(
    db: Any, partner_id: str, endpoint_id: str, days: int, per_day: int, now: datetime
) -> Loaded:
    loaded = Loaded()
    start = now - timedelta(days=days)
    _make_days(db, start, days)
    step = timedelta(days=1) / per_day
    total = days * per_day
    for base in range(0, total, CHUNK):
        events, deliveries, attempts, letters = [], [], [], []
        for i in range(base, min(total, base + CHUNK)):
            at = start + i * step
            event_id, delivery_id = id_at("evt", at), id_at("dlv", at)
            data = {"order_id": f"h-{i}", "amount": 1000 + i % 997}
            payload = {"id": event_id, "type": TYPE_NAME, "version": 1, "data": data}
            events.append(
                {
                    "id": event_id,
                    "partner_id": partner_id,
                    "type": TYPE_NAME,
                    "version": 1,
                    "data": data,
                    "payload": json.dumps(payload),
                    "occurred_at": at,
                    "created_at": at,
                    "feed_seq": i + 1,
                }
            )
            dead, retrying = i % 100 == 37, i % 1000 == 501
            tries = 2 if i % 10 == 3 or dead else 1
            state = "dead" if dead else "retrying" if retrying else "succeeded"
            deliveries.append(
                {
                    "id": delivery_id,
                    "event_id": event_id,
                    "endpoint_id": endpoint_id,
                    "state": state,
                    "attempt_count": tries,
                    "run_attempts": tries,
                    "run": 1,
                    "forced": False,
                    "succeeded_at": at if state == "succeeded" else None,
                    "next_attempt_at": now + timedelta(days=1) if retrying else None,
                    "last_status_code": 500 if dead or retrying else 200,
                    "created_at": at,
                    "updated_at": at,
                }
            )
            for n in range(1, tries + 1):
                ok = n == tries and not dead
                attempts.append(
                    {
                        "id": id_at("att", at + timedelta(seconds=n)),
                        "delivery_id": delivery_id,
                        "n": n,
                        "started_at": at,
                        "duration_ms": 12,
                        "url": "http://127.0.0.1:9/hook",
                        "request_headers": {},
                        "response_status": 200 if ok else 500,
                        "response_body": b"ok" if ok else b"database is down",
                        "created_at": at,
                    }
                )
            if dead:
                is_open = (i // 100) % 5 == 0
                letters.append(
                    {
                        "id": id_at("dl", at + timedelta(minutes=5)),
                        "delivery_id": delivery_id,
                        "event_id": event_id,
                        "endpoint_id": endpoint_id,
                        "partner_id": partner_id,
                        "event_type": TYPE_NAME,
                        "reason": "max_attempts",
                        "last_status_code": 500,
                        "last_error": "HTTP 500",
                        "search_text": json.dumps(payload),
                        "state": "open" if is_open else "discarded",
                        "created_at": at + timedelta(minutes=5),
                        "updated_at": at + timedelta(minutes=5),
                        "resolved_at": None if is_open else at + timedelta(hours=1),
                    }
                )
                loaded.open_letters += is_open
            loaded.retrying += retrying
        with db.begin() as session:
            session.execute(insert(Event), events)
            session.execute(insert(Delivery), deliveries)
            session.execute(insert(Attempt), attempts)
            if letters:
                session.execute(insert(DeadLetter), letters)
        loaded.events += len(events)
        loaded.deliveries += len(deliveries)
        loaded.attempts += len(attempts)
        loaded.dead_letters += len(letters)
    if db.engine.dialect.name == "postgresql":
        # Vacuumed as autovacuum would have over the month: freshly loaded, the tables pass
        # autovacuum's insert threshold, and it would vacuum them during the live phases
        # (the phase without retention among them), a cost the month would not show.
        with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM (ANALYZE)"))
    return loaded


# ---------------------------------------------------------------------------- measuring


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


TABLES = ("events", "deliveries", "attempts", "dead_letters", "audit_records")


def sizes(db: Any) -> dict[str, tuple[int, int | None, int | None]]:
    """Per table: rows, and on PostgreSQL table and index bytes summed over its partitions
    (a partitioned parent holds none itself)."""
    found: dict[str, tuple[int, int | None, int | None]] = {}
    with db.begin() as session:
        postgres = session.bind.dialect.name == "postgresql"
        for table in TABLES:
            count = text(f"SELECT count(*) FROM {table}")  # noqa: S608 - our own names
            rows = int(session.execute(count).scalar_one())
            table_bytes = index_bytes = None
            if postgres:
                table_size, index_size = session.execute(
                    text(
                        "SELECT coalesce(sum(pg_table_size(relid)), 0),"
                        " coalesce(sum(pg_indexes_size(relid)), 0)"
                        " FROM (SELECT relid FROM pg_partition_tree(CAST(:t AS regclass))"
                        " UNION SELECT CAST(:t AS regclass)) AS tree"
                    ),
                    {"t": table},
                ).one()
                table_bytes, index_bytes = int(table_size), int(index_size)
            found[table] = (rows, table_bytes, index_bytes)
    return found


def show_sizes(label: str, found: dict[str, tuple[int, int | None, int | None]]) -> None:
    print(f"{label}:")
    for table, (rows, table_bytes, index_bytes) in found.items():
        size = (
            ""
            if table_bytes is None or index_bytes is None
            else f"  table {table_bytes / 1e6:8.1f} MB  indexes {index_bytes / 1e6:8.1f} MB"
        )
        print(f"  {table:<14} {rows:>11,} rows{size}")


def reads(db: Any, endpoint_id: str, repeat: int) -> dict[str, tuple[float, float]]:
    """p50 and p95 (ms) of the dead-letter searches and delivery-log pages operators and
    partners run most, through the services every face calls."""
    from app.services import deliveries
    from app.services.actor import Actor
    from dlq.search import DeadLetterFilter, search

    now = utcnow()
    operator = Actor.operator("bench@example.com")
    runs: dict[str, Callable[[Any], object]] = {
        "dead letters: open, first page": lambda s: search(
            s, DeadLetterFilter(state="open"), limit=50
        ),
        "dead letters: q order id": lambda s: search(s, DeadLetterFilter(q="h-1037"), limit=50),
        "dead letters: last 24 h": lambda s: search(
            s, DeadLetterFilter(since=now - timedelta(days=1)), limit=50
        ),
        "delivery log: endpoint, first page": lambda s: deliveries.page(
            s, operator, deliveries.DeliveryFilter(endpoint=endpoint_id), limit=50, cursor=None
        ),
        "delivery log: state dead": lambda s: deliveries.page(
            s, operator, deliveries.DeliveryFilter(state="dead"), limit=50, cursor=None
        ),
    }
    found: dict[str, tuple[float, float]] = {}
    for name, run in runs.items():
        samples = []
        for _ in range(repeat):
            with db.Session() as session:
                t0 = time.perf_counter()
                run(session)
                samples.append((time.perf_counter() - t0) * 1000)
                session.rollback()
        found[name] = (statistics.median(samples), pct(samples, 0.95))
    return found


def show_reads(
    before: dict[str, tuple[float, float]], afters: list[tuple[str, dict[str, tuple[float, float]]]]
) -> None:
    heads = "".join(f" {label + ' p50/p95 ms':>22}" for label, _ in afters)
    print(f"  {'read':<36} {'before p50/p95 ms':>20}{heads}")
    for name, (p50, p95) in before.items():
        cells = "".join(f" {found[name][0]:11.1f} / {found[name][1]:7.1f}" for _, found in afters)
        print(f"  {name:<36} {p50:9.1f} / {p95:7.1f} {cells}")


def settle(db: Any, limit_s: float) -> tuple[float, str]:
    """PostgreSQL: wait until no autovacuum runs in the bench's database and no table is
    over autovacuum's default trigger (50 dead rows + 20 % of its live ones), for two looks
    in a row 10 s apart (a worker starts within `autovacuum_naptime`, a minute). Where the
    server runs without autovacuum, a `VACUUM (ANALYZE)` of the purged tables does what it
    would have. Seconds waited, and how it ended."""
    began = time.perf_counter()
    # VACUUM runs outside a transaction: the connection autocommits from its first statement.
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        if connection.execute(text("SELECT current_setting('autovacuum')")).scalar_one() != "on":
            connection.execute(text(f"VACUUM (ANALYZE) {', '.join(TABLES)}"))
            return time.perf_counter() - began, "vacuumed by the bench (autovacuum is off)"
    calm = 0
    while time.perf_counter() - began < limit_s:
        with db.engine.connect() as connection:
            running = connection.execute(
                text(
                    "SELECT count(*) FROM pg_stat_progress_vacuum "
                    "WHERE datname = current_database()"
                )
            ).scalar_one()
            due = connection.execute(
                text(
                    "SELECT count(*) FROM pg_stat_user_tables "
                    "WHERE n_dead_tup > 50 + 0.2 * n_live_tup"
                )
            ).scalar_one()
        calm = calm + 1 if running == 0 and due == 0 else 0
        if calm >= 2:
            return time.perf_counter() - began, "settled (autovacuum done)"
        time.sleep(10)
    return time.perf_counter() - began, "still busy (autovacuum)"


@dataclass
class Publishes:
    """A paced publish phase. `from_send` is each publish's own time (what its client
    waited once it sent); `from_schedule` counts from when the pacing meant to send it, so
    a publish held back by the one before it counts the wait too (a single paced client
    otherwise hides a stall: the publishes due during it are sent late, then answered
    fast). `due_at` is when each was due, or sent if earlier (`time.perf_counter()`)."""

    from_send: list[float] = field(default_factory=list)
    from_schedule: list[float] = field(default_factory=list)
    due_at: list[float] = field(default_factory=list)
    # This process's garbage collections meanwhile: (started, ms, generation). The API runs
    # in this process, so a collection over the bench's own heap stalls the publishes.
    collections: list[tuple[float, float, int]] = field(default_factory=list)


class GcWatch:
    """Records every garbage collection of this process while entered."""

    def __init__(self, into: list[tuple[float, float, int]]) -> None:
        self.into = into
        self._began = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            ms = (time.perf_counter() - self._began) * 1000.0
            self.into.append((self._began, ms, info["generation"]))

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def gc_stalls(phase: Publishes, over_ms: float = 10.0) -> str:
    """The phase's collections that took over `over_ms`, in words."""
    slow = [ms for _, ms, _ in phase.collections if ms > over_ms]
    longest = max((ms for _, ms, _ in phase.collections), default=0.0)
    return (
        f"{len(phase.collections)} garbage collections in this process, "
        f"{len(slow)} over {over_ms:.0f} ms, longest {longest:.1f} ms"
    )


def publish_phase(client: Any, auth: dict[str, str], n: int, rate: float, tag: str) -> Publishes:
    """`n` publishes paced at `rate` a second (open loop), their latencies in ms."""
    found = Publishes()
    with GcWatch(found.collections):
        _publish_paced(found, client, auth, n, rate, tag)
    return found


def _publish_paced(
    found: Publishes, client: Any, auth: dict[str, str], n: int, rate: float, tag: str
) -> None:
    interval = 1.0 / rate
    started = time.perf_counter()
    for i in range(n):
        due = started + i * interval
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        sent = time.perf_counter()
        answer = client.post(
            f"/v1/partners/{UID}/events",
            headers=auth,
            json={"type": TYPE_NAME, "version": 1, "data": {"order_id": f"{tag}-{i}", "amount": 1}},
        )
        done = time.perf_counter()
        found.from_send.append((done - sent) * 1000.0)
        found.from_schedule.append((done - min(due, sent)) * 1000.0)
        found.due_at.append(min(due, sent))
        if answer.status_code != 202:
            raise SystemExit(f"publish failed: {answer.status_code} {answer.get_data()!r}")


@dataclass
class LockSample:
    samples: int = 0
    strongest: dict[str, int] = field(default_factory=dict)  # mode -> samples seen held
    waiting_samples: int = 0
    longest_wait_ms: float = 0.0
    # (time.perf_counter(), strongest lock held or "", the statement running or "") per sample
    timeline: list[tuple[float, str, str]] = field(default_factory=list)


LOCK_RANK = (
    "AccessShareLock",
    "RowShareLock",
    "RowExclusiveLock",
    "ShareUpdateExclusiveLock",
    "ShareLock",
    "ShareRowExclusiveLock",
    "ExclusiveLock",
    "AccessExclusiveLock",
)


class LockSampler:
    """`pg_locks` every 50 ms: the strongest relation lock the retention process's backend
    holds, and any backend of this database waiting on a lock (and for how long)."""

    def __init__(self, url: str, application_name: str) -> None:
        import psycopg

        self.conn = psycopg.connect(
            url.replace("postgresql+psycopg", "postgresql"), autocommit=True
        )
        self.application_name = application_name
        self.found = LockSample()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            at = time.perf_counter()
            held = self.conn.execute(
                "SELECT DISTINCT l.mode FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                " JOIN pg_class c ON c.oid = l.relation"
                " WHERE a.application_name = %s AND l.locktype = 'relation' AND l.granted"
                # Not its own temporary tables: making one holds it ACCESS EXCLUSIVE.
                " AND c.relpersistence <> 't'",
                (self.application_name,),
            ).fetchall()
            running = self.conn.execute(
                "SELECT string_agg(left(regexp_replace(query, '\\s+', ' ', 'g'), 70), ' | ')"
                " FROM pg_stat_activity WHERE application_name = %s AND state = 'active'",
                (self.application_name,),
            ).fetchone()
            waiting = self.conn.execute(
                "SELECT coalesce(max(extract(epoch FROM now() - a.state_change)), -1)"
                " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                " WHERE NOT l.granted AND a.datname = current_database()"
            ).fetchone()
            self.found.samples += 1
            modes = [m for (m,) in held if m in LOCK_RANK]
            top = max(modes, key=LOCK_RANK.index) if modes else ""
            if top:
                self.found.strongest[top] = self.found.strongest.get(top, 0) + 1
            self.found.timeline.append((at, top, (running[0] if running else None) or ""))
            if waiting and float(waiting[0]) >= 0:
                self.found.waiting_samples += 1
                self.found.longest_wait_ms = max(
                    self.found.longest_wait_ms, float(waiting[0]) * 1000
                )
            self.stop.wait(0.05)

    def __enter__(self) -> LockSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.conn.close()


RETENTION_APP_NAME = "kurir-bench-retention"


def _retain(env: dict[str, str], out: Any, ready: Any, go: Any) -> None:
    """The retention run, in a process of its own (the scheduler's place in a deployment),
    begun on `go` once it has said it is `ready`: a scheduler is up before its job runs, and
    a process starting (imports, a first connection) took the CPU from the publishes of the
    phase's first half second (a stall of 94 ms)."""
    os.environ.update(env)
    os.environ["PGAPPNAME"] = RETENTION_APP_NAME
    from app.config import load_settings
    from app.db import Database
    from app.lifecycle import purge
    from app.runtime import Runtime

    settings = load_settings(env)
    db = Database(settings.resolved_database_url, pool_size=2, application_name=RETENTION_APP_NAME)
    rt = Runtime(settings, database=db)
    with db.engine.connect():
        pass
    ready.set()
    go.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    report = purge.run(rt)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    busy = [b for b in report.batches if b.examined]
    out.put(
        {
            "wall_s": wall,
            "cpu_s": cpu,
            "purged": {kind.value: n for kind, n in report.purged.items()},
            "batches": len(busy),
            "longest_ms": max((b.elapsed_ms for b in busy), default=0.0),
            "p99_ms": pct([b.elapsed_ms for b in busy], 0.99),
            "drops_ms": [b.elapsed_ms for b in report.batches if b.source.startswith("drop:")],
            "locked_ms": [b.locked_ms for b in report.batches if b.locked_ms is not None],
            "removed_ms": [b.removed_ms for b in report.batches if b.removed_ms is not None],
            "slowest": [
                (b.source, b.examined, round(b.elapsed_ms, 1))
                for b in sorted(busy, key=lambda b: -b.elapsed_ms)[:5]
            ],
        }
    )


def show_slowest(
    latencies: list[float],
    due_at: list[float],
    timeline: list[tuple[float, str, str]],
    slow_ms: float,
    collections: list[tuple[float, float, int]] | None = None,
) -> None:
    """The slowest publishes while retention ran, each beside what the retention backend was
    doing meanwhile (from the `pg_locks` samples: a drop holding the tables if any sample
    between the publish's due time and its answer says so, else the sample just before it:
    a drop's first step, a batch's delete, or nothing); and how many took over `slow_ms`,
    and how many of those met a drop's locks (the only thing retention holds that a publish
    waits for)."""
    if not timeline:
        return
    times = [sample[0] for sample in timeline]

    def doing(i: int) -> tuple[str, str]:
        first = bisect.bisect_right(times, due_at[i])
        last = bisect.bisect_right(times, due_at[i] + latencies[i] / 1000.0)
        for _, mode, running in timeline[first:last]:
            if mode == "AccessExclusiveLock":
                return mode, running
        _, mode, running = timeline[max(0, first - 1)]
        return mode, running

    slow = [i for i, ms in enumerate(latencies) if ms > slow_ms]
    locked = sum(1 for i in slow if doing(i)[0] == "AccessExclusiveLock")
    print(
        f"  publishes over {slow_ms:.1f} ms from schedule (1.5 x p99 without): {len(slow)}, "
        f"{locked} of them met a drop holding the tables"
    )
    started = due_at[0]
    print(
        "  slowest publishes while retention ran (s after the first, ms from schedule, "
        "what retention was doing):"
    )

    def collected(i: int) -> str:
        """This process's slowest collection while the publish waited, if over 10 ms."""
        end = due_at[i] + latencies[i] / 1000.0
        ms = max(
            (ms for at, ms, _ in collections or [] if due_at[i] <= at + ms / 1000.0 and at <= end),
            default=0.0,
        )
        return f"; this process collecting garbage {ms:.0f} ms" if ms > 10.0 else ""

    def before(i: int) -> str:
        """When retention's backend is idle: the last statement seen running before, and
        how long before the publish was due (what a stall may still be paying for)."""
        for at, _, running in reversed(timeline[: bisect.bisect_right(times, due_at[i])]):
            if running:
                return f" (last: {running[:60]}, {(due_at[i] - at) * 1000:.0f} ms before)"
        return ""

    for i in sorted(range(len(latencies)), key=lambda i: -latencies[i])[:12]:
        mode, running = doing(i)
        print(
            f"    +{due_at[i] - started:6.2f} s {latencies[i]:7.2f} ms  "
            f"{mode or 'no lock'}: {running or 'idle' + before(i)}{collected(i)}"
        )


def recorded(db: Any, delivery_ids: list[str], timeout_s: float) -> int:
    """Wait until every one of `delivery_ids` is recorded as succeeded; how many are."""
    deadline = time.monotonic() + timeout_s
    done = 0
    while time.monotonic() < deadline:
        done = 0
        for start in range(0, len(delivery_ids), 1000):
            with db.begin() as session:
                done += int(
                    session.scalar(
                        select(func.count())
                        .select_from(Delivery)
                        .where(
                            Delivery.id.in_(delivery_ids[start : start + 1000]),
                            Delivery.state == "succeeded",
                        )
                    )
                    or 0
                )
        if done >= len(delivery_ids):
            break
        time.sleep(0.05)
    return done


def unfinished(db: Any) -> tuple[int, int]:
    with db.begin() as session:
        open_letters = session.scalar(
            select(func.count()).select_from(DeadLetter).where(DeadLetter.state == "open")
        )
        retrying = session.scalar(
            select(func.count()).select_from(Delivery).where(Delivery.state == "retrying")
        )
    return int(open_letters or 0), int(retrying or 0)


# ---------------------------------------------------------------------------- the run


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument(
        "--scale", type=float, default=1.0, help="of 2 M deliveries a day (cut to the disk)"
    )
    parser.add_argument("--retain-days", type=int, default=7)
    parser.add_argument("--publishes", type=int, default=400)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--drain", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=60)
    parser.add_argument(
        "--settle-s",
        type=float,
        default=1800,
        help="PostgreSQL: longest wait for autovacuum before the settled reads (0: none)",
    )
    parser.add_argument("--batch-ms", type=int, default=50)
    parser.add_argument(
        "--retention-yield",
        type=int,
        default=None,
        help="KURIR_RETENTION_YIELD for the retention run (default: the backend's own)",
    )
    parser.add_argument(
        "--redis", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/6")
    )
    args = parser.parse_args()

    from app import runtime as runtime_mod
    from bench.deliver import Kurir
    from bench.fresh_db import fresh_database
    from tests.support.fast_receiver import ReceiverProcess

    tmp = Path(tempfile.mkdtemp(prefix="kurir-lifecycle-"))
    url = os.environ.get("BENCH_DATABASE_URL") or f"sqlite:///{tmp / 'kurir.db'}"
    url = fresh_database(url)
    per_day, scale_note = _per_day(args.scale, args.days, tmp)
    retain = str(args.retain_days)
    os.environ.update(
        KURIR_RETAIN_EVENTS_DAYS=retain,
        KURIR_RETAIN_ATTEMPTS_DAYS=retain,
        KURIR_RETAIN_DEAD_LETTERS_DAYS=retain,
        KURIR_RETENTION_BATCH_MS=str(args.batch_ms),
        KURIR_RETENTION_YIELD="" if args.retention_yield is None else str(args.retention_yield),
        KURIR_LOG_LEVEL="warning",
    )
    with ReceiverProcess() as receiver:
        kurir = Kurir(url, args.redis, args.workers, tmp / "data")
        rt = kurir.runtime
        runtime_mod.install(rt)
        from app.accounts import create_api_key
        from app.services import endpoints as endpoint_service
        from app.services import partners as partner_service
        from app.services.actor import Actor
        from app.web import create_app

        with rt.db.begin() as session:
            actor = Actor.operator("bench@example.com")
            partner_service.create(session, actor, {"uid": UID, "name": "Acme"})
            endpoint_service.create(session, rt, actor, UID, {"url": receiver.url + RECEIVER_PATH})
            _, token = create_api_key(session, "bench-publisher", ["admin"])
            partner_id = session.scalar(select(Partner.id).where(Partner.uid == UID))
            endpoint_id = session.scalar(
                select(Endpoint.id).where(Endpoint.partner_id == partner_id)
            )
        assert partner_id is not None
        assert endpoint_id is not None
        auth = {"Authorization": f"Bearer {token}"}
        client = create_app(runtime=rt).test_client()

        print(f"database: {rt.db.engine.dialect.name}; {os.cpu_count()} CPUs; {scale_note}")
        t0, c0 = time.perf_counter(), time.process_time()
        loaded = _load(rt.db, partner_id, endpoint_id, args.days, per_day, utcnow())
        print(
            f"loaded {args.days} days in {time.perf_counter() - t0:.0f} s "
            f"(cpu {time.process_time() - c0:.0f} s): {loaded.events:,} events, "
            f"{loaded.deliveries:,} deliveries, {loaded.attempts:,} attempts, "
            f"{loaded.dead_letters:,} dead letters ({loaded.open_letters:,} open), "
            f"{loaded.retrying:,} deliveries retrying"
        )
        before_sizes = sizes(rt.db)
        show_sizes("before", before_sizes)
        before_reads = reads(rt.db, endpoint_id, args.repeat)

        kurir.start()
        try:
            return _live(args, kurir, client, auth, url, loaded, endpoint_id, before_reads)
        finally:
            kurir.stop()


def _live(
    args: argparse.Namespace,
    kurir: Any,
    client: Any,
    auth: dict[str, str],
    url: str,
    loaded: Loaded,
    endpoint_id: str,
    before_reads: dict[str, tuple[float, float]],
) -> int:
    """The live phases, with the workers running, and what they printed."""
    from sender.dispatch import enqueue_now

    rt = kurir.runtime

    def drain(n: int) -> tuple[float, float]:
        """A backlog of `n` deliveries: deliveries/s until every outcome is recorded, and
        worker CPU ms per delivery."""
        backlog = kurir.publish_quietly(UID, n)
        cpu0 = kurir.worker_cpu_s()
        began = time.perf_counter()
        enqueue_now(rt.redis, backlog)
        done = recorded(rt.db, backlog, timeout_s=600)
        elapsed = time.perf_counter() - began
        if done < len(backlog):
            print(f"  only {done} of {len(backlog)} recorded as delivered")
        return done / elapsed, (kurir.worker_cpu_s() - cpu0) * 1000 / max(1, done)

    # Five seconds of warm-up: four runs of four met one stall of 120-350 ms in the first
    # seconds of the phase without retention (3 s in, where the bench said), whatever
    # retention later did, when the warm-up was 20 publishes.
    publish_phase(client, auth, max(20, int(args.rate * WARM_S)), args.rate, "warm")
    alone = publish_phase(client, auth, args.publishes, args.rate, "alone")
    alone_drain = drain(args.drain)

    env = {k: v for k, v in kurir.env.items() if isinstance(v, str)}
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    ready, go = ctx.Event(), ctx.Event()
    retention = ctx.Process(target=_retain, args=(env, out, ready, go))
    postgres = rt.db.engine.dialect.name == "postgresql"
    sampler = LockSampler(url, RETENTION_APP_NAME) if postgres else None
    with sampler or _Nothing():
        retention.start()
        if not ready.wait(300):
            raise SystemExit("the retention process did not start")
        go.set()
        during = publish_phase(client, auth, args.publishes, args.rate, "during")
        during_drain = drain(args.drain)
        finished_early = not retention.is_alive()
        result = out.get(timeout=3600)
        retention.join()

    print(f"publish latency, in-process API paced at {args.rate:.0f}/s (ms):")
    for name, measure in (
        ("from send", lambda p: p.from_send),
        ("from schedule", lambda p: p.from_schedule),
    ):
        for label, phase in (("without retention", alone), ("while retention runs", during)):
            values = measure(phase)
            worst = max(range(len(values)), key=values.__getitem__)
            print(
                f"  {name:<14} {label:<22} p50 {pct(values, 0.5):6.2f}  "
                f"p99 {pct(values, 0.99):6.2f}  max {max(values):7.2f} "
                f"(+{phase.due_at[worst] - phase.due_at[0]:.2f} s)"
            )
        ratio = pct(measure(during), 0.99) / pct(measure(alone), 0.99)
        print(f"  {name:<14} p99 ratio {ratio:.2f} x (target <= 1.5 x)")
    for label, phase in (("without retention", alone), ("while retention runs", during)):
        print(f"  {label}: {gc_stalls(phase)}")
    if sampler is not None:
        show_slowest(
            during.from_schedule,
            during.due_at,
            sampler.found.timeline,
            1.5 * pct(alone.from_schedule, 0.99),
            during.collections,
        )
    print(f"drain of {args.drain:,} deliveries, {args.workers} workers:")
    for label, (rate, cpu) in (
        ("without retention", alone_drain),
        ("while retention runs", during_drain),
    ):
        print(f"  {label:<22} {rate:8.0f} deliveries/s  worker cpu {cpu:.3f} ms/delivery")
    print(
        f"retention: {sum(result['purged'].values()):,} rows in {result['wall_s']:.1f} s wall, "
        f"{result['cpu_s']:.1f} s cpu; {result['batches']} batches, longest "
        f"{result['longest_ms']:.0f} ms, p99 {result['p99_ms']:.0f} ms"
        + ("; it finished before the live phases did" if finished_early else "")
    )
    drops = result["drops_ms"]
    if drops:
        print(
            f"  whole days dropped (partitions): {len(drops)}, per day p50 "
            f"{statistics.median(drops):.0f} ms, max {max(drops):.0f} ms (target <= 1 s); "
            f"of which the tables locked p50 {statistics.median(result['locked_ms']):.0f} ms, "
            f"max {max(result['locked_ms']):.0f} ms; removing the detached tables' files "
            f"after, p50 {statistics.median(result['removed_ms']):.0f} ms, "
            f"max {max(result['removed_ms']):.0f} ms"
        )
    for kind, n in result["purged"].items():
        print(f"  {kind:<14} {n:,}")
    for source, examined, ms in result["slowest"]:
        print(f"  slowest: {source} {examined:,} rows {ms} ms")
    if sampler is not None:
        found = sampler.found
        held = ", ".join(f"{m} in {n}" for m, n in found.strongest.items()) or "none"
        print(
            f"pg_locks, {found.samples} samples: strongest relation lock retention held: "
            f"{held}; samples with a backend waiting on a lock: {found.waiting_samples}, "
            f"longest wait seen {found.longest_wait_ms:.0f} ms"
        )
    show_sizes("after", sizes(rt.db))
    after_reads = reads(rt.db, endpoint_id, args.repeat)
    afters = [("after", after_reads)]
    if rt.db.is_postgres and args.settle_s > 0:
        waited, how = settle(rt.db, args.settle_s)
        print(f"after the purge: {how}, {waited:.0f} s")
        afters.append(("settled", reads(rt.db, endpoint_id, args.repeat)))
    print("reads before and after retention:")
    show_reads(before_reads, afters)
    kept_open, kept_retrying = unfinished(rt.db)
    print(
        f"unfinished rows kept: {kept_open:,} of {loaded.open_letters:,} open dead letters, "
        f"{kept_retrying:,} of {loaded.retrying:,} retrying deliveries"
    )
    return 0 if (kept_open, kept_retrying) == (loaded.open_letters, loaded.retrying) else 1


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
