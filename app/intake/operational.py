"""Publishing Kurir's operational events: what `app.operational.emit` recorded in the outbox
becomes events through the intake, planned and written like any publish, so that their
deliveries are signed, retried and dead-lettered like any other.

Each recorded event is published to the reserved operator partner (every endpoint of it that
subscribes, which by default is all of them), and, when the partner it is about has opted in,
to that partner too, on those of its endpoints that subscribe to the type by name (an endpoint
subscribed to everything gets the partner's own events only). A destination with no endpoint
to receive it gets no event row. The copies share a `correlation_id`: the recorded event's id.

A job publishes right after the commit that recorded the event (`emit` enqueues it); the
scheduler publishes whatever a lost job left. Running twice is harmless: rows are taken with
`FOR UPDATE SKIP LOCKED` and marked published in the same transaction.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime

import redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from app import event_types, operational
from app import runtime as runtime_mod
from app.clock import utcnow
from app.config import Settings
from app.db import Database
from app.errors import NotFound, ValidationFailed
from app.intake.envelope import PublishRequest
from app.intake.plan import make_plan
from app.intake.publish import write_plan
from app.intake.targets import read_targets
from app.models import OperationalEvent, Partner
from app.runtime import Runtime

log = logging.getLogger(__name__)

BATCH = 100


def run_job(_row_id: str) -> int:
    """The job `emit` enqueues: publish everything recorded so far (its own row included)."""
    return publish_all(runtime_mod.current())


def publish_all(rt: Runtime, now: datetime | None = None) -> int:
    """Publish every recorded operational event, a batch per transaction; how many."""
    total = 0
    while True:
        done = publish_pending(rt.db, rt.redis, rt.settings, now=now)
        total += done
        if done < BATCH:
            return total


def publish_pending(
    db: Database,
    redis_client: redis.Redis,
    settings: Settings,
    *,
    limit: int = BATCH,
    now: datetime | None = None,
) -> int:
    """Publish up to `limit` recorded operational events, oldest first; how many."""
    with db.begin() as session:
        rows = session.scalars(
            select(OperationalEvent)
            .where(
                OperationalEvent.published_at.is_(None),
                OperationalEvent.kind.in_(sorted(operational.NAMES)),
            )
            .order_by(OperationalEvent.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        ).all()
        if not rows:
            return 0
        operational.ensure_registered(session)
        operator = operational.operator_partner(session)
        stamp = now or utcnow()
        for row in rows:
            _publish(session, redis_client, settings, row, operator)
            row.published_at = stamp
    return len(rows)


def _publish(
    session: Session,
    redis_client: redis.Redis,
    settings: Settings,
    row: OperationalEvent,
    operator: Partner | None,
) -> None:
    destinations: list[tuple[Partner, bool]] = []
    if operator is not None:
        destinations.append((operator, False))
    if row.partner_id is not None and (operator is None or row.partner_id != operator.id):
        partner = session.get(Partner, row.partner_id)
        if partner is not None and partner.operational_events:
            destinations.append((partner, True))
    for partner, by_name in destinations:
        try:
            with session.begin_nested():
                _publish_to(session, redis_client, settings, row, partner, by_name=by_name)
        except (ValidationFailed, NotFound) as exc:
            # Kurir's own data and schema disagree: a bug, logged, never retried in a loop.
            log.error(
                "operational event not published",
                extra={
                    "operational_event_id": row.id,
                    "kind": row.kind,
                    "partner": partner.uid,
                    "error": str(exc),
                },
            )


def _publish_to(
    session: Session,
    redis_client: redis.Redis,
    settings: Settings,
    row: OperationalEvent,
    partner: Partner,
    *,
    by_name: bool,
) -> None:
    req = PublishRequest(row.kind, operational.VERSION, row.data, row.created_at, None, row.id)
    connection = session.connection()
    targets = read_targets(connection, partner.uid, req.type, req.version)
    subscribed = [
        e
        for e in targets.endpoints
        if (e[2] is None and not by_name) or (e[2] is not None and req.type in e[2])
    ]
    if not subscribed:
        return  # nobody there receives it (a pull endpoint reads it from the feed)
    targets = replace(targets, endpoints=subscribed)
    plan = make_plan(
        targets,
        req,
        partner.uid,
        utcnow(),
        lambda name: event_types.versions_of(connection, name),
        max_bytes=settings.max_payload_bytes,
    )
    write_plan(session, redis_client, plan)
