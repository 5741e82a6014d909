"""The recorder: one writer thread stores what the lanes did, many attempts per transaction.

For a batch of up to `FLUSH_MAX_ITEMS` outcomes and releases, gathered for at most
`GROUP_COMMIT_S` (`FLUSH_MAX_DELAY_S` when an ordered delivery's successor waits for the
write), one transaction writes

- every attempt row;
- endpoint health: 410 Gone disables at once, failures add to the endpoint's counters (which
  may disable it), successes move its "last success" (at most once a second per endpoint);
- each delivery's new state: `succeeded`; `retrying` at its next time (a retry due within
  `LOCAL_TIMER_MAX_S` is held by a local timer); or parked as a dead letter when its retries
  are exhausted or its endpoint is disabled;
- releases: claimed deliveries handed back unsent, with a hold or none.

On PostgreSQL each of these lists is one statement however long it is (`rowsets`); on SQLite
one statement per row.

Every state change is fenced on the lease the delivery was claimed with, so a worker that lost
its lease can still add its attempt record but never overwrite the new owner's state. A batch
that fails is retried; when it keeps failing it is written one record at a time, so one bad
record cannot keep the others from being written.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from queue import Empty, SimpleQueue
from typing import Any

from sqlalchemy import bindparam, case, update
from sqlalchemy.orm import Session

from app.db import Database
from app.db_direct import Held
from app.ids import new_id
from app.models import DELIVERING, PENDING, RETRYING, SUCCEEDED, Attempt, Delivery
from app.vocabulary import DeadLetterReason, EndpointState
from sender import health
from sender.deliver import AttemptResult
from sender.engine import rowsets
from sender.engine.claim import HOLD_GRACE_S
from sender.engine.ledger import Ledger
from sender.engine.sql import insert_for_dialect, table, transient
from sender.engine.work import Outcome, Release, Unsendable, Work
from sender.park import park
from sender.policy import RetryPolicy, decide, parse_retry_after

log = logging.getLogger(__name__)

# At most this many records per transaction, gathered for at most FLUSH_MAX_DELAY_S while
# something waits on the write (an ordered delivery's successor, a stopping engine), else for
# GROUP_COMMIT_S: at a trickle, one commit then carries the outcomes of several deliveries
# instead of one (the receipt is not delayed, only its record).
FLUSH_MAX_ITEMS = 500
FLUSH_MAX_DELAY_S = 0.01
GROUP_COMMIT_S = 0.05
# Retries due within this many seconds wait on the worker's own timer (precise to ~50 ms);
# later ones are left to the sweeper, which enqueues them shortly before they are due.
LOCAL_TIMER_MAX_S = 600.0
# An endpoint that only succeeds has its "last success" written at most this often.
SUCCESS_WRITE_S = 1.0
# Endpoints whose last success write is remembered; past this many, the map is emptied (the
# cost: one extra "last success" write per endpoint, once).
SUCCESS_WRITTEN_MAX = 50_000
# The writer gives its connection back to the pool after this long with nothing to write.
WRITER_REST_S = 1.0

Timed = list[tuple[str, datetime]]


def _attempts_insert(dialect: str, overwrite: bool) -> Any:
    """The attempt INSERT (ON CONFLICT on (delivery, n)), built once per dialect."""
    stmt = insert_for_dialect(dialect)(table(Attempt))
    if overwrite:
        excluded = stmt.excluded
        return stmt.on_conflict_do_update(
            index_elements=["delivery_id", "n"],
            set_={
                c: excluded[c]
                for c in (
                    "started_at",
                    "duration_ms",
                    "url",
                    "request_headers",
                    "response_headers",
                    "response_status",
                    "response_body",
                    "error",
                )
            },
        )
    return stmt.on_conflict_do_nothing(index_elements=["delivery_id", "n"])


def _fence() -> tuple[Any, ...]:
    """A state change applies only to a delivery still `delivering` on the lease it was
    claimed with."""
    deliveries = table(Delivery)
    return (
        deliveries.c.id == bindparam("b_id"),
        deliveries.c.state == DELIVERING,
        deliveries.c.lease_expires_at == bindparam("b_lease"),
    )


def _succeeded_update() -> Any:
    deliveries = table(Delivery)
    return (
        update(deliveries)
        .where(*_fence())
        .values(
            state=SUCCEEDED,
            attempt_count=bindparam("b_n"),
            run_attempts=bindparam("b_run_n"),
            last_status_code=bindparam("b_status"),
            last_error=None,
            succeeded_at=bindparam("b_at"),
            next_attempt_at=None,
            lease_expires_at=None,
            updated_at=bindparam("b_now"),
        )
    )


def _retrying_update() -> Any:
    deliveries = table(Delivery)
    return (
        update(deliveries)
        .where(*_fence())
        .values(
            state=RETRYING,
            attempt_count=bindparam("b_n"),
            run_attempts=bindparam("b_run_n"),
            last_status_code=bindparam("b_status"),
            last_error=bindparam("b_error"),
            next_attempt_at=bindparam("b_next"),
            lease_expires_at=bindparam("b_hold"),
            updated_at=bindparam("b_now"),
        )
    )


def _release_update() -> Any:
    deliveries = table(Delivery)
    return (
        update(deliveries)
        .where(*_fence())
        .values(
            state=case((deliveries.c.run_attempts > 0, RETRYING), else_=PENDING),
            lease_expires_at=bindparam("b_hold"),
        )
    )


# Statements written for every batch, built once: SQLAlchemy then finds each compiled form in
# its cache without generating a cache key per execution (the key is memoized on the object).
_STATEMENTS: dict[tuple[str, str], Any] = {}


def statement(session: Session, kind: str) -> Any:
    """One of the recorder's statements for the session's dialect, built on first use."""
    dialect = session.get_bind().dialect.name
    stmt = _STATEMENTS.get((dialect, kind))
    if stmt is None:
        if kind == "attempts":
            stmt = _attempts_insert(dialect, overwrite=True)
        elif kind == "attempts_keep":
            stmt = _attempts_insert(dialect, overwrite=False)
        else:
            stmt = {
                "succeeded": _succeeded_update,
                "retrying": _retrying_update,
                "release": _release_update,
            }[kind]()
        _STATEMENTS[(dialect, kind)] = stmt
    return stmt


def record_attempts(
    session: Session, rows: list[dict[str, Any]], *, overwrite: bool = True
) -> None:
    """Insert attempt rows in one statement; an existing (delivery, n) is replaced or kept.

    Replacing matters when a worker that lost its lease reports the attempt the sweeper had
    recorded as `worker_lost`: the real outcome wins. Executed on the session's connection:
    a Core statement, none of the ORM's per-execution work.
    """
    if not rows:
        return
    write(session, "attempts" if overwrite else "attempts_keep", rows)


def write(session: Session, kind: str, rows: list[dict[str, Any]]) -> None:
    """Write a batch with one of the recorder's statements: on PostgreSQL the whole batch as
    one statement (`rowsets`), elsewhere one row at a time (an executemany)."""
    connection = session.connection()
    if connection.dialect.name == "postgresql":
        rowsets.write(connection, kind, rows)
    else:
        connection.execute(statement(session, kind), rows)


def _waited_on(item: Outcome | Release | None) -> bool:
    """Something waits for this record to be written: an ordered delivery's successor is
    claimed only after its predecessor's outcome is committed."""
    return isinstance(item, Outcome) and item.work.sequence is not None


def _attempt_rows(outcomes: list[Outcome], now: datetime) -> list[dict[str, Any]]:
    """The attempt rows of a batch of outcomes."""
    return [
        {
            "id": new_id("att"),
            "delivery_id": o.work.delivery_id,
            "n": o.work.n,
            "started_at": o.result.started_at,
            "duration_ms": o.result.duration_ms,
            "url": o.work.target.url,
            "request_headers": o.result.request_headers,
            "response_status": o.result.status,
            "response_body": o.result.body or None,
            "response_headers": o.result.response_headers,
            "error": o.result.error,
            "created_at": now,
        }
        for o in outcomes
    ]


def _succeeded_row(o: Outcome, now: datetime) -> dict[str, Any]:
    """A success's new state, fenced on the lease its delivery was claimed with."""
    w = o.work
    return {
        "b_id": w.delivery_id,
        "b_lease": w.lease,
        "b_n": w.n,
        "b_run_n": w.run_n,
        "b_status": o.result.status,
        "b_at": o.finished_at,
        "b_now": now,
    }


def _failing_reason(h: health.Health) -> str:
    return (
        f"failing: {h.consecutive_failures} consecutive failed attempts, no success "
        f"since {(h.last_success_at or h.first_failure_at)}"
    )


class Recorder:
    """The writer thread's queue and its batched transactions."""

    def __init__(
        self,
        db: Callable[[], Database],
        ledger: Ledger,
        *,
        policy: RetryPolicy,
        thresholds: health.Thresholds,
        rng: random.Random,
        clock: Callable[[], datetime],
        stopping: threading.Event,
        on_timers: Callable[[Timed, datetime], None],
        on_flushed: Callable[[list[Outcome | Release]], None] | None = None,
    ) -> None:
        self.db = db
        self.ledger = ledger
        self.policy = policy
        self.thresholds = thresholds
        self.rng = rng
        self.clock = clock
        self.stopping = stopping
        self.on_timers = on_timers
        # Told of every committed batch (ordered delivery wakes the next of a key).
        self.on_flushed = on_flushed
        self._writes: SimpleQueue[Outcome | Release | None] = SimpleQueue()
        self._success_written: dict[str, float] = {}
        # Set when a queued record is waited on: the batch gathering now is written sooner.
        self._hurry = threading.Event()
        # PostgreSQL: the connection the everyday batch is written on, kept while records
        # flow, and given back before a transaction (never two of the process's budget).
        self._connection = Held()

    def put(self, item: Outcome | Release) -> None:
        """Queue a record, counting it as unflushed."""
        with self.ledger.lock:
            self.ledger.unflushed += 1
        self.put_counted(item)

    def put_counted(self, item: Outcome | Release) -> None:
        """Queue a record the caller already counted as unflushed (under the same lock as
        the count it moved from, so no reader sees the delivery nowhere)."""
        self._writes.put(item)
        if _waited_on(item):
            self._hurry.set()

    def unsendable(self, failed: list[tuple[Work, Unsendable]]) -> None:
        """Record work that cannot be sent at all as failed attempts (no request was made)."""
        reported: set[tuple[str, str]] = set()
        for work, why in failed:
            key = (work.target.endpoint_id, why.error)
            if key not in reported:
                reported.add(key)
                log.warning(
                    "deliveries cannot be sent: %s (%s)",
                    why.error,
                    why.detail,
                    extra={"endpoint_id": work.target.endpoint_id, "delivery_id": work.delivery_id},
                )
            started = self.clock()
            self.put(
                Outcome(
                    work,
                    AttemptResult(started, 0, None, b"", why.error, why.detail, {}, None),
                    started,
                )
            )
        self.ledger.count(unsendable=len(failed))

    def close(self) -> None:
        """Write what is queued, then end the writer thread."""
        self._writes.put(None)
        self._hurry.set()

    def run(self) -> None:
        """The writer thread."""
        closing = False
        try:
            while not closing:
                closing = self._write_next()
        finally:
            self._connection.release()

    def _write_next(self) -> bool:
        """Gather and write one batch; True once the recorder is closed."""
        closing = False
        try:
            first = self._writes.get(timeout=WRITER_REST_S)
        except Empty:  # nothing to write for a while: the connection goes back to the pool
            self._connection.release()
            first = self._writes.get()
        if first is None:
            return True
        batch: list[Outcome | Release] = [first]
        # Let the batch gather, then take it whole: a blocking get per record would wake
        # this thread once per attempt (a thread handoff each); this wakes it once per
        # batch, and commits once per batch.
        hurried = _waited_on(first) or self.stopping.is_set()
        if hurried or self._hurry.wait(GROUP_COMMIT_S):
            self.stopping.wait(FLUSH_MAX_DELAY_S)
        # Cleared before the batch is taken: a record waited on that comes later hurries
        # the next batch.
        self._hurry.clear()
        while len(batch) < FLUSH_MAX_ITEMS:
            try:
                item = self._writes.get_nowait()
            except Empty:
                break
            if item is None:
                closing = True
                break
            batch.append(item)
        self._flush_with_retry(batch)
        return closing

    def _flush_with_retry(self, batch: list[Outcome | Release]) -> None:
        delay = 0.05
        failures = 0
        flushed = False
        while True:
            try:
                timers = self.flush(batch)
                flushed = True
                break
            except Exception as exc:
                failures += 1
                if transient(exc) and not self.stopping.is_set() or failures < 3:
                    log.warning(
                        "could not record %d delivery results, retrying: %s", len(batch), exc
                    )
                    time.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                if len(batch) > 1:
                    # A bad record must not keep the others from being written.
                    for item in batch:
                        self._flush_with_retry([item])
                    return
                log.error(
                    "delivery result dropped; its lease will expire and the sweeper will retry it",
                    exc_info=True,
                    extra={"delivery_id": batch[0].work.delivery_id},
                )
                timers = []
                break
        self.on_timers(timers, self.clock())
        if flushed and self.on_flushed is not None:
            self.on_flushed(batch)
        with self.ledger.changed:
            self.ledger.unflushed -= len(batch)
            self.ledger.counters["flushes"] += 1
            self.ledger.counters["attempts"] += sum(isinstance(b, Outcome) for b in batch)
            self.ledger.changed.notify_all()

    def flush(self, batch: list[Outcome | Release]) -> Timed:
        """Record a batch of outcomes and releases in one transaction; returns local timers."""
        outcomes = [b for b in batch if isinstance(b, Outcome)]
        releases = [b for b in batch if isinstance(b, Release)]
        now = self.clock()
        timers: Timed = []
        db = self.db()
        if outcomes and not releases and db.is_postgres and self._only_successes(outcomes):
            # The everyday batch: attempts and `succeeded`, one statement in autocommit.
            rowsets.write_successes(
                db,
                _attempt_rows(outcomes, now),
                [_succeeded_row(o, now) for o in outcomes],
                self._connection,
            )
            return timers
        self._connection.release()
        with db.begin() as session:
            if outcomes:
                timers += self._record_outcomes(session, outcomes, now)
            if releases:
                timers += self._record_releases(session, releases)
        return timers

    def _only_successes(self, outcomes: list[Outcome]) -> bool:
        """Every outcome a success, and no endpoint's "last success" due to be written: then
        nothing but the attempts and the deliveries' new state is written (no health to judge,
        no row of `endpoints` to lock)."""
        if not all(o.result.ok for o in outcomes):
            return False
        mono = time.monotonic()
        return all(
            mono - self._success_written.get(o.work.target.endpoint_id, -1e9) < SUCCESS_WRITE_S
            for o in outcomes
        )

    def _record_outcomes(self, session: Session, outcomes: list[Outcome], now: datetime) -> Timed:
        record_attempts(session, _attempt_rows(outcomes, now))
        states = self._record_health(session, outcomes, now)

        succeeded: list[dict[str, Any]] = []
        retrying: list[dict[str, Any]] = []
        to_park: list[tuple[Outcome, DeadLetterReason]] = []
        timers: Timed = []
        for o in outcomes:
            w, r = o.work, o.result
            if r.ok:
                succeeded.append(_succeeded_row(o, now))
                continue
            if states[w.target.endpoint_id] != EndpointState.ENABLED:
                to_park.append((o, DeadLetterReason.ENDPOINT_DISABLED))
                continue
            decision = decide(
                r.status,
                r.error,
                w.run_n,
                parse_retry_after(r.retry_after, now),
                self.policy,
                self.rng,
                now,
            )
            if decision.kind == "dead" or decision.next_attempt_at is None:
                to_park.append((o, DeadLetterReason.RETRIES_EXHAUSTED))
                continue
            due = decision.next_attempt_at
            local = (due - now).total_seconds() <= LOCAL_TIMER_MAX_S
            retrying.append(
                {
                    "b_id": w.delivery_id,
                    "b_lease": w.lease,
                    "b_n": w.n,
                    "b_run_n": w.run_n,
                    "b_status": r.status,
                    "b_error": r.error,
                    "b_next": due,
                    "b_hold": due + timedelta(seconds=HOLD_GRACE_S) if local else None,
                    "b_now": now,
                }
            )
            if local:
                timers.append((w.delivery_id, due))

        if succeeded:
            write(session, "succeeded", succeeded)
        if retrying:
            write(session, "retrying", retrying)
        for o, reason in to_park:
            self._park_outcome(session, o, reason)
        return timers

    def _record_health(
        self, session: Session, outcomes: list[Outcome], now: datetime
    ) -> dict[str, str]:
        """Move each endpoint's health; returns its state (enabled or disabled) after that."""
        by_endpoint: dict[str, list[Outcome]] = {}
        for o in outcomes:
            by_endpoint.setdefault(o.work.target.endpoint_id, []).append(o)
        states: dict[str, str] = {}
        successes: list[tuple[str, datetime]] = []
        mono = time.monotonic()
        # 410 Gone disables at once; then the counters, which may disable too. Sorted, so
        # concurrent writers lock endpoint rows in the same order.
        for endpoint_id in sorted(by_endpoint):
            items = by_endpoint[endpoint_id]
            tally = health.tally((o.finished_at, o.result.ok) for o in items)
            if tally.failures == 0 and tally.last_success_at is not None:
                # Nothing to judge, only "last success" to move, and at most once a second.
                states[endpoint_id] = EndpointState.ENABLED
                if mono - self._success_written.get(endpoint_id, -1e9) >= SUCCESS_WRITE_S:
                    successes.append((endpoint_id, tally.last_success_at))
                    if len(self._success_written) >= SUCCESS_WRITTEN_MAX:
                        self._success_written.clear()
                    self._success_written[endpoint_id] = mono
                continue
            self._success_written.pop(endpoint_id, None)
            gone = next((o for o in items if o.result.status == 410), None)
            if gone is not None:
                health.disable(
                    session,
                    endpoint_id,
                    "gone: the endpoint answered 410",
                    now,
                    {"last_status_code": 410, "delivery": gone.work.delivery_id},
                )
            h = health.record(session, endpoint_id, tally)
            states[endpoint_id] = h.state if h is not None else EndpointState.DISABLED
            if h is not None and health.should_disable(h, self.thresholds, now):
                last = items[-1].result
                if health.disable(
                    session,
                    endpoint_id,
                    _failing_reason(h),
                    now,
                    {
                        "consecutive_failures": h.consecutive_failures,
                        "last_status_code": last.status,
                        "last_error": last.error,
                    },
                    probe=True,
                ):
                    states[endpoint_id] = EndpointState.DISABLED
        health.record_successes(session, successes)
        return states

    def _park_outcome(self, session: Session, o: Outcome, reason: DeadLetterReason) -> None:
        delivery = session.get(Delivery, o.work.delivery_id, with_for_update=True)
        if (
            delivery is None
            or delivery.state != DELIVERING
            or delivery.lease_expires_at != o.work.lease
        ):
            return
        delivery.attempt_count = o.work.n
        delivery.run_attempts = o.work.run_n
        # The letter shows the last attempt as it was, even when it got no HTTP status.
        delivery.last_status_code = o.result.status
        delivery.last_error = o.result.error
        park(session, delivery, delivery.event, delivery.endpoint, reason)

    def _record_releases(self, session: Session, releases: list[Release]) -> Timed:
        rows = [
            {
                "b_id": r.work.delivery_id,
                "b_lease": r.work.lease,
                "b_hold": (
                    r.hold_until + timedelta(seconds=HOLD_GRACE_S)
                    if r.hold_until is not None
                    else None
                ),
            }
            for r in releases
        ]
        write(session, "release", rows)
        return [
            (r.work.delivery_id, r.hold_until)
            for r in releases
            if r.hold_until is not None and not self.stopping.is_set()
        ]
