"""PostgreSQL retention by whole partitions: a day of attempts, or a day of deliveries with
its attempts, dropped once the whole day is past its kind's horizon.

Deleting a day row by row costs as much as writing it; dropping its partition costs a
catalog change. But a past day may still hold rows that must stay (a delivery retrying, an
open dead letter, an ordered key's held deliveries, an event a pull endpoint has not read):
those are set aside first, in the same transaction, then put back through the parent, where
they land in the default partition (their day's range no longer exists) and the row-level
purge (`app.lifecycle.purge`) takes them once they are finished. What is dropped is exactly
what the row-level rules would delete; the tests hold both to the same cases.

One transaction per partition:
1. lock the day's partitions against writes (readers go on; nothing current is in them),
2. copy the rows to keep into temporary tables and delete them from the day (deleting a
   kept delivery cascades to its attempts and dead letters, which were copied too),
3. `_before_drop`: the partition now holds only what is purged (the archive's hook),
4. detach and drop the partitions (the only step that locks the parent, briefly),
5. insert the kept rows back.

Locks are taken first, all of them, in one fixed order (`_LOCKS`): the parents and every
table the detach touches, before any partition. A publish, a claim or a recorder locks a
parent before its partitions (and a prepared plan locks every partition), so a drop that held
a partition while it asked for the parent would wait in a cycle with them; PostgreSQL would
then break the deadlock by failing one of them, a publish among them. Taking the parents first
means the day's work runs with the tables' writers held off (readers of the other tables go
on): tens of milliseconds for a small day, about the drop's own time for a large one.
`lock_timeout` (below `deadlock_timeout`) bounds the wait for those locks: on a timeout the
drop, never the traffic, gives way, tries again a few times, then leaves the day for the next
run.
"""

# SQL here names partitions and temporary tables (made by this package, never from input);
# every value is a bound parameter or one of the vocabulary's constants.
# ruff: noqa: S608

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from psycopg.errors import LockNotAvailable
from sqlalchemy import Connection, text
from sqlalchemy.exc import OperationalError

from app.event_types import RESERVED_PREFIX
from app.feed.sequencer import head
from app.ids import id_floor
from app.lifecycle import partitions, policy
from app.lifecycle.partitions import ATTEMPTS, DELIVERIES, Partition
from app.runtime import Runtime
from app.vocabulary import DeadLetterState, DeliveryState, EndpointMode, RetentionKind

log = logging.getLogger(__name__)

# How long a drop waits for its locks before giving way; below PostgreSQL's default
# deadlock_timeout (1 s), so in a lock cycle the drop times out before anyone is failed.
LOCK_TIMEOUT_MS = 400
# Tries per day before it is left for the next run, and the pause between them.
LOCK_TRIES = 5
LOCK_RETRY_PAUSE_S = 0.5
# States still being worked on, spelt out so the partial index ix_deliveries_due answers.
_UNFINISHED = tuple(s.value for s in DeliveryState if s not in policy.FINISHED_DELIVERY_STATES)
# Rows of a day whose delivery was made for an event of the day before (publish crossing
# midnight) are judged with the events of both days.
_EVENT_WINDOW = timedelta(days=1)


@dataclass(frozen=True)
class Dropped:
    """One day dropped: its partitions, rows purged with them and rows set aside."""

    kind: RetentionKind
    day: datetime
    purged: int
    kept: int
    elapsed_ms: float
    # Of which the parent tables were locked (from the first detach to the commit).
    locked_ms: float

    @property
    def counted(self) -> int:
        """Rows of the kind itself: attempts for attempts; for events none (their events
        are deleted by the row-level purge, which counts them)."""
        return self.purged if self.kind == RetentionKind.ATTEMPTS else 0


def _before_drop(connection: Connection, table: str, partition_name: str) -> None:
    """Called with the partition holding exactly the rows about to be purged, in the drop's
    transaction: where writing them elsewhere first (an archive) plugs in. Nothing yet."""


def _unfinished_in(column: str) -> str:
    states = ", ".join(f"'{s}'" for s in _UNFINISHED)
    return (
        f"{column} IN (SELECT id FROM deliveries WHERE state IN ({states})) "
        f"OR {column} IN (SELECT delivery_id FROM dead_letters "
        f"WHERE state = '{DeadLetterState.OPEN.value}')"
    )


# Per kind, the locks a day's drop takes before anything else, in this order: (mode, tables).
# Dropping a detached partition removes its foreign keys' triggers from the tables they
# reference, which takes those tables whole (`ACCESS EXCLUSIVE`): events and endpoints for a
# deliveries day, deliveries for an attempts day. The detach touches the tables referencing
# the day (dead letters) against writes.
_LOCKS: dict[RetentionKind, tuple[tuple[str, str], ...]] = {
    RetentionKind.ATTEMPTS: (("ACCESS EXCLUSIVE", "deliveries, attempts"),),
    RetentionKind.EVENTS: (
        ("ACCESS EXCLUSIVE", "events, endpoints, deliveries, attempts"),
        ("SHARE ROW EXCLUSIVE", "dead_letters, dead_letter_audit"),
    ),
}


def _prepare(connection: Connection) -> None:
    connection.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_MS}ms'"))


def _lock_first(connection: Connection, kind: RetentionKind) -> None:
    _prepare(connection)
    for mode, tables in _LOCKS[kind]:
        connection.execute(text(f"LOCK TABLE {tables} IN {mode} MODE"))


def _exists(connection: Connection, name: str) -> bool:
    return connection.execute(text("SELECT to_regclass(:n)"), {"n": name}).scalar() is not None


def _detach_and_drop(connection: Connection, table: str, name: str) -> None:
    _before_drop(connection, table, name)
    connection.execute(text(f"ALTER TABLE {table} DETACH PARTITION {name}"))
    connection.execute(text(f"DROP TABLE {name}"))


def _count(connection: Connection, name: str) -> int:
    return int(connection.execute(text(f"SELECT count(*) FROM {name}")).scalar() or 0)


def _drop_attempts_day(
    connection: Connection, part: Partition, horizon: datetime
) -> tuple[int, int, float]:
    """Attempts of one delivery day: those of unfinished deliveries, and any made after the
    horizon (a resend of an old delivery), are kept."""
    _prepare(connection)
    deliveries_part = partitions.name_for(DELIVERIES, part.start)
    if _exists(connection, deliveries_part):
        # A delivery of the day resent meanwhile waits, so "unfinished" is read once.
        connection.execute(text(f"LOCK TABLE {deliveries_part} IN SHARE MODE"))
    connection.execute(text(f"LOCK TABLE {part.name} IN EXCLUSIVE MODE"))
    connection.execute(
        text(
            f"CREATE TEMP TABLE kept_attempts ON COMMIT DROP AS "
            f"SELECT * FROM {part.name} a WHERE a.created_at >= :horizon "
            f"OR {_unfinished_in('a.delivery_id')}"
        ),
        {"horizon": horizon},
    )
    connection.execute(text(f"DELETE FROM {part.name} WHERE id IN (SELECT id FROM kept_attempts)"))
    purged = _count(connection, part.name)
    locked_at = time.perf_counter()
    _detach_and_drop(connection, ATTEMPTS.table, part.name)
    kept = connection.execute(text("INSERT INTO attempts SELECT * FROM kept_attempts")).rowcount
    return purged, kept, locked_at


def _owed_clause(connection: Connection) -> str:
    """SQL true for an event a live pull endpoint has not acknowledged (as `purge._owed`)."""
    has_pull = connection.execute(
        text("SELECT 1 FROM endpoints WHERE mode = :pull AND deleted_at IS NULL LIMIT 1"),
        {"pull": EndpointMode.PULL.value},
    ).scalar()
    if not has_pull:
        return ""
    return (
        f" OR (e.type NOT LIKE '{RESERVED_PREFIX}%' AND EXISTS (SELECT 1 FROM endpoints p "
        f"WHERE p.partner_id = e.partner_id AND p.mode = '{EndpointMode.PULL.value}' "
        "AND p.deleted_at IS NULL AND e.feed_seq > COALESCE(p.acked_seq, 0) "
        "AND (p.event_types IS NULL OR json_typeof(p.event_types) = 'null' "
        "OR jsonb_exists(p.event_types::jsonb, e.type))))"
    )


def _drop_deliveries_day(
    connection: Connection, part: Partition, horizon: datetime
) -> tuple[int, int, float]:
    """Deliveries of one day with their attempts: those whose event the row-level purge
    would keep (see `purge._events`) are kept, with their attempts and dead letters."""
    _prepare(connection)
    attempts_part = partitions.name_for(ATTEMPTS, part.start)
    has_attempts = _exists(connection, attempts_part)
    connection.execute(text(f"LOCK TABLE {part.name} IN EXCLUSIVE MODE"))
    if has_attempts:
        connection.execute(text(f"LOCK TABLE {attempts_part} IN EXCLUSIVE MODE"))
    states = ", ".join(f"'{s}'" for s in _UNFINISHED)
    params = {
        "evt_low": id_floor("evt", part.start - _EVENT_WINDOW),
        "evt_high": id_floor("evt", part.end),
        "horizon": horizon,
        "head": head(connection),
    }
    # Materialised (and analysed) first: as a subquery under an OR, the planner may run it
    # once per delivery of the day.
    connection.execute(
        text(
            "CREATE TEMP TABLE held_events ON COMMIT DROP AS "
            f"SELECT event_id AS id FROM deliveries WHERE state IN ({states}) "
            "UNION SELECT event_id FROM dead_letters "
            "UNION SELECT e.id FROM events e WHERE e.id >= :evt_low AND e.id < :evt_high "
            "AND (e.created_at >= :horizon OR e.feed_seq IS NULL OR e.feed_seq = :head"
            f"{_owed_clause(connection)})"
        ),
        params,
    )
    connection.execute(text("ANALYZE held_events"))
    connection.execute(
        text(
            "CREATE TEMP TABLE kept_deliveries ON COMMIT DROP AS "
            f"SELECT * FROM {part.name} d WHERE d.event_id IN (SELECT id FROM held_events)"
        )
    )
    # A delivery whose event lies outside the window is left to the row-level purge.
    connection.execute(
        text(
            f"INSERT INTO kept_deliveries SELECT * FROM {part.name} d "
            "WHERE (d.event_id < :evt_low OR d.event_id >= :evt_high) "
            "AND NOT EXISTS (SELECT 1 FROM held_events h WHERE h.id = d.event_id)"
        ),
        params,
    )
    connection.execute(text("ANALYZE kept_deliveries"))
    for ddl in (
        "CREATE TEMP TABLE kept_attempts ON COMMIT DROP AS SELECT * FROM attempts "
        "WHERE delivery_id IN (SELECT id FROM kept_deliveries)",
        "CREATE TEMP TABLE kept_letters ON COMMIT DROP AS SELECT * FROM dead_letters "
        "WHERE delivery_id IN (SELECT id FROM kept_deliveries)",
        "CREATE TEMP TABLE kept_letter_audit ON COMMIT DROP AS SELECT * FROM dead_letter_audit "
        "WHERE dead_letter_id IN (SELECT id FROM kept_letters)",
        # Cascades to their attempts, dead letters and the letters' audit: all copied above.
        f"DELETE FROM {part.name} WHERE id IN (SELECT id FROM kept_deliveries)",
    ):
        connection.execute(text(ddl))
    # Attempts of the day set aside by an earlier attempts drop, whose deliveries go now.
    purged = connection.execute(
        text(
            f"DELETE FROM {partitions.default_name(ATTEMPTS)} "
            "WHERE delivery_id >= :low AND delivery_id < :high"
        ),
        {"low": part.low, "high": part.high},
    ).rowcount
    purged += _count(connection, part.name)
    locked_at = time.perf_counter()
    if has_attempts:
        purged += _count(connection, attempts_part)
        _detach_and_drop(connection, ATTEMPTS.table, attempts_part)
    _detach_and_drop(connection, DELIVERIES.table, part.name)
    kept = 0
    for table, temp in (
        ("deliveries", "kept_deliveries"),
        ("attempts", "kept_attempts"),
        ("dead_letters", "kept_letters"),
        ("dead_letter_audit", "kept_letter_audit"),
    ):
        found = connection.execute(text(f"INSERT INTO {table} SELECT * FROM {temp}")).rowcount
        kept += found if table == "deliveries" else 0
    return purged, kept, locked_at


# A day's drop: rows purged, rows kept, and when (perf_counter) it began to lock the parent.
DayFn = Callable[[Connection, Partition, datetime], tuple[int, int, float]]
# Per kind, the table whose days it drops and how; other kinds delete rows only.
_BY_KIND: dict[RetentionKind, tuple[partitions.Spec, DayFn]] = {
    RetentionKind.ATTEMPTS: (ATTEMPTS, _drop_attempts_day),
    RetentionKind.EVENTS: (DELIVERIES, _drop_deliveries_day),
}


def _drop_with_retries(
    runtime: Runtime, kind: RetentionKind, part: Partition, horizon: datetime, drop_day: DayFn
) -> tuple[int, int, float] | None:
    """One day's drop, its locks taken first; tried again when they were not granted in
    time. None: not dropped now (logged), left to the next run."""
    for attempt in range(1, LOCK_TRIES + 1):
        try:
            with runtime.db.engine.begin() as connection:
                _lock_first(connection, kind)
                locked_at = time.perf_counter()
                purged, kept, _ = drop_day(connection, part, horizon)
                return purged, kept, locked_at
        except OperationalError as exc:
            if not isinstance(exc.orig, LockNotAvailable) or attempt == LOCK_TRIES:
                log.warning("partition not dropped", extra={"partition": part.name}, exc_info=True)
                return None
            time.sleep(LOCK_RETRY_PAUSE_S)
        except Exception:
            log.warning("partition not dropped", extra={"partition": part.name}, exc_info=True)
            return None
    return None


def expired(connection: Connection, spec: partitions.Spec, horizon: datetime) -> list[Partition]:
    """The table's day partitions whose whole day lies before the horizon, oldest first."""
    return [p for p in partitions.partitions(connection, spec) if p.end <= horizon]


def run(
    runtime: Runtime,
    kind: RetentionKind,
    horizon: datetime,
    *,
    timer: Callable[[], float] = time.perf_counter,
) -> list[Dropped]:
    """Drop the kind's expired days (PostgreSQL with partitioned tables; otherwise none).

    A day that cannot be dropped now (a lock not granted in time) is logged and left to the
    next run; the row-level purge that follows handles its finished rows meanwhile.
    """
    if kind not in _BY_KIND or not runtime.db.is_postgres:
        return []
    spec, drop_day = _BY_KIND[kind]
    with runtime.db.engine.connect() as connection:
        if not partitions.is_partitioned(connection, spec.table):
            return []
        days = expired(connection, spec, horizon)
    done: list[Dropped] = []
    for part in days:
        started = timer()
        outcome = _drop_with_retries(runtime, kind, part, horizon, drop_day)
        if outcome is None:
            continue
        purged, kept, locked_at = outcome
        elapsed_ms = (timer() - started) * 1000.0
        locked_ms = (time.perf_counter() - locked_at) * 1000.0
        done.append(Dropped(kind, part.start, purged, kept, elapsed_ms, locked_ms))
        log.info(
            "partition dropped",
            extra={"partition": part.name, "purged": purged, "kept": kept, "ms": elapsed_ms},
        )
    return done
