"""Processing a stored callback: once, in order, never backwards.

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
lease expires, and enqueues every event left ``received`` (Redis was down at receive time, or
its job was lost with a worker or a flushed Redis).

``kurir worker`` runs these jobs many at a time (:mod:`app.inbound.batch`, the same rules in
a few statements per batch); this module is the one-event path that any RQ worker runs (given
``--job-class app.queues.KurirJob``, which finds the job by its stable name) and that a batch
falls back to.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, and_, bindparam, or_, select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from app import runtime as runtime_mod
from app import telemetry
from app.cache import TTLCache
from app.clock import utcnow
from app.inbound import handlers as handler_registry
from app.inbound import reconcile
from app.inbound import state as states
from app.inbound.sources import CONFIG_CACHE_TTL_S
from app.models import InboundEvent, InboundSource, ResourceState, UTCDateTime
from app.queues import INBOUND, INBOUND_PROCESS, JobSpec, enqueue_after_commit, try_enqueue_many
from app.runtime import Runtime
from app.vocabulary import InboundStatus

log = logging.getLogger(__name__)
# Core table for the conditional statements (typed as a Table for mypy).
_EVENTS = cast(Table, InboundEvent.__table__)

PROCESSING_LEASE_S = 300
RECEIVED_GRACE_S = 30
MAX_ATTEMPTS = 10
# A CAS that loses can only lose to a newer state, so one retry classifies it for good;
# the bound is a guard against a bug, not a tuning knob.
MAX_CAS_ROUNDS = 3


class HandlerFailed(Exception):
    """A handler raised; the transaction is rolled back and the event marked failed."""

    def __init__(self, path: str, exc: BaseException) -> None:
        super().__init__(f"{path}: {type(exc).__name__}: {exc}")
        self.path = path


def process_jobs(event_ids: Iterable[str]) -> list[JobSpec]:
    """One job per event (``process_event(id)``), so any worker of the queue can run each."""
    return [JobSpec(INBOUND, INBOUND_PROCESS, (event_id,)) for event_id in event_ids]


def process_event(
    inbound_event_id: str, runtime: Runtime | None = None, *, now: datetime | None = None
) -> str | None:
    """RQ job: process one stored callback; returns its final status (None if not ours).

    ``kurir worker`` takes these jobs many at a time (:mod:`app.inbound.batch`); this is the
    same processing for one event, for any RQ worker with `app.queues.KurirJob` and for a
    batch that had to fall back to one event at a time.
    """
    rt = runtime or runtime_mod.current()
    try:
        claimed = _claim(rt, inbound_event_id, now=now)
    except SQLAlchemyError:
        log.warning(
            "inbound processing: database unavailable, the sweeper will retry",
            extra={"inbound_event_id": inbound_event_id},
            exc_info=True,
        )
        return None
    if claimed is None:
        return None
    done = traced_apply([claimed], lambda: {claimed.id: process_claimed(rt, claimed, now=now)})
    return done[claimed.id]


def process_claimed(rt: Runtime, claimed: Claimed, *, now: datetime | None = None) -> str | None:
    """Process one event this worker has claimed, in its own transaction."""
    inbound_event_id = claimed.id
    try:
        with rt.db.begin() as session:
            return _process(session, rt, claimed, now=now)
    except _Lost:
        log.info(
            "inbound event changed hands while processing; left to its new owner",
            extra={"inbound_event_id": inbound_event_id},
        )
        return None
    except SQLAlchemyError:
        log.warning(
            "inbound processing: database unavailable, the sweeper will retry",
            extra={"inbound_event_id": inbound_event_id},
            exc_info=True,
        )
        return None
    except HandlerFailed as exc:
        log.warning("inbound handler failed: %s", exc, extra={"inbound_event_id": inbound_event_id})
        return _mark_failed(rt, inbound_event_id, f"handler_error: {exc}", now=now)
    except Exception as exc:
        log.exception("inbound processing failed", extra={"inbound_event_id": inbound_event_id})
        return _mark_failed(rt, inbound_event_id, f"error: {type(exc).__name__}: {exc}", now=now)


_E = _EVENTS.c
# What a claim takes, sets and reads back, one for the single claim here and the batch's.
CLAIMABLE = or_(
    _E.status == InboundStatus.RECEIVED,
    and_(
        _E.status == InboundStatus.PROCESSING,
        _E.updated_at < bindparam("lease_cutoff", type_=UTCDateTime()),
    ),
)
CLAIM_VALUES = {
    "status": InboundStatus.PROCESSING,
    "attempts": _E.attempts + 1,
    "updated_at": bindparam("now", type_=UTCDateTime()),
}
CLAIMED_COLUMNS = (
    _E.id,
    _E.attempts,
    _E.source_id,
    _E.event_type,
    _E.resource_type,
    _E.resource_id,
    _E.resource_version,
    _E.occurred_at,
    _E.resource_status,
    _E.trace_context,
)
# Built once, values as parameters: the claim runs for every event.
_CLAIM = (
    update(_EVENTS)
    .where(_E.id == bindparam("b_id"), CLAIMABLE)
    .values(CLAIM_VALUES)
    .returning(*CLAIMED_COLUMNS)
)
FINISH = (
    update(_EVENTS)
    # Still ours: processing, and not claimed again since (its attempt count is ours).
    .where(
        _E.id == bindparam("b_id"),
        _E.status == InboundStatus.PROCESSING,
        _E.attempts == bindparam("b_attempts"),
    )
    .values(
        status=bindparam("new_status"),
        reason=bindparam("new_reason"),
        processed_at=bindparam("now", type_=UTCDateTime()),
        updated_at=bindparam("now", type_=UTCDateTime()),
    )
)


@dataclass(frozen=True)
class Claimed:
    """The fields of an event this worker now owns (returned by the claiming UPDATE)."""

    id: str
    attempts: int
    source_id: str
    event_type: str | None
    resource_type: str | None
    resource_id: str | None
    resource_version: int | None
    occurred_at: datetime | None
    resource_status: str | None
    # The receive span's W3C traceparent (tracing on when it was received), else None.
    trace_context: str | None = None


def traced_apply(
    claimed: list[Claimed], apply: Callable[[], dict[str, str | None]]
) -> dict[str, str | None]:
    """Run `apply` (which processes `claimed`) with a `kurir.inbound.apply` span per event,
    each a child of its receive span; ends them with the status each event ended in.

    One span per event even when a batch applies them all in one transaction: each trace
    then shows its own callback, received and applied.
    """
    if not telemetry.enabled():
        return apply()
    spans = {
        event.id: telemetry.start(
            "kurir.inbound.apply",
            parent=event.trace_context,
            kind=telemetry.CONSUMER,
            attributes={
                "kurir.inbound.event.id": event.id,
                "kurir.inbound.attempt": event.attempts,
                "kurir.inbound.event.type": event.event_type or "",
            },
        )
        for event in claimed
    }
    try:
        results = apply()
    except BaseException as exc:
        for span in spans.values():
            telemetry.end(span, error=type(exc).__name__)
        raise
    for event_id, span in spans.items():
        status = results.get(event_id)
        telemetry.end(
            span,
            attributes={"kurir.inbound.status": status or "left_to_another_worker"},
            error=None
            if status in (InboundStatus.APPLIED, InboundStatus.IGNORED, InboundStatus.QUARANTINED)
            else f"not applied: {status}",
        )
    return results


class _Lost(Exception):
    """The event stopped being ours (replayed, or taken over after our lease ran out)."""


def _claim(rt: Runtime, event_id: str, *, now: datetime | None) -> Claimed | None:
    now = now or utcnow()
    with rt.db.engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # A claim lost in a crash only sends the event back to `received` (the sweeper
            # resends it), so it need not wait for the WAL flush; the result commit does.
            connection.execute(text("SET LOCAL synchronous_commit = off"))
        row = connection.execute(
            _CLAIM,
            {
                "b_id": event_id,
                "now": now,
                "lease_cutoff": now - timedelta(seconds=PROCESSING_LEASE_S),
            },
        ).one_or_none()
    return None if row is None else Claimed(*row)


@dataclass(frozen=True)
class SourceConfig:
    """What processing needs of a source, cached briefly: it is read for every event."""

    id: str
    name: str
    allow_gaps: bool
    handlers: tuple[Any, ...]
    reconcile_url: str | None


# Bound of the cache (one entry per source seen): at the bound it is emptied and refilled.
CONFIGS_MAX = 1000
_configs: TTLCache[str, SourceConfig] = TTLCache(CONFIG_CACHE_TTL_S, CONFIGS_MAX)


def source_config(session: Session, source_id: str) -> SourceConfig | None:
    """What processing needs of a source, cached for `CONFIG_CACHE_TTL_S` (None: no source,
    which is not cached)."""
    asked_at = _configs.clock()
    config = _configs.get(source_id)
    if config is not None:
        return config
    source = session.get(InboundSource, source_id)
    if source is None:
        return None
    config = SourceConfig(
        source.id,
        source.name,
        source.allow_gaps,
        tuple(source.handlers or ()),
        source.reconcile_url,
    )
    _configs.put(source_id, config, stored_at=asked_at)
    return config


def _finish(
    connection: Connection, event: Claimed, status: str, reason: str | None, now: datetime
) -> str:
    result = connection.execute(
        FINISH,
        {
            "b_id": event.id,
            "b_attempts": event.attempts,
            "new_status": status,
            "new_reason": reason,
            "now": now,
        },
    )
    if not result.rowcount:
        raise _Lost(event.id)
    return status


def run_event_handlers(
    session: Session,
    bound: list[handler_registry.BoundHandler],
    event_id: str,
    state_id: str | None,
    *,
    stale: bool = False,
) -> None:
    todo = [h for h in bound if h.side_effect_only or not stale]
    if not todo:
        return
    # Handlers get ORM objects and the session: they may add rows of their own.
    event = session.get(InboundEvent, event_id)
    assert event is not None  # noqa: S101 - claimed by this worker
    source = session.get(InboundSource, event.source_id)
    assert source is not None  # noqa: S101 - the event's foreign key
    state = session.get(ResourceState, state_id, populate_existing=True) if state_id else None
    ctx = handler_registry.HandlerContext(session, source, event, state, stale=stale)
    for handler in todo:
        try:
            handler.func(ctx)
        except SQLAlchemyError:
            raise
        except Exception as exc:
            raise HandlerFailed(handler.path, exc) from exc


def _process(session: Session, rt: Runtime, event: Claimed, *, now: datetime | None) -> str | None:
    now = now or utcnow()
    connection = session.connection()
    source = source_config(session, event.source_id)
    if source is None:
        return None
    bound = handler_registry.handlers_for(source, event.event_type)
    if event.resource_id is None:
        # Nothing to order: the event is applied by its handlers alone (e.g. a ping).
        run_event_handlers(session, bound, event.id, None)
        return _finish(connection, event, InboundStatus.APPLIED, "no_resource", now)

    ordering = states.Ordering(
        event.resource_version, event.occurred_at, event.resource_status or event.event_type
    )
    # A source that forbids gaps checks "is this the next version?": exact only under the
    # row lock. Otherwise the conditional UPDATE alone is the arbiter.
    lock = not source.allow_gaps
    state = states.ensure_state(
        connection, source.id, event.resource_type, event.resource_id, lock=lock
    )
    for _ in range(MAX_CAS_ROUNDS):
        decision = states.decide(ordering, state, allow_gaps=source.allow_gaps, event_id=event.id)
        if decision.kind != states.APPLY:
            break
        if states.compare_and_set(connection, state.id, ordering, last_event_id=event.id, now=now):
            run_event_handlers(session, bound, event.id, state.id)
            if not source.allow_gaps and ordering.version is not None:
                release_next(session, rt, source.id, event, ordering.version)
            return _finish(connection, event, InboundStatus.APPLIED, None, now)
        # Lost to a concurrent worker: the state is now newer; classify against it.
        state = states.reload(connection, state.id, lock=lock)
    else:
        decision = states.Decision(states.STALE, "stale_event")

    if decision.kind == states.ALREADY_APPLIED:
        return _finish(connection, event, InboundStatus.APPLIED, decision.reason, now)
    if decision.kind == states.STALE:
        run_event_handlers(session, bound, event.id, state.id, stale=True)
        return _finish(connection, event, InboundStatus.IGNORED, decision.reason, now)
    # A gap or a contradiction: not safe to decide alone; ask the provider.
    request = reconcile.request_reconcile(session, source, event.resource_id, now=now)
    if request is not None:
        enqueue_after_commit(session, rt.redis, reconcile.run_jobs([request.id]))
    return _finish(connection, event, InboundStatus.QUARANTINED, decision.reason, now)


def release_next(
    session: Session, rt: Runtime, source_id: str, event: Claimed, applied_version: int
) -> None:
    """The gap before the next version just closed: send its quarantined events again."""
    waiting = [
        item
        for item in session.scalars(
            select(InboundEvent).where(
                InboundEvent.source_id == source_id,
                InboundEvent.resource_id == event.resource_id,
                InboundEvent.status == InboundStatus.QUARANTINED,
                InboundEvent.resource_version == applied_version + 1,
            )
        )
        if (item.resource_type or "") == (event.resource_type or "")
    ]
    for item in waiting:
        item.status = InboundStatus.RECEIVED
        item.reason = "gap_closed"
        item.updated_at = utcnow()
    enqueue_after_commit(session, rt.redis, process_jobs(item.id for item in waiting))


def _mark_failed(rt: Runtime, event_id: str, reason: str, *, now: datetime | None) -> str | None:
    now = now or utcnow()
    try:
        with rt.db.begin() as session:
            session.execute(
                update(_EVENTS)
                .where(_EVENTS.c.id == event_id, _EVENTS.c.status == InboundStatus.PROCESSING)
                .values(
                    status=InboundStatus.FAILED,
                    reason=reason[:2000],
                    processed_at=now,
                    updated_at=now,
                )
            )
    except SQLAlchemyError:
        log.warning(
            "inbound processing: could not record the failure", extra={"inbound_event_id": event_id}
        )
        return None
    return InboundStatus.FAILED


def sweep(runtime: Runtime, *, now: datetime | None = None, limit: int = 1000) -> int:
    """Periodic: enqueue events left ``received`` or abandoned ``processing``."""
    now = now or utcnow()
    col = _EVENTS.c
    with runtime.db.begin() as session:
        session.execute(
            update(_EVENTS)
            .where(
                col.status == InboundStatus.PROCESSING,
                col.attempts >= MAX_ATTEMPTS,
                col.updated_at < now - timedelta(seconds=PROCESSING_LEASE_S),
            )
            .values(
                status=InboundStatus.FAILED,
                reason=f"gave up after {MAX_ATTEMPTS} attempts",
                processed_at=now,
                updated_at=now,
            )
        )
        stuck = list(
            session.scalars(
                select(InboundEvent.id)
                .where(
                    or_(
                        (col.status == InboundStatus.RECEIVED)
                        & (col.updated_at < now - timedelta(seconds=RECEIVED_GRACE_S)),
                        (col.status == InboundStatus.PROCESSING)
                        & (col.updated_at < now - timedelta(seconds=PROCESSING_LEASE_S)),
                    )
                )
                .order_by(InboundEvent.id)
                .limit(limit)
            )
        )
    if stuck:
        try_enqueue_many(runtime.redis, process_jobs(stuck))
    return len(stuck)
