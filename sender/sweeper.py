"""At-least-once: find every delivery the queue may have lost and put it back on the queue.

Redis only carries work; this pass, run by `kurir scheduler` every
`KURIR_SWEEP_INTERVAL_SECONDS`, rebuilds it from the database:

1. **Expired leases.** A `delivering` row whose lease passed belongs to a worker that died (or
   stalled past its lease). The attempt it was making is recorded as `worker_lost` (it may have
   reached the partner) and the delivery is made due at once — or parked when that was its
   last attempt.
2. **Orphans.** A `pending`/`retrying` row due within the next few seconds is enqueued when
   nobody is responsible for it: its lease (for these states, "someone holds a timer for it
   until…") is empty or passed. A fresh `pending` row with no lease was enqueued by whoever
   wrote it, so it is left alone for `FRESH_GRACE_S` — unless Redis lost its data (restart,
   `FLUSHALL`), which the sweeper tells from a marker key it keeps there: then everything due
   is enqueued at once.

Enqueued rows get a lease of `REQUEUE_AFTER_S` so the next passes do not enqueue them again
while the job waits in a long queue. Duplicates are harmless either way: the job's guard
re-reads each delivery and claims it with a conditional UPDATE.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import redis
from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from app.clock import utcnow
from app.ids import new_id
from app.models import DELIVERING, PENDING, RETRYING, Delivery, Endpoint
from app.queues import DELIVERIES
from app.runtime import Runtime
from sender import ordering
from sender.dispatch import enqueue_now
from sender.engine.errors import ERROR_WORKER_LOST, REASON_RETRIES_EXHAUSTED
from sender.engine.recorder import record_attempts
from sender.park import park
from sender.policy import RetryPolicy

log = logging.getLogger(__name__)

MARKER_KEY = "kurir:sweeper:marker"
FRESH_GRACE_S = 30.0
REQUEUE_AFTER_S = 30.0
MAX_PER_PASS = 20_000
LOOKAHEAD_S = 2.0


@dataclass(frozen=True)
class SweepResult:
    recovered: int
    enqueued: int
    redis_lost: bool
    redis_down: bool = False


def recover_expired(
    session: Session, now: datetime, policy: RetryPolicy, limit: int = MAX_PER_PASS
) -> int:
    """Take deliveries back from workers whose lease expired; returns how many."""
    rows = session.execute(
        select(Delivery.id, Delivery.attempt_count, Delivery.run_attempts, Endpoint.url)
        .join(Endpoint, Endpoint.id == Delivery.endpoint_id)
        .where(Delivery.state == DELIVERING, Delivery.lease_expires_at <= now)
        .order_by(Delivery.lease_expires_at)
        .limit(limit)
        .with_for_update(skip_locked=True, of=Delivery)
    ).all()
    if not rows:
        return 0
    record_attempts(
        session,
        [
            {
                "id": new_id("att"),
                "delivery_id": r.id,
                "n": r.attempt_count + 1,
                # When it started is unknown; this records when it was found lost.
                "started_at": now,
                "duration_ms": 0,
                "url": r.url,
                "request_headers": {},
                "response_status": None,
                "response_body": None,
                "error": ERROR_WORKER_LOST,
                "created_at": now,
            }
            for r in rows
        ],
        overwrite=False,
    )
    exhausted = [r.id for r in rows if r.run_attempts + 1 >= policy.max_attempts]
    again = [r.id for r in rows if r.run_attempts + 1 < policy.max_attempts]
    if again:
        session.execute(
            update(Delivery)
            .where(
                Delivery.id.in_(again),
                Delivery.state == DELIVERING,
                Delivery.lease_expires_at <= now,
            )
            .values(
                state=RETRYING,
                attempt_count=Delivery.attempt_count + 1,
                run_attempts=Delivery.run_attempts + 1,
                next_attempt_at=now,
                lease_expires_at=None,
                last_status_code=None,
                last_error=ERROR_WORKER_LOST,
                updated_at=now,
            )
            .execution_options(synchronize_session=False)
        )
    for delivery_id in exhausted:
        delivery = session.get(Delivery, delivery_id)
        if delivery is None:
            continue
        delivery.attempt_count += 1
        delivery.run_attempts += 1
        delivery.last_status_code = None
        delivery.last_error = ERROR_WORKER_LOST
        park(session, delivery, delivery.event, delivery.endpoint, REASON_RETRIES_EXHAUSTED)
    log.warning("recovered %d deliveries from expired leases", len(rows))
    return len(rows)


def orphans(
    session: Session,
    now: datetime,
    *,
    redis_lost: bool,
    lookahead_s: float = LOOKAHEAD_S,
    limit: int = MAX_PER_PASS,
) -> list[str]:
    """Due deliveries nobody is responsible for, ordered by endpoint so jobs batch well."""
    waiting = Delivery.state.in_((PENDING, RETRYING))
    due = Delivery.next_attempt_at <= now + timedelta(seconds=lookahead_s)
    if redis_lost:
        # A Redis that lost its data also lost the jobs of reserved rows: take them all.
        condition = and_(waiting, due)
    else:
        unowned = or_(
            Delivery.lease_expires_at <= now,
            and_(
                Delivery.lease_expires_at.is_(None),
                or_(
                    Delivery.state == RETRYING,
                    Delivery.updated_at <= now - timedelta(seconds=FRESH_GRACE_S),
                ),
            ),
        )
        condition = and_(waiting, due, unowned)
    # An ordered delivery waiting for the one before it in its key is not due yet.
    condition = and_(condition, ordering.ready())
    rows = sorted(
        session.execute(
            select(Delivery.id, Delivery.endpoint_id)
            .where(condition)
            .order_by(Delivery.next_attempt_at)
            .limit(limit)
        ).all(),
        key=lambda r: str(r.endpoint_id),
    )
    return [r.id for r in rows]


def _reserve(session: Session, ids: list[str], until: datetime) -> None:
    for i in range(0, len(ids), 500):
        session.execute(
            update(Delivery)
            .where(Delivery.id.in_(ids[i : i + 500]), Delivery.state.in_((PENDING, RETRYING)))
            .values(lease_expires_at=until)
            .execution_options(synchronize_session=False)
        )


def _redis_lost(connection: redis.Redis) -> bool:
    """True when Redis no longer holds our marker: restarted empty or flushed."""
    return not connection.exists(MARKER_KEY)


def sweep(
    runtime: Runtime, *, clock: Callable[[], datetime] = utcnow, lookahead_s: float | None = None
) -> SweepResult:
    """One pass: recover expired leases, then enqueue every due delivery nobody owns."""
    settings = runtime.settings
    now = clock()
    policy = RetryPolicy(schedule=tuple(settings.retry_schedule), jitter=settings.retry_jitter)
    if lookahead_s is None:
        lookahead_s = max(LOOKAHEAD_S, settings.sweep_interval_seconds + 1.0)
    with runtime.db.begin() as session:
        recovered = recover_expired(session, now, policy)
    connection = runtime.redis
    try:
        lost = _redis_lost(connection)
    except (redis.RedisError, OSError) as exc:
        log.warning("redis unavailable, nothing enqueued this pass: %s", exc)
        return SweepResult(recovered, 0, False, redis_down=True)
    with runtime.db.begin() as session:
        ids = orphans(session, now, redis_lost=lost, lookahead_s=lookahead_s)
    if ids and not enqueue_now(connection, ids, tag=f"s{int(now.timestamp())}"):
        return SweepResult(recovered, 0, lost, redis_down=True)
    if ids:
        until = now + timedelta(seconds=lookahead_s + REQUEUE_AFTER_S)
        with runtime.db.begin() as session:
            _reserve(session, ids, until)
    if len(ids) < MAX_PER_PASS:
        # Only once everything lost has been put back does Redis count as whole again.
        with contextlib.suppress(redis.RedisError, OSError):
            connection.set(MARKER_KEY, now.isoformat())
    if lost and ids:
        log.warning("redis had lost its queues; re-enqueued %d deliveries", len(ids))
    return SweepResult(recovered, len(ids), lost)


def queue_depth(connection: redis.Redis) -> int:
    """How many delivery jobs wait in Redis (for the dashboard and the benchmark)."""
    return int(connection.llen(f"rq:queue:{DELIVERIES}"))
