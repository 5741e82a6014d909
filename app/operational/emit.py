"""Recording an operational event where it happens, in the caller's transaction.

`emit` writes the event to the `operational_events` outbox (the UI shows it from there too);
once the caller commits, a job publishes it through the intake
(`app.intake.operational`) to the operator endpoints and, opted in, the partner's own. The
scheduler publishes whatever a lost job left behind. Publishing is thus a side channel: it can
never fail, slow or roll back the transaction that disabled an endpoint or parked a delivery.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app import runtime
from app.clock import utcnow
from app.db import after_commit
from app.event_types import is_reserved
from app.models import Endpoint, Event, OperationalEvent, Partner
from app.operational.catalog import NAMES
from app.operational.destinations import (
    is_operational_only,
    operator_listens,
    operator_partner,
)
from app.queues import DEFAULT, OPERATIONAL_PUBLISH, JobSpec, try_enqueue_many
from app.vocabulary import OperationalEventType

log = logging.getLogger(__name__)


def emit(
    session: Session,
    type_: str,
    data: dict[str, Any],
    *,
    partner: str | None,
    now: datetime | None = None,
    publish: bool = True,
    unheard: bool = True,
) -> OperationalEvent | None:
    """Record `type_` with `data` about an endpoint of partner id `partner`; `data` gets the
    partner's uid as `partner` unless it has one. Published after the caller commits, unless
    `publish` is False (the loop guard) or nobody receives it (no operator endpoint, the
    partner not opted in): then it is only shown in the UI, or, with `unheard` False (an
    event per delivery, whose dead letter tells the same), not recorded at all (None).

    Raises:
        ValueError: `type_` is not an operational event type.
    """
    kind = OperationalEventType(type_)
    payload = dict(data)
    subject = session.execute(
        select(Partner.uid, Partner.operational_events).where(Partner.id == partner)
    ).first()
    if subject is not None and "partner" not in payload:
        payload["partner"] = subject.uid
    if publish and not (subject is not None and subject.operational_events):
        # Nobody to send it to (no operator endpoint, partner not opted in): recorded for the
        # UI only, and no job is queued for nothing.
        publish = operator_listens(session)
    if not publish and not unheard:
        return None
    at = now or utcnow()
    row = OperationalEvent(
        kind=kind.value,
        subject_id=payload.get("endpoint"),
        partner_id=partner,
        data=payload,
        created_at=at,
        published_at=None if publish else at,
    )
    session.add(row)
    session.flush()
    row_id = row.id
    if publish:
        after_commit(session, lambda: enqueue_publish(row_id))
    log.info(
        "operational event",
        extra={
            "kind": kind.value,
            "operational_event_id": row_id,
            "endpoint": row.subject_id,
            "published": publish,
        },
    )
    return row


def enqueue_publish(row_id: str) -> bool:
    """Ask a worker to publish the outbox (False: Redis is down; the scheduler will)."""
    spec = JobSpec(DEFAULT, OPERATIONAL_PUBLISH, (row_id,), job_id=f"operational-{row_id}")
    return try_enqueue_many(runtime.current().redis, [spec])


def about_endpoint(
    session: Session,
    type_: str,
    endpoint: Endpoint,
    data: dict[str, Any],
    *,
    now: datetime | None = None,
    unheard: bool = True,
) -> OperationalEvent | None:
    """`emit` an event about `endpoint` (its id and URL added to `data`). The loop guard
    keeps it from being published when the endpoint receives only operational events: it
    is then recorded for the UI alone."""
    operator = operator_partner(session)
    guarded = is_operational_only(endpoint, operator.id if operator is not None else None)
    return emit(
        session,
        type_,
        {"endpoint": endpoint.id, "url": endpoint.url, **data},
        partner=endpoint.partner_id,
        now=now,
        publish=not guarded,
        unheard=unheard,
    )


def about_delivery(
    session: Session,
    type_: str,
    event: Event,
    endpoint: Endpoint,
    data: dict[str, Any],
    *,
    now: datetime | None = None,
) -> OperationalEvent | None:
    """`emit` an event about a delivery of `event` to `endpoint`; None when the loop guard
    holds it back (the event is Kurir's own: an operational event, or a test), or when
    nobody would receive it (its dead letter already shows it in the UI)."""
    if event.type in NAMES or is_reserved(event.type):
        return None
    return about_endpoint(session, type_, endpoint, data, now=now, unheard=False)
