"""PostgreSQL retention by whole partitions: a day of attempts, or a day of deliveries with
its attempts, dropped once the whole day is past its kind's horizon.

Deleting a day row by row costs as much as writing it; dropping its partition costs a
catalog change. But a past day may still hold rows that must stay (a delivery retrying, an
open dead letter, an ordered key's held deliveries, an event a pull endpoint has not read):
those are set aside, the partition dropped, and they are put back through the parent, where
they land in the default partition (their day's range no longer exists) and the row-level
purge (`app.lifecycle.purge`) takes them once they are finished. A day keeping many is
swapped instead (`app.lifecycle.swap`): its kept rows are copied before the locks into a
kept partition that takes the day's place, which a later run drops the same plain way once
few rows are left in it (`_to_fold`). What is dropped is exactly
what the row-level rules would delete; the tests hold both to the same cases.

A day goes in three steps on one connection, so that the tables are held only for the part
that needs them:

1. **Find**, with no lock beyond a reader's: which rows of the day must stay (their ids, in
   session temporary tables), and how many rows the day holds. This is the slow part (a
   scan of the day's rows and of what holds them), and traffic runs on meanwhile. With an
   archive, the rows to be purged are written to it here (`_archive_day`).
2. **Detach**, in one transaction with every lock taken first: look again only where a row
   can have become one to keep since step 1 (a delivery unfinished now, a dead letter or an
   attempt made since, an event not yet numbered in the feed, a pull endpoint added or sent
   back), all of them index lookups; copy the kept rows into temporary tables (by key),
   delete what refers into the day from outside it (the day's attempts in the default
   partition, where an earlier attempts drop put its kept ones: DETACH refuses otherwise),
   detach the partitions and drop their foreign keys, insert the kept rows back
   (`triggers.skip`). Dead letters name their delivery without a foreign key (migration
   0022), so a kept delivery's letters stay where they are.
3. **Remove** the detached tables, each in a transaction of its own (`_remove_detached`):
   unlinking their files no longer holds anyone's locks.

Locks are taken first, all of them, in one fixed order (`_LOCKS`): the parents and every
table the detach touches (for an attempts day only the deliveries partition its key refers
to, not that parent), before any partition of a parent it takes. A publish, a claim or a
recorder locks a parent before its partitions (and a prepared plan locks every partition),
so a drop that held a partition while it asked for the parent would wait in a cycle with
them; PostgreSQL would then break the deadlock by failing one of them, a publish among
them. `lock_timeout` (well below `deadlock_timeout`) bounds the wait for those locks, since
new writers queue behind a waiting drop: on a timeout the drop, never the traffic, gives way
and tries again (`app.lifecycle.giveway`, as a swap's brief steps do).

Between two days the run pauses `YIELD_FACTOR` times as long as the last one held its locks
(at least `YIELD_MIN_S`): a first run with weeks of days to drop would otherwise hold the
writers off back to back.
"""

# SQL here names partitions and temporary tables (made by this package, never from input);
# every value is a bound parameter or one of the vocabulary's constants.
# ruff: noqa: S608

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Table, select, text
from sqlalchemy import column as sql_column
from sqlalchemy import table as sql_table
from sqlalchemy.exc import OperationalError

from app.event_types import RESERVED_PREFIX
from app.feed.sequencer import head
from app.ids import id_floor
from app.lifecycle import archive, giveway, partitions, policy, swap, triggers
from app.lifecycle.partitions import ATTEMPTS, DELIVERIES, Partition
from app.runtime import Runtime
from app.vocabulary import DeadLetterState, DeliveryState, EndpointMode, RetentionKind

log = logging.getLogger(__name__)

# After a day, a pause this many times as long as its locks were held (and at least
# YIELD_MIN_S): the writers get at least 400 parts of the time in 401, so at most one
# publish in 400 meets a drop and the publishes' p99 (one in 100) is never set by drops.
YIELD_FACTOR = 400
YIELD_MIN_S = 0.5
# Kept partitions (`app.lifecycle.swap`) let stand: two months of days whose kept rows stay.
MAX_KEPT_PARTITIONS = 60
# States still being worked on, spelt out so the partial index ix_deliveries_due answers.
_UNFINISHED = tuple(s.value for s in DeliveryState if s not in policy.FINISHED_DELIVERY_STATES)
_UNFINISHED_SQL = ", ".join(f"'{s}'" for s in _UNFINISHED)
# Rows of a day whose delivery was made for an event of the day before (publish crossing
# midnight) are judged with the events of both days.
_EVENT_WINDOW = timedelta(days=1)
# Ids are made from the clock of the process that writes the row: dead letters and attempts
# made this long before step 1 are looked at again under the locks (a transaction open across
# step 1 may commit them late).
_LATE_MARGIN = timedelta(minutes=10)
# Session temporary tables of step 1 (kept across its commit), dropped when the day is done.
_FOUND_TABLES = "keep_ids, held_events"


@dataclass(frozen=True)
class Dropped:
    """One day dropped: its partitions, rows purged with them and rows set aside."""

    kind: RetentionKind
    day: datetime
    purged: int
    kept: int
    elapsed_ms: float
    # Of which the tables were locked (from the locks granted to the commit).
    locked_ms: float
    # Of which, after the commit, the detached tables' files were removed (unlinking a
    # day's files: 0.4 s per 1 M attempts or deliveries here, holding no one's locks).
    removed_ms: float
    # Of `purged`, attempts (a deliveries day takes its attempts with it): the rows of a
    # kind a drop purges. Events are deleted by the row-level purge, which counts them.
    attempts: int


@dataclass(frozen=True)
class Purged:
    """Rows a day's drop purged: all of them, and of those the attempts."""

    rows: int
    attempts: int


@dataclass(frozen=True)
class Found:
    """What step 1 found, unlocked: the ids to keep are in the session table `keep_ids`."""

    rows: int  # rows of the day's partitions (the day's attempts included for deliveries)
    attempt_rows: int  # of which in the day's attempts partition
    at: datetime  # the database's clock when step 1 began
    # The highest attempt id in the day's attempts partition then: attempts made since (a
    # resend) were not counted in `rows`.
    last_attempt: str
    pulls: frozenset[tuple[Any, ...]]  # live pull endpoints (events kind), to see them change


# Per kind, the tables a day's drop locks (`ACCESS EXCLUSIVE`) before anything else, in this
# order. `DETACH` takes the parent whole, and dropping a detached partition removes its
# foreign keys' triggers from the tables they refer to, which takes those whole: events and
# endpoints for a deliveries day; for an attempts day only the deliveries partition of the
# same day (its key is per partition, migration 0023, and names it), so that
# publishes and claims of other days never wait for it. Dead letters are not locked: none
# refers into the day by a key, and a new letter is made only with its delivery's update,
# which waits for the drop (or commits before its locks are granted, and is then looked at).
_LOCKS: dict[RetentionKind, tuple[str, ...]] = {
    RetentionKind.ATTEMPTS: ("attempts",),
    RetentionKind.EVENTS: ("events", "endpoints", "deliveries", "attempts"),
}


def _lock_first(connection: Connection, kind: RetentionKind, part: Partition) -> None:
    tables = list(_LOCKS[kind])
    if kind == RetentionKind.ATTEMPTS:
        # What the day's key refers to, first: deliveries before attempts, as for events.
        tables = [*partitions.referred_by_key(connection, part.name), *tables]
    connection.execute(text(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE"))


def _remove_detached(connection: Connection) -> list[str]:
    """Drop every table named as a day partition that is no longer one: what the locked
    step detached (its own transaction, so the unlinking holds nothing of anyone's), and
    what a retention process that died before this left behind. The tables dropped."""
    with connection.begin():
        found = connection.execute(
            text(
                "SELECT c.relname FROM pg_class c "
                "WHERE c.relkind = 'r' AND NOT c.relispartition "
                "AND c.relnamespace = current_schema()::regnamespace "
                "AND c.relname ~ :pattern ORDER BY c.relname"
            ),
            {"pattern": partitions.DAY_NAME_PATTERN},
        )
        names = list(found.scalars())
    removed = []
    for name in names:
        try:
            with connection.begin():
                giveway.bound_waits(connection)
                connection.execute(text(f"DROP TABLE IF EXISTS {name}"))
            removed.append(name)
        except OperationalError:
            # Someone reads it still (it is no one's partition): the next run removes it.
            log.warning("detached partition not removed yet", extra={"table": name})
    return removed


def _count(connection: Connection, name: str) -> int:
    return int(connection.execute(text(f"SELECT count(*) FROM {name}")).scalar() or 0)


def _count_by_key(connection: Connection, name: str) -> int:
    """The rows of a day partition, counted through its primary key: the index that
    DETACH's foreign-key check reads whole under the locks (step 2), which this brings into
    the cache first (cold, the check took 0.7 µs a row; cached, 0.2)."""
    before = connection.execute(text("SHOW enable_seqscan")).scalar_one()
    connection.execute(text("SET LOCAL enable_seqscan = off"))
    try:
        return _count(connection, name)
    finally:
        connection.execute(text("SELECT set_config('enable_seqscan', :v, true)"), {"v": before})


def _last_id(connection: Connection, name: str) -> str:
    return str(connection.execute(text(f"SELECT coalesce(max(id), '') FROM {name}")).scalar())


def _db_now(connection: Connection) -> datetime:
    found: datetime = connection.execute(text("SELECT now()")).scalar_one()
    return found


def _day_range(part: Partition) -> dict[str, str]:
    return {"low": part.low, "high": part.high}


# ------------------------------------------------------------------------ attempts days


def _late_attempts(part: Partition) -> str:
    """Attempts of the day to keep that step 1 may not have seen: made after the horizon (a
    resend of an old delivery), or of a delivery of the day unfinished or dead-lettered now.
    Every branch is an index lookup (the attempt's id is its creation time)."""
    return (
        f"SELECT id FROM {part.name} WHERE id >= :attempt_floor AND created_at >= :horizon "
        f"UNION SELECT id FROM {part.name} WHERE delivery_id = ANY(ARRAY("
        "SELECT id FROM deliveries WHERE id >= :low AND id < :high "
        f"AND state IN ({_UNFINISHED_SQL}) "
        "UNION SELECT delivery_id FROM dead_letters WHERE delivery_id >= :low "
        f"AND delivery_id < :high AND state = '{DeadLetterState.OPEN.value}'))"
    )


def _attempt_params(part: Partition, horizon: datetime) -> dict[str, Any]:
    return {
        "horizon": horizon,
        "attempt_floor": id_floor("att", horizon - _LATE_MARGIN),
        **_day_range(part),
    }


def _find_attempts_day(connection: Connection, part: Partition, horizon: datetime) -> Found:
    at = _db_now(connection)
    params = _attempt_params(part, horizon)
    connection.execute(
        text(
            "CREATE TEMP TABLE keep_ids AS "
            f"SELECT a.id FROM {part.name} a WHERE a.created_at >= :horizon "
            f"OR a.delivery_id IN (SELECT id FROM deliveries WHERE state IN ({_UNFINISHED_SQL})) "
            "OR a.delivery_id IN (SELECT delivery_id FROM dead_letters "
            f"WHERE state = '{DeadLetterState.OPEN.value}')"
        ),
        params,
    )
    connection.execute(text("ANALYZE keep_ids"))
    rows = _count(connection, part.name)
    return Found(rows, rows, at, _last_id(connection, part.name), frozenset())


def _drop_attempts_day(
    connection: Connection, part: Partition, horizon: datetime, found: Found
) -> tuple[Purged, int]:
    """Attempts of one delivery day: those of unfinished deliveries, and any made after the
    horizon (a resend of an old delivery), are kept."""
    params = _attempt_params(part, horizon)
    connection.execute(
        text(
            "CREATE TEMP TABLE kept_attempts ON COMMIT DROP AS "
            f"SELECT * FROM {part.name} WHERE id = ANY(ARRAY("
            f"SELECT id FROM keep_ids UNION {_late_attempts(part)}))"
        ),
        params,
    )
    # Nothing refers to attempts: the day goes whole, its kept rows with it (copied above).
    partitions.detach(connection, ATTEMPTS.table, part.name)
    kept = _put_back(connection, [("attempts", "kept_attempts")])["attempts"]
    purged = found.rows - _counted(connection, found)
    return Purged(purged, purged), kept


def _counted(connection: Connection, found: Found) -> int:
    """Kept attempts step 1 counted in the day's partition (not made since)."""
    return int(
        connection.execute(
            text("SELECT count(*) FROM kept_attempts WHERE id <= :last"),
            {"last": found.last_attempt},
        ).scalar_one()
    )


# ---------------------------------------------------------------------- deliveries days


def _pull_endpoints(connection: Connection) -> frozenset[tuple[Any, ...]]:
    """The live pull endpoints as the owed rule reads them."""
    rows = connection.execute(
        text(
            "SELECT id, partner_id, coalesce(acked_seq, 0), event_types::text FROM endpoints "
            "WHERE mode = :pull AND deleted_at IS NULL"
        ),
        {"pull": EndpointMode.PULL.value},
    )
    return frozenset(tuple(row) for row in rows)


def _owes_more(before: frozenset[tuple[Any, ...]], now: frozenset[tuple[Any, ...]]) -> bool:
    """Whether an event can be owed now that was not at step 1: a pull endpoint new (or
    restored, or its types or partner changed) or acknowledged back to an earlier position.
    An acknowledgement moving on only shrinks what is owed."""
    acked = {(pid, partner, types): seq for pid, partner, seq, types in before}
    return any(
        (pid, partner, types) not in acked or seq < acked[(pid, partner, types)]
        for pid, partner, seq, types in now
    )


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


def _event_params(connection: Connection, part: Partition, horizon: datetime) -> dict[str, Any]:
    return {
        "evt_low": id_floor("evt", part.start - _EVENT_WINDOW),
        "evt_high": id_floor("evt", part.end),
        # Where the deliveries of those events are: a delivery is written only with its
        # event, at its publish (`app.intake`), so its id is of the same moment; the margin
        # covers the clock between the two. Looking there only, the unfinished deliveries
        # of other days (today's backlog) are not read, under the locks or before them.
        "dlv_low": id_floor("dlv", part.start - _EVENT_WINDOW - _LATE_MARGIN),
        "dlv_high": id_floor("dlv", part.end + _LATE_MARGIN),
        "horizon": horizon,
        "head": head(connection),
        **_day_range(part),
    }


def _find_deliveries_day(connection: Connection, part: Partition, horizon: datetime) -> Found:
    """The deliveries of the day whose event the row-level purge would keep (see
    `purge._events`): all of the event's deliveries stay, with their attempts and letters."""
    at = _db_now(connection)
    pulls = _pull_endpoints(connection)
    params = _event_params(connection, part, horizon)
    # Materialised (and analysed) first: as a subquery under an OR, the planner may run it
    # once per delivery of the day. Only the window's events matter (a delivery whose event
    # lies outside it is kept whole, below), and each branch is an index lookup: read as one
    # OR over the window's events, it read two days of events from disk (0.45–0.8 s of a
    # 1.4 s drop at 269,000 a day). An event's `created_at` and its id come from the same
    # clock at its insert, so one made at or after the horizon has an id within
    # `_LATE_MARGIN` of it; only a live pull endpoint's owed events need the scan.
    owed = _owed_clause(connection)
    connection.execute(
        text(
            "CREATE TEMP TABLE held_events AS "
            f"SELECT event_id AS id FROM deliveries WHERE state IN ({_UNFINISHED_SQL}) "
            "AND id >= :dlv_low AND id < :dlv_high "
            "AND event_id >= :evt_low AND event_id < :evt_high "
            "UNION SELECT event_id FROM dead_letters "
            "WHERE event_id >= :evt_low AND event_id < :evt_high "
            "UNION SELECT id FROM events WHERE feed_seq IS NULL "
            "AND id >= :evt_low AND id < :evt_high "
            "UNION SELECT id FROM events WHERE feed_seq = :head "
            "AND id >= :evt_low AND id < :evt_high "
            "UNION SELECT id FROM events WHERE id >= :evt_recent AND id < :evt_high "
            "AND created_at >= :horizon"
            + (
                " UNION SELECT e.id FROM events e WHERE e.id >= :evt_low AND e.id < :evt_high "
                f"AND (FALSE{owed})"
                if owed
                else ""
            )
        ),
        {**params, "evt_recent": id_floor("evt", horizon - _LATE_MARGIN)},
    )
    connection.execute(text("ANALYZE held_events"))
    connection.execute(
        text(
            "CREATE TEMP TABLE keep_ids AS "
            f"SELECT d.id FROM {part.name} d WHERE d.event_id IN (SELECT id FROM held_events) "
            # A delivery whose event lies outside the window is left to the row-level purge.
            f"UNION ALL SELECT d.id FROM {part.name} d "
            "WHERE (d.event_id < :evt_low OR d.event_id >= :evt_high) "
            "AND NOT EXISTS (SELECT 1 FROM held_events h WHERE h.id = d.event_id)"
        ),
        params,
    )
    connection.execute(text("ANALYZE keep_ids"))
    rows = _count_by_key(connection, part.name)
    attempts_part = part.of(ATTEMPTS)
    last_attempt, attempt_rows = "", 0
    if partitions.exists(connection, attempts_part):
        attempt_rows = _count(connection, attempts_part)
        last_attempt = _last_id(connection, attempts_part)
    return Found(rows + attempt_rows, attempt_rows, at, last_attempt, pulls)


def _warm(connection: Connection, part: Partition) -> None:
    """Before a day is copied the plain way: its kept rows' pages read once, unlocked, by the
    lookups the locked step makes (index and heap pages; the whole row is asked for, so an
    index-only scan will not do), so that under the locks they are found in memory. A day
    of 269,000 deliveries on disk (the cache far smaller) with 2,962 kept held the tables
    188 ms read cold, 118 ms warmed."""
    attempts_part = part.of(ATTEMPTS)
    for name, column in ((attempts_part, "delivery_id"), (part.name, "id")):
        if partitions.exists(connection, name):
            connection.execute(
                text(
                    f"SELECT count(x.*) FROM {name} x "
                    f"WHERE x.{column} = ANY(ARRAY(SELECT id FROM keep_ids))"
                )
            )


def _warm_late(connection: Connection, part: Partition, horizon: datetime, found: Found) -> None:
    """Right before the locks: the late look (`_late_events`) run once, unlocked, so that
    the unfinished deliveries it reads are in memory when it runs again under the locks.
    Step 1 read them too, but then a copy or an archive came between (at 1 M deliveries a
    day with 1 % retrying, the late look held the tables 116 ms of a swap's 166)."""
    connection.execute(
        text(f"SELECT count(*) FROM ({_late_events(connection, found)}) AS late"),
        _late_params(connection, part, horizon, found),
    )


def _late_params(
    connection: Connection, part: Partition, horizon: datetime, found: Found
) -> dict[str, Any]:
    return {
        **_event_params(connection, part, horizon),
        "letter_floor": id_floor("dl", found.at - _LATE_MARGIN),
    }


def _late_events(connection: Connection, found: Found) -> str:
    """Events of the window held now that step 1 may not have seen held: one with a delivery
    unfinished now, a dead letter made since, not yet numbered in the feed or holding its
    head; and, when a pull endpoint came or went back, those it owes. Index lookups, but for
    the last (a scan of the window's events, only when pull endpoints changed)."""
    owed = ""
    if _owes_more(found.pulls, _pull_endpoints(connection)):
        clause = _owed_clause(connection)
        if clause:
            owed = (
                "UNION SELECT e.id FROM events e WHERE e.id >= :evt_low AND e.id < :evt_high "
                f"AND (FALSE{clause}) "
            )
    return (
        f"SELECT event_id AS id FROM deliveries WHERE state IN ({_UNFINISHED_SQL}) "
        "AND id >= :dlv_low AND id < :dlv_high "
        "AND event_id >= :evt_low AND event_id < :evt_high "
        "UNION SELECT event_id FROM dead_letters WHERE id >= :letter_floor "
        "AND event_id >= :evt_low AND event_id < :evt_high "
        "UNION SELECT id FROM events WHERE feed_seq IS NULL "
        "AND id >= :evt_low AND id < :evt_high "
        f"UNION SELECT id FROM events WHERE feed_seq = :head {owed}"
        "EXCEPT SELECT id FROM held_events"
    )


def _late_keep(
    connection: Connection, part: Partition, horizon: datetime, found: Found
) -> dict[str, Any]:
    """Under the locks: the day's deliveries whose event turned into one to keep since step 1
    (`_late_events`) added to `keep_ids`, and listed in `late_ids` (dropped at the commit).
    The statements' parameters."""
    params = _late_params(connection, part, horizon, found)
    connection.execute(
        text(f"CREATE TEMP TABLE late_events ON COMMIT DROP AS {_late_events(connection, found)}"),
        params,
    )
    for statement in (
        "CREATE TEMP TABLE late_ids ON COMMIT DROP AS "
        f"SELECT d.id FROM {part.name} d WHERE d.event_id IN (SELECT id FROM late_events)",
        "INSERT INTO keep_ids SELECT id FROM late_ids",
    ):
        connection.execute(text(statement))
    return params


def _drop_deliveries_day(
    connection: Connection, part: Partition, horizon: datetime, found: Found
) -> tuple[Purged, int]:
    """Deliveries of one day with their attempts, the kept ones (see `_find_deliveries_day`,
    and `_late_events` for what changed since) set aside with their attempts, then put back.
    Their dead letters stay where they are (no foreign key refers into the day)."""
    attempts_part = part.of(ATTEMPTS)
    has_attempts = partitions.exists(connection, attempts_part)
    attempts_default = partitions.default_name(ATTEMPTS)
    params = _late_keep(connection, part, horizon, found)
    # Every lookup below is by key, through `= ANY(ARRAY(…))`: an index probe per kept row,
    # never a scan of the day (a hash join would read all of it, under the locks).
    connection.execute(
        text(
            "CREATE TEMP TABLE kept_deliveries ON COMMIT DROP AS "
            f"SELECT * FROM {part.name} WHERE id = ANY(ARRAY(SELECT id FROM keep_ids))"
        ),
        params,
    )
    of_kept = "delivery_id = ANY(ARRAY(SELECT id FROM kept_deliveries))"
    # The day's attempts are in its own attempts partition and, set aside by an earlier
    # attempts drop, in the default one: copied from each in turn, so that those step 1
    # counted (in the day's partition, made before it) are counted on the copy.
    source, where = (attempts_part, of_kept) if has_attempts else (attempts_default, "FALSE")
    connection.execute(
        text(
            "CREATE TEMP TABLE kept_attempts ON COMMIT DROP AS "
            f"SELECT * FROM {source} WHERE {where}"
        )
    )
    moved_attempts = connection.execute(
        text("SELECT count(*) FROM kept_attempts WHERE id <= :last"), {"last": found.last_attempt}
    ).scalar_one()
    kept_aside = connection.execute(
        text(
            f"INSERT INTO kept_attempts SELECT * FROM {attempts_default} "
            f"WHERE delivery_id >= :low AND delivery_id < :high AND {of_kept}"
        ),
        params,
    ).rowcount
    moved = connection.execute(text("SELECT count(*) FROM kept_deliveries")).scalar_one()
    # What refers into the day goes first (DETACH checks that nothing does): its attempts in
    # the default partition, set aside by an earlier attempts drop (the kept ones are copied
    # above). The kept deliveries themselves go with their partition.
    purged_aside = (
        connection.execute(
            text(
                f"DELETE FROM {attempts_default} WHERE delivery_id >= :low AND delivery_id < :high"
            ),
            params,
        ).rowcount
        - kept_aside
    )
    if has_attempts:
        partitions.detach(connection, ATTEMPTS.table, attempts_part)
    partitions.detach(connection, DELIVERIES.table, part.name)
    kept = _put_back(
        connection,
        [("deliveries", "kept_deliveries"), ("attempts", "kept_attempts")],
    )
    attempts = purged_aside + found.attempt_rows - moved_attempts
    return Purged(purged_aside + found.rows - moved - moved_attempts, attempts), kept["deliveries"]


def _put_back(connection: Connection, tables: list[tuple[str, str]]) -> dict[str, int]:
    """The rows set aside inserted back through their parent tables, parents first; rows
    put back per table."""
    return {
        name: connection.execute(text(f"INSERT INTO {name} SELECT * FROM {temp}")).rowcount
        for name, temp in tables
    }


# ----------------------------------------------------------------------------- archive

# Rows per archive write while a day is archived: one gzip member each.
ARCHIVE_CHUNK = 5000
_KEEP_IDS = sql_table("keep_ids", sql_column("id"))


def _purged_rows(kind: RetentionKind, part: Partition) -> list[tuple[Table, Any]]:
    """Per table, what the day's drop will purge, as step 1 found it: every row of the day
    but those kept (for a deliveries day, also its attempts left in the default partition
    by an earlier attempts drop)."""
    attempts = archive.table_of("attempts")
    if kind == RetentionKind.ATTEMPTS:
        return [
            (
                attempts,
                (attempts.c.delivery_id >= part.low)
                & (attempts.c.delivery_id < part.high)
                & attempts.c.id.not_in(select(_KEEP_IDS.c.id)),
            )
        ]
    deliveries = archive.table_of("deliveries")
    return [
        (
            deliveries,
            (deliveries.c.id >= part.low)
            & (deliveries.c.id < part.high)
            & deliveries.c.id.not_in(select(_KEEP_IDS.c.id)),
        ),
        (
            attempts,
            (attempts.c.delivery_id >= part.low)
            & (attempts.c.delivery_id < part.high)
            & attempts.c.delivery_id.not_in(select(_KEEP_IDS.c.id)),
        ),
    ]


def _archive_day(
    connection: Connection, kind: RetentionKind, part: Partition, writer: archive.Writer
) -> None:
    """Write what the day's drop will purge to the archive, durable before the drop: in
    step 1, unlocked, in chunks. A row found to keep only under the locks is then archived
    and kept (restore skips it while it is there), never purged unarchived: what step 2
    purges beyond step 1's finding is nothing (rows made since are kept).

    Raises:
        archive.ArchiveError: the write failed; the day must not be dropped.
    """
    for source, where in _purged_rows(kind, part):
        after: str | None = None
        while True:
            stmt = select(source).where(where)
            if after is not None:
                stmt = stmt.where(source.c.id > after)
            rows = [
                dict(row)
                for row in connection.execute(
                    stmt.order_by(source.c.id).limit(ARCHIVE_CHUNK)
                ).mappings()
            ]
            if not rows:
                break
            writer.write(source.name, rows)
            after = rows[-1]["id"]


# ------------------------------------------------------------------------------ the run

FindFn = Callable[[Connection, Partition, datetime], Found]
# A day's drop under its locks: rows purged, rows kept.
DropFn = Callable[[Connection, Partition, datetime, Found], tuple[Purged, int]]
# Per kind, the table whose days it drops and how; other kinds delete rows only.
_BY_KIND: dict[RetentionKind, tuple[partitions.Spec, FindFn, DropFn]] = {
    RetentionKind.ATTEMPTS: (ATTEMPTS, _find_attempts_day, _drop_attempts_day),
    RetentionKind.EVENTS: (DELIVERIES, _find_deliveries_day, _drop_deliveries_day),
}


def _drop_day(
    runtime: Runtime,
    kind: RetentionKind,
    part: Partition,
    horizon: datetime,
    sleep: Callable[[float], None],
    writer: archive.Writer | None,
) -> tuple[Purged, int, float, float] | None:
    """One day: found unlocked (and archived), then dropped under its locks, tried again when
    they were not granted in time. Rows purged, rows kept, seconds locked, seconds removing
    the detached tables; None: not dropped now (logged), left to the next run.

    Raises:
        archive.ArchiveError: the day's rows could not be archived; it was not dropped.
    """
    _, find, drop_day = _BY_KIND[kind]
    with runtime.db.engine.connect() as connection:
        shadow: swap.Shadow | None = None
        try:
            with connection.begin():
                connection.execute(text(f"DROP TABLE IF EXISTS {_FOUND_TABLES}"))
                found = find(connection, part, horizon)
            if writer is not None:
                with connection.begin():
                    _archive_day(connection, kind, part, writer)
            if kind == RetentionKind.EVENTS and part.sort == partitions.DAY:
                with connection.begin():
                    swapping = swap.worth_it(connection, part)
                if swapping:
                    shadow = swap.prepare(connection, part, sleep)
                else:
                    swap.undo(connection, part, sleep)
            if kind == RetentionKind.EVENTS:
                with connection.begin():
                    if shadow is None:
                        _warm(connection, part)
                    _warm_late(connection, part, horizon, found)
            copy = shadow  # the locked step's own: `shadow` is cleared once it commits

            def locked() -> tuple[tuple[Purged, int] | swap.Shadow, float]:
                """The locked step: what it purged and kept (or the swapped day, counted
                after the commit), and when its locks were granted."""
                _lock_first(connection, kind, part)
                locked_at = time.perf_counter()
                # The rows put back go unchanged, with their parents, while everything
                # they refer to is locked: their checks find nothing.
                triggers.skip(connection)
                if copy is None:
                    return drop_day(connection, part, horizon, found), locked_at
                _late_keep(connection, part, horizon, found)
                swap.swap_locked(connection, copy, "late_ids")
                return copy, locked_at

            outcome, locked_at = giveway.locked(connection, locked, sleep)
            locked_s = time.perf_counter() - locked_at
            shadow = None  # committed: nothing of a swap to undo
            if isinstance(outcome, swap.Shadow):
                outcome = _swapped(connection, outcome, found)
            removing = time.perf_counter()
            _remove_detached(connection)
            return outcome[0], outcome[1], locked_s, time.perf_counter() - removing
        except archive.ArchiveError:
            raise
        except Exception:
            log.warning("partition not dropped", extra={"partition": part.name}, exc_info=True)
            return None
        finally:
            if shadow is not None:
                _give_up(connection, shadow, sleep)
            _forget_found(connection)
    return None


def _swapped(connection: Connection, shadow: swap.Shadow, found: Found) -> tuple[Purged, int]:
    """A swapped day's rows purged and deliveries kept, counted on its kept partitions after
    the commit (not under the locks)."""
    with connection.begin():
        kept, kept_attempts = swap.kept_rows(connection, shadow, found.last_attempt)
    return Purged(found.rows - kept - kept_attempts, found.attempt_rows - kept_attempts), kept


def _give_up(connection: Connection, shadow: swap.Shadow, sleep: Callable[[float], None]) -> None:
    """A swap not done: its triggers, checks and copies undone (or, if even that is refused
    now, by the next try of the day; the triggers do nothing once their log is gone)."""
    try:
        connection.rollback()
        swap.undo(connection, shadow.day, sleep)
    except Exception:
        log.warning("swap not undone", extra={"partition": shadow.day.name}, exc_info=True)


def _forget_found(connection: Connection) -> None:
    """Step 1's session tables dropped before the connection goes back to the pool (a
    connection that broke took them with it)."""
    if connection.invalidated:
        return
    try:
        connection.rollback()
        with connection.begin():
            connection.execute(text(f"DROP TABLE IF EXISTS {_FOUND_TABLES}"))
    except Exception:
        log.warning("retention's temporary tables not dropped", exc_info=True)
        connection.invalidate()


def _to_fold(connection: Connection, horizon: datetime) -> list[Partition]:
    """Kept partitions (what swapped days kept) to drop the plain way, what they still keep
    put into the default partition, oldest first: those now holding fewer rows than a day
    worth swapping, and the oldest beyond `MAX_KEPT_PARTITIONS` whatever they hold, so that
    days whose rows stay (open dead letters no one resolves) do not add a partition of
    their own each for ever. The latter hold the tables as a plain drop of that many kept
    rows does."""
    kept = [
        p
        for p in partitions.partitions(connection, DELIVERIES, partitions.KEPT)
        if p.end <= horizon
    ]
    beyond = len(kept) - MAX_KEPT_PARTITIONS
    return [
        p
        for n, p in enumerate(kept)
        if n < beyond or _count(connection, p.name) < swap.SWAP_MIN_ROWS
    ]


def expired(connection: Connection, spec: partitions.Spec, horizon: datetime) -> list[Partition]:
    """The table's day partitions whose whole day lies before the horizon, oldest first."""
    return [p for p in partitions.partitions(connection, spec) if p.end <= horizon]


def run(
    runtime: Runtime,
    kind: RetentionKind,
    horizon: datetime,
    *,
    timer: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
    writer: archive.Writer | None = None,
) -> Iterator[Dropped]:
    """Drop the kind's expired days (PostgreSQL with partitioned tables; otherwise none),
    yielding each as it is done; with `writer`, each day's purged rows are archived first.

    A day that cannot be dropped now (a lock not granted in time) is logged and left to the
    next run; the row-level purge that follows handles its finished rows meanwhile.

    Raises:
        archive.ArchiveError: a day could not be archived; it and the days after it stay.
    """
    if kind not in _BY_KIND or not runtime.db.is_postgres:
        return
    spec = _BY_KIND[kind][0]
    with runtime.db.engine.connect() as connection:
        if not partitions.is_partitioned(connection, spec.table):
            return
        days = expired(connection, spec, horizon)
        if kind == RetentionKind.EVENTS:
            days = _to_fold(connection, horizon) + days
    with runtime.db.engine.connect() as connection:
        _remove_detached(connection)
    locked_s = 0.0
    for n, part in enumerate(days):
        if n:
            sleep(max(YIELD_MIN_S, YIELD_FACTOR * locked_s))
        started = timer()
        outcome = _drop_day(runtime, kind, part, horizon, sleep, writer)
        if outcome is None:
            continue
        purged, kept, locked_s, removed_s = outcome
        elapsed_ms = (timer() - started) * 1000.0
        log.info(
            "partition dropped",
            extra={"partition": part.name, "purged": purged.rows, "kept": kept, "ms": elapsed_ms},
        )
        yield Dropped(
            kind,
            part.start,
            purged.rows,
            kept,
            elapsed_ms,
            locked_s * 1000.0,
            removed_s * 1000.0,
            purged.attempts,
        )
