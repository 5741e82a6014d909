"""An endpoint answers again: re-enable it and replay, in publish order, what it parked.

`endpoint_recovered` is the one place a recovery happens (a probe's 2xx calls it); whatever
else must follow a recovery hooks in here.
"""

from __future__ import annotations

import logging
from datetime import datetime

import redis
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app import operational
from app.clock import isoformat
from app.models import (
    DEAD,
    DL_OPEN,
    RETRYING,
    AuditRecord,
    DeadLetter,
    Delivery,
    Endpoint,
    Event,
    ResendJob,
)
from app.vocabulary import EndpointState, OperationalEventType
from dlq.resend import start_bulk, start_ordered
from dlq.search import DeadLetterFilter

log = logging.getLogger(__name__)

RECOVERED_EVENT = OperationalEventType.ENDPOINT_RECOVERED.value
ACTOR = "kurir:recovery"
PURPOSE = "recovery"


def parked_filter(endpoint_id: str, since: datetime | None) -> DeadLetterFilter:
    """The open letters the endpoint parked since it was disabled."""
    return DeadLetterFilter(endpoint=endpoint_id, state=DL_OPEN, since=since)


def endpoint_recovered(
    session: Session,
    endpoint: Endpoint,
    *,
    now: datetime,
    redis: redis.Redis | None,
    probe_id: str | None = None,
) -> ResendJob | None:
    """Re-enable a failure-disabled endpoint that answered a probe with a 2xx, record
    `endpoint.recovered` (an operational event, published to whoever listens, and an audit
    row with the probe's details) and start one ordered resend of every open letter it
    parked since it was disabled; that job, or None when nothing was
    parked. Runs in the caller's transaction; the resend job is enqueued after commit.
    """
    since = endpoint.disabled_at
    was_reason = endpoint.disabled_reason
    endpoint.state = EndpointState.ENABLED
    endpoint.disabled_reason = None
    endpoint.disabled_at = None
    endpoint.disabled_by = None
    endpoint.consecutive_failures = 0
    endpoint.first_failure_at = None
    endpoint.last_success_at = now
    endpoint.probe_next_at = None
    probes = endpoint.probe_count
    endpoint.probe_count = 0
    session.flush()
    flt = parked_filter(endpoint.id, since)
    parked = session.scalar(
        select(func.count())
        .select_from(DeadLetter)
        .where(
            DeadLetter.endpoint_id == endpoint.id,
            DeadLetter.state == DL_OPEN,
            *([DeadLetter.created_at >= since] if since is not None else []),
        )
    )
    job = None
    if parked:
        job = start_bulk(
            session, actor=ACTOR, flt=flt, connection=redis, ordered=True, purpose=PURPOSE
        )
    details = {
        "was_disabled_at": isoformat(since),
        "was_disabled_because": was_reason,
        "probes": probes,
        "probe": probe_id,
        "parked": int(parked or 0),
        "replay": job.id if job is not None else None,
    }
    operational.about_endpoint(
        session,
        OperationalEventType.ENDPOINT_RECOVERED,
        endpoint,
        {
            "reason": "probe_succeeded",
            "disabled_at": isoformat(since),
            "recovered_at": isoformat(now),
            "replayed": details["parked"],
        },
        now=now,
    )
    session.add(
        AuditRecord(
            actor=ACTOR,
            action=RECOVERED_EVENT,
            subject_type="endpoint",
            subject_id=endpoint.id,
            partner_id=endpoint.partner_id,
            details=details,
            created_at=now,
        )
    )
    session.flush()
    log.warning("endpoint recovered", extra={"endpoint_id": endpoint.id, **details})
    return job


# ------------------------------------------------------------------------- recover since T

WINDOW_PURPOSE = "recover_window"
MAX_ITEMS = 100_000


def window_items(
    session: Session, endpoint_id: str, since: datetime, until: datetime | None
) -> list[str]:
    """What of the endpoint's deliveries in the window (by publish time) did not succeed, in
    publish order: the open dead letter of each dead delivery, and each delivery still
    retrying. Succeeded ones, those under way, and dead ones whose letter was discarded or
    already resent are left out."""
    where = [
        Delivery.endpoint_id == endpoint_id,
        Delivery.state.in_((RETRYING, DEAD)),
        Event.created_at >= since,
    ]
    if until is not None:
        where.append(Event.created_at < until)
    rows = session.execute(
        select(Delivery.id, Delivery.state, DeadLetter.id)
        .join(Event, Event.id == Delivery.event_id)
        .outerjoin(
            DeadLetter,
            (DeadLetter.delivery_id == Delivery.id) & (DeadLetter.state == DL_OPEN),
        )
        .where(*where)
        .order_by(Event.created_at, Event.id, Delivery.id)
        .limit(MAX_ITEMS)
    ).all()
    items: list[str] = []
    for delivery_id, state, letter_id in rows:
        if state == RETRYING:
            items.append(delivery_id)
        elif letter_id is not None:
            items.append(letter_id)
    return items


def start_window(
    session: Session,
    endpoint: Endpoint,
    since: datetime,
    until: datetime | None,
    *,
    actor: str,
    redis: redis.Redis | None,
    key_id: str | None = None,
    actor_partner_id: str | None = None,
) -> ResendJob:
    """One ordered resend of everything of the endpoint in the window that did not succeed;
    a second run over the same window finds only what has failed again since."""
    items = window_items(session, endpoint.id, since, until)
    return start_ordered(
        session,
        items,
        actor=actor,
        purpose=WINDOW_PURPOSE,
        connection=redis,
        key_id=key_id,
        actor_partner_id=actor_partner_id,
        details={
            "endpoint": endpoint.id,
            "since": isoformat(since),
            "until": isoformat(until),
        },
    )
