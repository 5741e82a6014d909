"""The retention run: each kind's finished rows past its horizon, deleted in bounded batches.

A batch is one short transaction: read the next `size` candidate rows past the horizon in id
order (the primary key: ids are creation times), keep back those not finished, delete the
rest and what hangs off them in foreign-key order, commit. Its wall time is measured; the
next batch is sized so it stays under `KURIR_RETENTION_BATCH_MS` (on SQLite the whole
transaction holds the one writer lock, so that is the longest a publish waits for it) and
followed by a pause: as long as the batch on PostgreSQL, a hundred times as long on SQLite
(`DEFAULT_YIELD`, `KURIR_RETENTION_YIELD`), so writers get at least that share of the time.

The candidates of a batch are bounded whatever is kept back: a kept row is passed over by
the id cursor, never read again in the same run, so a table full of unfinished rows cannot
make a batch slow or the run endless.

With `KURIR_ARCHIVE_DIR` set, every row a batch deletes is first written to the archive
(`archive.capture`), inside the batch's transaction: a failed write rolls the batch back,
stops the run and is logged and reported (`Report.archive_error`). A whole day dropped on
PostgreSQL is archived first the same way (`drop.run`).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import ARRAY, ColumnElement, Delete, any_, bindparam, delete, select
from sqlalchemy.orm import Session

from app.clock import utcnow
from app.event_types import RESERVED_PREFIX
from app.feed import horizon as feed_horizon
from app.feed.sequencer import head
from app.ids import id_floor
from app.lifecycle import archive, drop, marks, policy, triggers
from app.models import (
    Attempt,
    AuditRecord,
    DeadLetter,
    DeadLetterAudit,
    Delivery,
    Endpoint,
    Event,
    EventVersion,
    InboundEvent,
    OperationalEvent,
    ReconcileRequest,
    ResendJob,
)
from app.runtime import Runtime
from app.vocabulary import DeadLetterState, EndpointMode, RetentionKind

log = logging.getLogger(__name__)

# Batch sizes, in candidate rows: the first batch of each source is small (its cost is not
# known yet); later ones grow at most twofold per batch toward what fits the time budget.
FIRST_BATCH = 50
MIN_BATCH = 10
MAX_BATCH = 5000
# Aim under the budget: the next batch may meet a colder cache than the last.
_HEADROOM = 0.8
# After a batch, a pause this many times as long as it took (`KURIR_RETENTION_YIELD`
# overrides), per backend. On SQLite a batch holds the one writer lock, and a publish that
# meets it waits for it, so retention keeps to about one part of the time in a hundred
# (the month bench: at half the time, publish p99 went from 6.6 to 82 ms). On PostgreSQL a
# batch holds nothing a publish needs: half the time.
DEFAULT_YIELD = {"sqlite": 100, "postgresql": 1}
# Ids per IN (...) list, well under every driver's parameter limit.
_CHUNK = 500


def _postgresql(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def _among(session: Session, column: Any, ids: Sequence[str]) -> ColumnElement[bool]:
    """`column` is one of `ids`. On PostgreSQL as one array parameter (`= ANY(…)`), so a
    statement's text is the same whatever the ids: compiled once by SQLAlchemy, parsed and
    prepared once by psycopg. An `IN (…)` list is rendered afresh for every batch, a
    parameter per id, which was most of retention's own CPU. (A partition key compared so
    is still pruned: PostgreSQL plans each execution with the ids it is given.)"""
    if _postgresql(session):
        return column == any_(bindparam(None, list(ids), type_=ARRAY(column.type)))
    return column.in_(ids)


def _delete(session: Session, statement: Delete) -> None:
    """A bulk delete, without the ORM matching it against objects in the session (there
    are none: a batch loads no objects), which costs a pass over its criteria each time."""
    session.execute(statement, execution_options={"synchronize_session": False})


@dataclass(frozen=True)
class Pace:
    """How hard a run pushes: the time budget of a batch, and the pause after one as a
    multiple of its time."""

    budget_ms: float
    yield_factor: int


@dataclass(frozen=True)
class Batch:
    kind: RetentionKind
    source: str
    examined: int
    purged: int
    elapsed_ms: float
    # A dropped day: of its time, how long it held the tables, and how long removing its
    # detached tables' files took after (see `drop`).
    locked_ms: float | None = None
    removed_ms: float | None = None


@dataclass
class Report:
    """What a run did: rows purged per kind, and every batch (for the bench and the tests)."""

    purged: dict[RetentionKind, int] = field(default_factory=dict)
    batches: list[Batch] = field(default_factory=list)
    # Why the run stopped early: the archive could not be written (that batch was kept).
    archive_error: str | None = None

    @property
    def total(self) -> int:
        return sum(self.purged.values())


@dataclass(frozen=True)
class Step:
    examined: int
    last_id: str | None
    purged: int


StepFn = Callable[[Session, datetime, str | None, int, datetime], Step]


def next_size(size: int, examined: int, elapsed_ms: float, budget_ms: float) -> int:
    """The next batch's size: what the last one's rate fits in the budget, with headroom,
    never more than twice the last."""
    if elapsed_ms <= 0:
        fitted = size * 2
    else:
        fitted = int(max(examined, 1) * budget_ms * _HEADROOM / elapsed_ms)
    return max(MIN_BATCH, min(MAX_BATCH, size * 2, fitted))


def _chunks(ids: Sequence[str]) -> list[list[str]]:
    return [list(ids[i : i + _CHUNK]) for i in range(0, len(ids), _CHUNK)]


def _candidates(
    session: Session,
    model: Any,
    columns: Sequence[Any],
    prefix: str,
    horizon: datetime,
    after: str | None,
    size: int,
) -> list[Any]:
    stmt = select(model.id, *columns).where(model.id < id_floor(prefix, horizon))
    if after is not None:
        stmt = stmt.where(model.id > after)
    return list(session.execute(stmt.order_by(model.id).limit(size)).all())


def _step(rows: list[Any], purged: int) -> Step:
    return Step(len(rows), rows[-1].id if rows else None, purged)


# ---------------------------------------------------------------------------- dead letters


def _dead_letters(
    session: Session, horizon: datetime, after: str | None, size: int, _now: datetime
) -> Step:
    rows = _candidates(
        session, DeadLetter, (DeadLetter.state, DeadLetter.resolved_at), "dl", horizon, after, size
    )
    ids = [
        r.id
        for r in rows
        if r.state in policy.CLOSED_LETTER_STATES
        and r.resolved_at is not None
        and r.resolved_at < horizon
    ]
    for chunk in _chunks(ids):
        _delete(
            session,
            delete(DeadLetterAudit).where(_among(session, DeadLetterAudit.dead_letter_id, chunk)),
        )
        _delete(session, delete(DeadLetter).where(_among(session, DeadLetter.id, chunk)))
    return _step(rows, len(ids))


def _resend_jobs(
    session: Session, horizon: datetime, after: str | None, size: int, _now: datetime
) -> Step:
    rows = _candidates(
        session, ResendJob, (ResendJob.state, ResendJob.finished_at), "bop", horizon, after, size
    )
    ids = [
        r.id
        for r in rows
        if r.state in policy.FINISHED_RESEND_JOB_STATES
        and r.finished_at is not None
        and r.finished_at < horizon
    ]
    for chunk in _chunks(ids):
        _delete(session, delete(ResendJob).where(_among(session, ResendJob.id, chunk)))
    return _step(rows, len(ids))


# ---------------------------------------------------------------------------- attempts


def _finished_deliveries(session: Session, delivery_ids: list[str]) -> set[str]:
    """Of these deliveries, those finished: succeeded, or dead with no open dead letter."""
    finished: set[str] = set()
    for chunk in _chunks(delivery_ids):
        # The state is judged here, not in SQL: with `state IN (…)` beside the id list,
        # SQLite (no statistics) walked its state index over every finished delivery,
        # batch after batch, instead of looking the ids up.
        finished |= {
            row.id
            for row in session.execute(
                select(Delivery.id, Delivery.state).where(_among(session, Delivery.id, chunk))
            )
            if row.state in policy.FINISHED_DELIVERY_STATES
        }
        finished -= set(
            session.scalars(
                select(DeadLetter.delivery_id).where(
                    _among(session, DeadLetter.delivery_id, chunk),
                    DeadLetter.state == DeadLetterState.OPEN,
                )
            )
        )
    return finished


def _attempts(
    session: Session, horizon: datetime, after: str | None, size: int, _now: datetime
) -> Step:
    rows = _candidates(
        session, Attempt, (Attempt.delivery_id, Attempt.created_at), "att", horizon, after, size
    )
    old = [r for r in rows if r.created_at < horizon]
    finished = _finished_deliveries(session, sorted({r.delivery_id for r in old}))
    ids = [r.id for r in old if r.delivery_id in finished]
    for chunk in _chunks(ids):
        _delete(session, delete(Attempt).where(_among(session, Attempt.id, chunk)))
    return _step(rows, len(ids))


# ---------------------------------------------------------------------------- events


@dataclass(frozen=True)
class _Pull:
    partner_id: str
    acked_seq: int
    types: frozenset[str] | None


def _pulls(session: Session) -> dict[str, list[_Pull]]:
    """Live pull endpoints by partner: the events they have not acknowledged are kept."""
    found: dict[str, list[_Pull]] = defaultdict(list)
    for row in session.execute(
        select(Endpoint.partner_id, Endpoint.acked_seq, Endpoint.event_types).where(
            Endpoint.mode == EndpointMode.PULL, Endpoint.deleted_at.is_(None)
        )
    ):
        types = None if row.event_types is None else frozenset(row.event_types)
        found[row.partner_id].append(_Pull(row.partner_id, int(row.acked_seq or 0), types))
    return found


def _owed(row: Any, pulls: dict[str, list[_Pull]]) -> bool:
    """Whether a live pull endpoint still has to read this event."""
    if row.type.startswith(RESERVED_PREFIX):
        return False  # never in a feed
    return any(
        (p.types is None or row.type in p.types) and row.feed_seq > p.acked_seq
        for p in pulls.get(row.partner_id, ())
    )


def _events(
    session: Session, horizon: datetime, after: str | None, size: int, now: datetime
) -> Step:
    rows = _candidates(
        session,
        Event,
        (Event.partner_id, Event.type, Event.feed_seq, Event.created_at),
        "evt",
        horizon,
        after,
        size,
    )
    # An event without a feed position yet is kept: a reader may still be owed it. So is the
    # event at the feed's head: the sequencer numbers on from the highest position stored,
    # and positions must never be given twice.
    top = head(session.connection())
    old = [
        r
        for r in rows
        if r.created_at < horizon and r.feed_seq is not None and int(r.feed_seq) != top
    ]
    ids = [r.id for r in old]
    held: set[str] = set()
    # Each event's deliveries, as the lock below found them: all it will ever have, since
    # a new one would wait for the event's lock and then find it gone.
    deliveries_of: dict[str, list[str]] = defaultdict(list)
    postgresql = _postgresql(session)
    for chunk in _chunks(ids):
        # Locked (PostgreSQL; SQLite's writer lock is already ours), the events first: a
        # delivery, letter or version made for one of them meanwhile (its foreign-key check
        # locks the event) waits for this batch, and fails once the event is gone; one made
        # before is seen below and keeps it. And a delivery retried or parked meanwhile
        # waits for this batch or keeps its event.
        if postgresql:
            session.execute(
                select(Event.id).where(_among(session, Event.id, chunk)).with_for_update()
            )
        for delivery_id, event_id, state in session.execute(
            select(Delivery.id, Delivery.event_id, Delivery.state)
            .where(_among(session, Delivery.event_id, chunk))
            .with_for_update()
        ):
            deliveries_of[event_id].append(delivery_id)
            if state not in policy.FINISHED_DELIVERY_STATES:
                held.add(event_id)
        # Closed letters past their own horizon were purged first; any letter left (open,
        # or closed and kept longer) keeps its event, delivery and attempts.
        held |= set(
            session.scalars(
                select(DeadLetter.event_id).where(_among(session, DeadLetter.event_id, chunk))
            )
        )
    pulls = _pulls(session)
    gone = [r for r in old if r.id not in held and not _owed(r, pulls)]
    gone_ids = [r.id for r in gone]
    # Every row referring to these events is deleted here, children first, with the events
    # and their deliveries locked above: the cascades and checks the deletes would fire can
    # find nothing. Skipped where the role may (`triggers`), they are most of the batch's
    # cost on PostgreSQL: a deleted event or delivery probes its children's table on every
    # daily partition.
    skipped = bool(gone_ids) and postgresql and triggers.skip(session.connection())
    # Deliveries and their attempts by the deliveries' ids, which name their day: a lookup
    # in one partition each, where one by event looked in every day's. And none at all for
    # the events whose deliveries went with their day's partition (the usual case).
    gone_deliveries = [d for event_id in gone_ids for d in deliveries_of.get(event_id, ())]
    for chunk in _chunks(gone_deliveries):
        _delete(session, delete(Attempt).where(_among(session, Attempt.delivery_id, chunk)))
        _delete(session, delete(Delivery).where(_among(session, Delivery.id, chunk)))
    for chunk in _chunks(gone_ids):
        _delete(session, delete(EventVersion).where(_among(session, EventVersion.event_id, chunk)))
        _delete(session, delete(Event).where(_among(session, Event.id, chunk)))
    if skipped:
        triggers.restore(session.connection())
    highest: dict[str, dict[str, int]] = defaultdict(dict)
    for r in gone:
        if not r.type.startswith(RESERVED_PREFIX):
            seen = highest[r.partner_id]
            seen[r.type] = max(seen.get(r.type, 0), int(r.feed_seq))
    for partner_id, by_type in highest.items():
        feed_horizon.record(session.connection(), partner_id, by_type, horizon=horizon, now=now)
    return _step(rows, len(gone_ids))


# ---------------------------------------------------------------------------- inbound


def _inbound(
    session: Session, horizon: datetime, after: str | None, size: int, _now: datetime
) -> Step:
    rows = _candidates(
        session,
        InboundEvent,
        (InboundEvent.status, InboundEvent.updated_at),
        "ine",
        horizon,
        after,
        size,
    )
    ids = [
        r.id
        for r in rows
        if r.status in policy.FINISHED_INBOUND_STATUSES and r.updated_at < horizon
    ]
    for chunk in _chunks(ids):
        _delete(session, delete(InboundEvent).where(_among(session, InboundEvent.id, chunk)))
    return _step(rows, len(ids))


def _reconcile_requests(
    session: Session, horizon: datetime, after: str | None, size: int, _now: datetime
) -> Step:
    rows = _candidates(
        session,
        ReconcileRequest,
        (ReconcileRequest.state, ReconcileRequest.updated_at),
        "rcn",
        horizon,
        after,
        size,
    )
    ids = [
        r.id for r in rows if r.state in policy.FINISHED_RECONCILE_STATES and r.updated_at < horizon
    ]
    for chunk in _chunks(ids):
        _delete(
            session, delete(ReconcileRequest).where(_among(session, ReconcileRequest.id, chunk))
        )
    return _step(rows, len(ids))


# ---------------------------------------------------------------------------- audit


def _audit_records(
    session: Session, horizon: datetime, after: str | None, size: int, _now: datetime
) -> Step:
    rows = _candidates(session, AuditRecord, (AuditRecord.created_at,), "aud", horizon, after, size)
    ids = [r.id for r in rows if r.created_at < horizon]
    for chunk in _chunks(ids):
        _delete(session, delete(AuditRecord).where(_among(session, AuditRecord.id, chunk)))
    return _step(rows, len(ids))


def _operational_events(
    session: Session, horizon: datetime, after: str | None, size: int, _now: datetime
) -> Step:
    rows = _candidates(
        session, OperationalEvent, (OperationalEvent.created_at,), "ope", horizon, after, size
    )
    ids = [r.id for r in rows if r.created_at < horizon]
    for chunk in _chunks(ids):
        _delete(
            session, delete(OperationalEvent).where(_among(session, OperationalEvent.id, chunk))
        )
    return _step(rows, len(ids))


# Every source of history, in the order a run purges them (kinds as in RetentionKind).
SOURCES: tuple[tuple[RetentionKind, str, StepFn], ...] = (
    (RetentionKind.DEAD_LETTERS, "dead_letters", _dead_letters),
    (RetentionKind.DEAD_LETTERS, "bulk_operations", _resend_jobs),
    (RetentionKind.ATTEMPTS, "attempts", _attempts),
    (RetentionKind.EVENTS, "events", _events),
    (RetentionKind.INBOUND, "inbound_events", _inbound),
    (RetentionKind.INBOUND, "reconcile_requests", _reconcile_requests),
    (RetentionKind.AUDIT, "audit_records", _audit_records),
    (RetentionKind.AUDIT, "operational_events", _operational_events),
)


def run(
    runtime: Runtime,
    *,
    now: datetime | None = None,
    budget_ms: float | None = None,
    timer: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
    kinds: Sequence[RetentionKind] | None = None,
) -> Report:
    """Purge every kind's finished history past its horizon (the scheduler's job).

    `timer` and `sleep` are injectable so the batch sizing is tested without waiting.
    """
    now = now or utcnow()
    pace = Pace(
        float(budget_ms if budget_ms is not None else runtime.settings.retention_batch_ms),
        runtime.settings.retention_yield or DEFAULT_YIELD[runtime.db.engine.dialect.name],
    )
    horizons = policy.horizons(runtime.settings, now)
    archive_dir = runtime.settings.archive_dir
    writer = archive.Writer(archive_dir) if archive_dir is not None else None
    report = Report()
    selected = [kind for kind in RetentionKind if kinds is None or kind in kinds]
    dropped: dict[RetentionKind, int] | None = None
    for kind in selected:
        if kind in DROP_ORDER and dropped is None:
            dropped = _drop_partitions(runtime, selected, horizons, timer, sleep, report, writer)
        purged = (dropped or {}).get(kind, 0)
        for source_kind, source, step in SOURCES:
            if source_kind != kind or report.archive_error:
                continue
            horizon = horizons[kind]
            purged += _drain(
                runtime, kind, source, step, horizon, now, pace, timer, sleep, report, writer
            )
        report.purged[kind] = purged
        with runtime.db.begin() as session:
            marks.record(session, kind, purged, horizon=horizons[kind], now=now)
        if purged:
            log.info("retention purged rows", extra={"kind": kind.value, "count": purged})
        if report.archive_error:
            break
    return report


# The kinds whose expired days are dropped whole on PostgreSQL, in the order they are: a
# deliveries day (events) takes its attempts day with it, so a day past both horizons is
# found, locked and dropped once, its kept attempts moved once, instead of twice.
DROP_ORDER = (RetentionKind.EVENTS, RetentionKind.ATTEMPTS)


def _drop_partitions(
    runtime: Runtime,
    selected: Sequence[RetentionKind],
    horizons: policy.Horizons,
    timer: Callable[[], float],
    sleep: Callable[[float], None],
    report: Report,
    writer: archive.Writer | None,
) -> dict[RetentionKind, int]:
    """PostgreSQL: the whole expired days of the selected kinds dropped (`app.lifecycle.drop`,
    in `DROP_ORDER`) before any of their row batches, so the batches find only the rows that
    were kept back or not yet a whole day old (and never walk a day about to go whole). Run
    after the closed dead letters' batches, which free the events they held. With an
    archive, each day's purged rows are written to it first; a day that cannot be written
    stops the run, as a batch does. Rows purged per kind (attempts, whichever day they went
    with; events are counted by their row batches)."""
    counted: dict[RetentionKind, int] = {}
    for kind in DROP_ORDER:
        if kind not in selected or report.archive_error:
            continue
        days = drop.run(runtime, kind, horizons[kind], timer=timer, sleep=sleep, writer=writer)
        try:
            for day in days:
                source = f"drop:{day.day:%Y-%m-%d}"
                report.batches.append(
                    Batch(
                        kind,
                        source,
                        day.purged + day.kept,
                        day.purged,
                        day.elapsed_ms,
                        day.locked_ms,
                        day.removed_ms,
                    )
                )
                if RetentionKind.ATTEMPTS in selected:
                    counted[RetentionKind.ATTEMPTS] = (
                        counted.get(RetentionKind.ATTEMPTS, 0) + day.attempts
                    )
        except archive.ArchiveError as exc:
            report.archive_error = f"drop: {exc}"
            log.error(
                "retention stopped: the archive could not be written, the day was kept",
                extra={"kind": kind.value, "error": str(exc)},
            )
    return counted


def _drain(
    runtime: Runtime,
    kind: RetentionKind,
    source: str,
    step: StepFn,
    horizon: datetime,
    now: datetime,
    pace: Pace,
    timer: Callable[[], float],
    sleep: Callable[[float], None],
    report: Report,
    writer: archive.Writer | None = None,
) -> int:
    """One source, batch after batch, until no candidate is left (or the archive fails)."""
    size, after, purged = FIRST_BATCH, None, 0
    while True:
        started = timer()
        try:
            with runtime.db.begin() as session, _archived(session, writer):
                done = step(session, horizon, after, size, now)
        except archive.ArchiveError as exc:
            report.archive_error = f"{source}: {exc}"
            log.error(
                "retention stopped: the archive could not be written, the batch was kept",
                extra={"kind": kind.value, "source": source, "error": str(exc)},
            )
            return purged
        elapsed_ms = (timer() - started) * 1000.0
        report.batches.append(Batch(kind, source, done.examined, done.purged, elapsed_ms))
        purged += done.purged
        if done.examined < size or done.last_id is None:
            return purged
        after = done.last_id
        size = next_size(size, done.examined, elapsed_ms, pace.budget_ms)
        # `pace.yield_factor` times as long as the batch held the writer: writers get at
        # least that many parts of the time in one more.
        sleep(max(elapsed_ms, 1.0) * pace.yield_factor / 1000.0)


def _archived(session: Session, writer: archive.Writer | None) -> AbstractContextManager[None]:
    """The batch's deletes archived first, when an archive is configured."""
    return nullcontext() if writer is None else archive.capture(session, writer)
