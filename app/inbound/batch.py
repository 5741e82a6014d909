"""Processing many stored callbacks at once: the same rules as one, a few statements per batch.

One event per RQ job costs ~50 Redis commands and two transactions of their own, so a
worker kept up with a third of what the receiver acknowledges. A batch
(:func:`process_batch`, fed by :class:`app.inbound.consumer.InboundConsumer`) does

1. one claiming UPDATE for every event (``received`` → ``processing``, or a ``processing``
   whose lease ran out; rows another worker is claiming right now are skipped, not waited
   for), committed on its own as :func:`app.inbound.process.process_event` does, so each
   event's ``attempts`` counts a try even if the worker then dies;
2. one transaction that locks every resource state the batch touches, in key order (the
   placeholders of resources never seen are created first, in a short transaction of their
   own, so that no batch ever takes a lock out of that order), then decides the events in
   the order they were received (a late older event is ``stale_event``, exactly as it would
   be one at a time) and applies each with the single conditional UPDATE of
   :func:`app.inbound.state.compare_and_set`: the database re-checks ``last_version < :v``,
   so nothing (another batch, a one-event job, a reconciliation) can make a resource move
   backwards. Those UPDATEs go out together
   (:func:`app.inbound.state.compare_and_set_many`); if one does not apply, the locked
   state was not what the batch decided on, and it starts over one event at a time.
   Handlers run in a savepoint per event, so a failing one undoes only its own event,
   which ends ``failed``;
3. one executemany that ends every event, fenced on its claim (``processing`` with our
   attempt count); if any was taken over after its lease ran out, the whole batch rolls back
   and every event is processed again on its own by the one-event path, which sorts it out.

Any database error (a deadlock with a handler's own writes, a dropped connection) does the
same: roll back, then one event at a time. What was claimed and never finished is found
again by :func:`app.inbound.process.sweep` once its lease expires.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import BindParameter, bindparam, select, text, update
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session, SessionTransaction

from app.clock import utcnow
from app.inbound import handlers as handler_registry
from app.inbound import process, reconcile
from app.inbound import state as states
from app.inbound.process import (
    _EVENTS,
    CLAIM_VALUES,
    CLAIMABLE,
    CLAIMED_COLUMNS,
    FINISH,
    PROCESSING_LEASE_S,
    Claimed,
    HandlerFailed,
    SourceConfig,
)
from app.queues import enqueue_after_commit
from app.runtime import Runtime
from app.vocabulary import InboundStatus

log = logging.getLogger(__name__)

_E = _EVENTS.c
_IDS: BindParameter[list[str]] = bindparam("b_ids", expanding=True)
# SKIP LOCKED: an event another worker is claiming this instant is theirs; waiting for it
# could deadlock two claims that list the same events in another order (PostgreSQL only;
# SQLite has one writer and renders no lock clause).
_CLAIM_MANY = (
    update(_EVENTS)
    .where(
        _E.id.in_(
            select(_E.id)
            .where(_E.id.in_(_IDS), CLAIMABLE)
            .with_for_update(skip_locked=True)
            .scalar_subquery()
        ),
        CLAIMABLE,
    )
    .values(CLAIM_VALUES)
    .returning(*CLAIMED_COLUMNS)
)


class _LostClaim(Exception):
    """At least one event of the batch was taken over by another worker (lease expired)."""


@dataclass(frozen=True)
class _Outcome:
    status: str
    reason: str | None


def process_batch(
    runtime: Runtime, event_ids: Iterable[str], *, now: datetime | None = None
) -> dict[str, str | None]:
    """Claim and process many inbound events; returns {id: final status} for those claimed.

    An id that is not claimable (already final, processing elsewhere, unknown) is left alone
    and absent from the result, so duplicate ids and duplicate jobs are harmless.
    """
    ids = list(dict.fromkeys(event_ids))
    if not ids:
        return {}
    try:
        try:
            claimed = claim_many(runtime, ids, now=now)
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
            # A pooled connection the server had dropped (restart, terminated backend):
            # the pool has been refreshed, so one more try usually goes through.
            claimed = claim_many(runtime, ids, now=now)
    except SQLAlchemyError:
        log.warning(
            "inbound batch: database unavailable while claiming %d events; the "
            "sweeper will send them again",
            len(ids),
            exc_info=True,
        )
        return {}
    return process.traced_apply(claimed, lambda: process_claimed_batch(runtime, claimed, now=now))


def process_claimed_batch(
    runtime: Runtime, claimed: list[Claimed], *, now: datetime | None = None
) -> dict[str, str | None]:
    """Process events this worker has claimed, in one transaction if all goes well."""
    if not claimed:
        return {}
    try:
        try:
            with runtime.db.begin() as session:
                return _apply(session, runtime, claimed, now=now)
        except _Unknown as unknown:
            # New resources: their placeholders first, committed, then lock them all again.
            with runtime.db.engine.begin() as connection:
                states.create_placeholders(connection, unknown.keys)
            with runtime.db.begin() as session:
                return _apply(session, runtime, claimed, now=now, last_round=True)
    except Exception as exc:
        # Nothing of the batch was kept: take the events one at a time, each in its own
        # transaction, where a lost claim, a failing event or an outage touches only itself.
        log.warning(
            "inbound batch of %d rolled back (%s: %s); processing its events one by one",
            len(claimed),
            type(exc).__name__,
            str(exc).split("\n", 1)[0][:300],
            exc_info=not isinstance(exc, SQLAlchemyError | _LostClaim | _Diverged),
        )
        return {event.id: process.process_claimed(runtime, event, now=now) for event in claimed}


def claim_many(runtime: Runtime, ids: list[str], *, now: datetime | None) -> list[Claimed]:
    now = now or utcnow()
    with runtime.db.engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # As for one event: a claim lost in a crash only delays the event until the
            # sweeper resends it, so it need not wait for the WAL flush.
            connection.execute(text("SET LOCAL synchronous_commit = off"))
        rows = connection.execute(
            _CLAIM_MANY,
            {"b_ids": ids, "now": now, "lease_cutoff": now - timedelta(seconds=PROCESSING_LEASE_S)},
        ).all()
    # In the order the ids came (the queue's, so the order the callbacks were received in).
    position = {event_id: n for n, event_id in enumerate(ids)}
    return sorted((Claimed(*row) for row in rows), key=lambda event: position[event.id])


class _Unknown(Exception):
    """Resources of the batch that have no state row yet."""

    def __init__(self, keys: list[states.StateKey]) -> None:
        super().__init__(f"{len(keys)} resource(s) without a state")
        self.keys = keys


def _apply(
    session: Session,
    rt: Runtime,
    claimed: list[Claimed],
    *,
    now: datetime | None,
    last_round: bool = False,
) -> dict[str, str | None]:
    now = now or utcnow()
    sources: dict[str, SourceConfig | None] = {}
    for event in claimed:
        if event.source_id not in sources:
            sources[event.source_id] = process.source_config(session, event.source_id)
    keys = [
        (event.source_id, event.resource_type or "", event.resource_id)
        for event in claimed
        if event.resource_id is not None and sources[event.source_id] is not None
    ]
    # Every state of the batch locked up front, in key order (see states.lock_states).
    current = states.lock_states(session.connection(), keys) if keys else {}
    unknown = [key for key in keys if key not in current]
    if unknown:
        if not last_round:
            raise _Unknown(unknown)
        # Deleted between the two rounds (it never happens but by hand): create them here.
        states.create_placeholders(session.connection(), unknown)
        current.update(states.lock_states(session.connection(), unknown))
    run = _Run(session, rt, current, now)
    results: dict[str, str | None] = {}
    finishes: list[dict[str, object]] = []
    for event in claimed:
        source = sources[event.source_id]
        if source is None:
            results[event.id] = None  # the source was deleted; its events go with it
            continue
        outcome = run.one(source, event)
        results[event.id] = outcome.status
        finishes.append(
            {
                "b_id": event.id,
                "b_attempts": event.attempts,
                "new_status": outcome.status,
                "new_reason": outcome.reason,
                "now": now,
            }
        )
    run.flush()
    if finishes:
        result = session.connection().execute(FINISH, finishes)
        if result.rowcount != len(finishes):
            raise _LostClaim(f"{len(finishes) - result.rowcount} of {len(finishes)}")
    return results


class _Diverged(Exception):
    """A conditional UPDATE did not apply although the locked state said it would."""


class _Run:
    """One batch's pass over its events, with the states it has locked and moved so far.

    The conditional UPDATEs of events without handlers are sent together (one executemany
    per statement shape, in arrival order) before anything else reads the database; each is
    still the single ``WHERE last_version < :v`` compare-and-set, and if any of them does not
    apply, the batch is rolled back and redone one event at a time.
    """

    def __init__(
        self,
        session: Session,
        rt: Runtime,
        current: dict[states.StateKey, states.StateRow],
        now: datetime,
    ) -> None:
        self.session = session
        self.rt = rt
        self.current = current
        self.now = now
        self.pending: list[states.Write] = []

    def flush(self) -> None:
        if not self.pending:
            return
        applied = states.compare_and_set_many(self.session.connection(), self.pending, now=self.now)
        if applied != len(self.pending):
            raise _Diverged(f"{len(self.pending) - applied} of {len(self.pending)}")
        self.pending = []

    def one(self, source: SourceConfig, event: Claimed) -> _Outcome:
        """Decide and apply one event; ``current`` follows every state it moves."""
        session = self.session
        bound = handler_registry.handlers_for(source, event.event_type)
        if bound:
            self.flush()  # handlers see every state the batch has moved so far
        if event.resource_id is None:
            # Nothing to order: the event is applied by its handlers alone (e.g. a ping).
            failed = _handlers_in_savepoint(session, bound, event.id, None)
            return failed or _Outcome(InboundStatus.APPLIED, "no_resource")

        key = (event.source_id, event.resource_type or "", event.resource_id)
        ordering = states.Ordering(
            event.resource_version, event.occurred_at, event.resource_status or event.event_type
        )
        state = self.current[key]
        decision = states.decide(ordering, state, allow_gaps=source.allow_gaps, event_id=event.id)
        if decision.kind == states.APPLY:
            write = states.Write(state.id, ordering, last_event_id=event.id)
            if bound:
                failed = self._apply_with_handlers(bound, event, write)
                if failed is not None:
                    return failed  # the state stays as it was before this event
            else:
                self.pending.append(write)
            self.current[key] = states.written(state, write)
            if not source.allow_gaps and ordering.version is not None:
                process.release_next(session, self.rt, source.id, event, ordering.version)
            return _Outcome(InboundStatus.APPLIED, None)
        if decision.kind == states.ALREADY_APPLIED:
            return _Outcome(InboundStatus.APPLIED, decision.reason)
        if decision.kind == states.STALE:
            stale = [h for h in bound if h.side_effect_only]
            failed = _handlers_in_savepoint(session, stale, event.id, state.id, stale=True)
            return failed or _Outcome(InboundStatus.IGNORED, decision.reason)
        # A gap or a contradiction: not safe to decide alone; ask the provider.
        request = reconcile.request_reconcile(session, source, event.resource_id, now=self.now)
        if request is not None:
            enqueue_after_commit(session, self.rt.redis, reconcile.run_jobs([request.id]))
        return _Outcome(InboundStatus.QUARANTINED, decision.reason)

    def _apply_with_handlers(
        self, bound: list[handler_registry.BoundHandler], event: Claimed, write: states.Write
    ) -> _Outcome | None:
        """Compare-and-set, then the handlers, in a savepoint; the failure, or None."""
        savepoint = _savepoint(self.session)
        if not states.compare_and_set(
            self.session.connection(),
            write.state_id,
            write.event,
            last_event_id=write.last_event_id,
            now=self.now,
        ):
            raise _Diverged(event.id)
        try:
            process.run_event_handlers(self.session, bound, event.id, write.state_id)
        except HandlerFailed as exc:
            savepoint.rollback()
            log.warning("inbound handler failed: %s", exc, extra={"inbound_event_id": event.id})
            return _Outcome(InboundStatus.FAILED, f"handler_error: {exc}"[:2000])
        savepoint.commit()
        return None


def _handlers_in_savepoint(
    session: Session,
    bound: list[handler_registry.BoundHandler],
    event_id: str,
    state_id: str | None,
    *,
    stale: bool = False,
) -> _Outcome | None:
    """Run handlers so that a failing one undoes only its own event; the failure, or None."""
    if not bound:
        return None
    try:
        with _savepoint(session):
            process.run_event_handlers(session, bound, event_id, state_id, stale=stale)
    except HandlerFailed as exc:
        log.warning("inbound handler failed: %s", exc, extra={"inbound_event_id": event_id})
        return _Outcome(InboundStatus.FAILED, f"handler_error: {exc}"[:2000])
    return None


def _savepoint(session: Session) -> SessionTransaction:
    """A SAVEPOINT, emitted now: the session would emit it only at its next own statement,
    after the Core statements this module runs on the connection."""
    savepoint = session.begin_nested()
    session.connection()
    return savepoint
