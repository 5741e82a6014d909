"""Processing a stored callback (SPEC §6.4): once, in order, never backwards.

``process_event(inbound_event_id)`` is the RQ job. It

1. claims the event with a conditional UPDATE (``received`` → ``processing``, or a
   ``processing`` whose worker vanished more than ``PROCESSING_LEASE_S`` ago); an event
   already applied, ignored or being worked on elsewhere is left alone, so a duplicate job
   is harmless;
2. in one transaction: creates a placeholder state for an unknown resource, decides from the
   versions (or ``occurred_at``) and applies with :func:`app.inbound.state.compare_and_set`,
   the single conditional UPDATE that makes concurrent workers safe, then runs the event
   type's handlers in that same transaction;
3. ends the event ``applied``, ``ignored`` (``stale_event``; side-effect-only handlers still
   run), ``quarantined`` (a version gap on a source that forbids gaps, or a contradiction;
   reconciliation is filed) or ``failed`` (a handler raised: nothing of it was applied).

A database outage leaves the event ``processing``; :func:`sweep` re-enqueues it once its
lease expires, and enqueues every event left ``received`` (Redis was down at receive time).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import cast

from sqlalchemy import Table, or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from app import runtime as runtime_mod
from app.clock import utcnow
from app.db import after_commit
from app.inbound import handlers as handler_registry
from app.inbound import reconcile
from app.inbound import state as states
from app.models import InboundEvent, InboundSource
from app.queues import INBOUND, JobSpec, try_enqueue_many
from app.runtime import Runtime

log = logging.getLogger(__name__)
# Core table for the conditional statements (typed as a Table for mypy).
_EVENTS = cast(Table, InboundEvent.__table__)

RECEIVED, PROCESSING, APPLIED, IGNORED, QUARANTINED, FAILED = (
    "received", "processing", "applied", "ignored", "quarantined", "failed")
FINAL = (APPLIED, IGNORED)
PROCESS_JOB = "app.inbound.process.process_event"
PROCESSING_LEASE_S = 300
RECEIVED_GRACE_S = 30
MAX_ATTEMPTS = 10
# A CAS that loses can only lose to a newer state, so one retry classifies it for good;
# the bound is a guard against a bug, not a tuning knob.
_MAX_CAS_ROUNDS = 3


class HandlerFailed(Exception):
    """A handler raised; the transaction is rolled back and the event marked failed."""

    def __init__(self, path: str, exc: BaseException) -> None:
        super().__init__(f"{path}: {type(exc).__name__}: {exc}")
        self.path = path


def enqueue_after_commit(session: Session, runtime: Runtime, event_ids: list[str]) -> None:
    if not event_ids:
        return
    redis = runtime.redis
    ids = list(event_ids)
    after_commit(session, lambda: try_enqueue_many(
        redis, [JobSpec(INBOUND, PROCESS_JOB, (event_id,)) for event_id in ids]))


def process_event(inbound_event_id: str, runtime: Runtime | None = None, *,
                  now: datetime | None = None) -> str | None:
    """RQ job: process one stored callback; returns its final status (None if not ours)."""
    rt = runtime or runtime_mod.current()
    try:
        if not _claim(rt, inbound_event_id, now=now):
            return None
        with rt.db.begin() as session:
            return _process(session, rt, inbound_event_id, now=now)
    except SQLAlchemyError:
        log.warning("inbound processing: database unavailable, the sweeper will retry",
                    extra={"inbound_event_id": inbound_event_id}, exc_info=True)
        return None
    except HandlerFailed as exc:
        log.warning("inbound handler failed: %s", exc,
                    extra={"inbound_event_id": inbound_event_id})
        return _mark_failed(rt, inbound_event_id, f"handler_error: {exc}", now=now)
    except Exception as exc:
        log.exception("inbound processing failed", extra={"inbound_event_id": inbound_event_id})
        return _mark_failed(rt, inbound_event_id, f"error: {type(exc).__name__}: {exc}", now=now)


def _claim(rt: Runtime, event_id: str, *, now: datetime | None) -> bool:
    now = now or utcnow()
    col = _EVENTS.c
    abandoned = (col.status == PROCESSING) & (
        col.updated_at < now - timedelta(seconds=PROCESSING_LEASE_S))
    with rt.db.begin() as session:
        result = session.execute(
            update(_EVENTS)
            .where(col.id == event_id, or_(col.status == RECEIVED, abandoned))
            .values(status=PROCESSING, attempts=col.attempts + 1, updated_at=now))
    return bool(result.rowcount)  # type: ignore[attr-defined]


def _finish(event: InboundEvent, status: str, reason: str | None, now: datetime) -> str:
    event.status = status
    event.reason = reason
    event.processed_at = now
    event.updated_at = now
    return status


def _run_handlers(ctx: handler_registry.HandlerContext) -> None:
    for handler in handler_registry.handlers_for(ctx.source, ctx.event.event_type):
        if ctx.stale and not handler.side_effect_only:
            continue
        try:
            handler.func(ctx)
        except SQLAlchemyError:
            raise
        except Exception as exc:
            raise HandlerFailed(handler.path, exc) from exc


def _process(session: Session, rt: Runtime, event_id: str, *,
             now: datetime | None) -> str | None:
    now = now or utcnow()
    event = session.get(InboundEvent, event_id, populate_existing=True)
    if event is None or event.status != PROCESSING:
        return None
    source = session.get(InboundSource, event.source_id)
    if source is None:
        return None
    if event.resource_id is None:
        # Nothing to order: the event is applied by its handlers alone (e.g. a ping).
        _run_handlers(handler_registry.HandlerContext(session, source, event, None))
        return _finish(event, APPLIED, "no_resource", now)

    ordering = states.Ordering(event.resource_version, event.occurred_at,
                               event.resource_status or event.event_type)
    # A source that forbids gaps checks "is this the next version?": exact only under the
    # row lock. Otherwise the conditional UPDATE alone is the arbiter.
    lock = not source.allow_gaps
    state = states.ensure_state(session, source.id, event.resource_type, event.resource_id,
                                lock=lock)
    for _ in range(_MAX_CAS_ROUNDS):
        decision = states.decide(ordering, state, allow_gaps=source.allow_gaps,
                                 event_id=event.id)
        if decision.kind != states.APPLY:
            break
        if states.compare_and_set(session, state.id, ordering, last_event_id=event.id,
                                  now=now):
            state = states.reload(session, state.id)
            _run_handlers(handler_registry.HandlerContext(session, source, event, state))
            if not source.allow_gaps:
                _release_next(session, rt, source, event, state)
            return _finish(event, APPLIED, None, now)
        # Lost to a concurrent worker: the state is now newer; classify against it.
        state = states.reload(session, state.id, lock=lock)
    else:
        decision = states.Decision(states.STALE, "stale_event")

    if decision.kind == states.ALREADY_APPLIED:
        return _finish(event, APPLIED, decision.reason, now)
    if decision.kind == states.STALE:
        _run_handlers(handler_registry.HandlerContext(session, source, event, state,
                                                      stale=True))
        return _finish(event, IGNORED, decision.reason, now)
    # A gap or a contradiction: not safe to decide alone; ask the provider.
    request = reconcile.request_reconcile(session, source, event.resource_id, now=now)
    if request is not None:
        reconcile.enqueue_after_commit(session, rt, [request.id])
    return _finish(event, QUARANTINED, decision.reason, now)


def _release_next(session: Session, rt: Runtime, source: InboundSource, event: InboundEvent,
                  state: states.ResourceState) -> None:
    """The gap before the next version just closed: send its quarantined events again."""
    if state.last_version is None:
        return
    waiting = list(session.scalars(select(InboundEvent).where(
        InboundEvent.source_id == source.id, InboundEvent.resource_id == event.resource_id,
        InboundEvent.status == QUARANTINED,
        InboundEvent.resource_version == state.last_version + 1)))
    for item in waiting:
        if (item.resource_type or "") != (event.resource_type or ""):
            continue
        item.status = RECEIVED
        item.reason = "gap_closed"
        item.updated_at = utcnow()
    enqueue_after_commit(session, rt, [item.id for item in waiting
                                       if item.status == RECEIVED])


def _mark_failed(rt: Runtime, event_id: str, reason: str, *, now: datetime | None) -> str | None:
    now = now or utcnow()
    try:
        with rt.db.begin() as session:
            session.execute(
                update(_EVENTS)
                .where(_EVENTS.c.id == event_id,
                       _EVENTS.c.status == PROCESSING)
                .values(status=FAILED, reason=reason[:2000], processed_at=now, updated_at=now))
    except SQLAlchemyError:
        log.warning("inbound processing: could not record the failure",
                    extra={"inbound_event_id": event_id})
        return None
    return FAILED


def sweep(runtime: Runtime, *, now: datetime | None = None, limit: int = 1000) -> int:
    """Periodic: enqueue events left ``received`` or abandoned ``processing``."""
    now = now or utcnow()
    col = _EVENTS.c
    with runtime.db.begin() as session:
        session.execute(
            update(_EVENTS)
            .where(col.status == PROCESSING, col.attempts >= MAX_ATTEMPTS,
                   col.updated_at < now - timedelta(seconds=PROCESSING_LEASE_S))
            .values(status=FAILED, reason=f"gave up after {MAX_ATTEMPTS} attempts",
                    processed_at=now, updated_at=now))
        stuck = list(session.scalars(
            select(InboundEvent.id).where(or_(
                (col.status == RECEIVED)
                & (col.updated_at < now - timedelta(seconds=RECEIVED_GRACE_S)),
                (col.status == PROCESSING)
                & (col.updated_at < now - timedelta(seconds=PROCESSING_LEASE_S)),
            )).order_by(InboundEvent.id).limit(limit)))
    if stuck:
        try_enqueue_many(runtime.redis,
                         [JobSpec(INBOUND, PROCESS_JOB, (event_id,)) for event_id in stuck])
    return len(stuck)
