"""Parking a delivery: it stops being tried and becomes an open dead letter an operator sees.

Used when retries run out, when an endpoint is disabled, and when an event is published to an
endpoint that is already disabled. The caller owns the transaction.

A delivery whose retries ran out records the operational event `delivery.exhausted` (and
`ordering.key_blocked` when it now holds an ordering key: `sender.ordering.report_blocked`);
one parked because its endpoint is disabled records nothing of its own, the endpoint's
`endpoint.disabled` tells of them all.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from app import operational
from app.clock import utcnow
from app.ids import new_id
from app.models import DeadLetter, DeadLetterAudit, Delivery, Endpoint, Event
from app.vocabulary import (
    DeadLetterReason,
    DeadLetterState,
    DeliveryState,
    OperationalEventType,
)
from sender import ordering

SYSTEM_ACTOR = "system"


def park(
    session: Session,
    delivery: Delivery,
    event: Event,
    endpoint: Endpoint,
    reason: DeadLetterReason,
    last_status_code: int | None = None,
    last_error: str | None = None,
) -> DeadLetter:
    """Make `delivery` dead and open its (one) dead letter, audited as a system action.

    `search_text` holds the exact payload, so `q` searches what the partner would have got.

    Raises:
        ValueError: `reason` is not a `DeadLetterReason` (checked before anything is written,
            so the reasons an operator can filter by are exactly the ones ever written).
    """
    reason = DeadLetterReason(reason)
    now = utcnow()
    if last_status_code is None:
        last_status_code = delivery.last_status_code
    if last_error is None:
        last_error = delivery.last_error
    delivery.state = DeliveryState.DEAD
    delivery.next_attempt_at = None
    delivery.lease_expires_at = None
    delivery.last_status_code = last_status_code
    delivery.last_error = last_error
    delivery.updated_at = now
    letter = DeadLetter(
        id=new_id("dl"),
        delivery=delivery,
        event_id=event.id,
        endpoint_id=endpoint.id,
        partner_id=event.partner_id,
        event_type=event.type,
        reason=reason,
        last_status_code=last_status_code,
        last_error=last_error,
        search_text=event.payload,
        state=DeadLetterState.OPEN,
        created_at=now,
        updated_at=now,
    )
    session.add(letter)
    session.add(
        DeadLetterAudit(
            dead_letter=letter, actor=SYSTEM_ACTOR, action="park", outcome=reason, created_at=now
        )
    )
    if reason == DeadLetterReason.RETRIES_EXHAUSTED:
        operational.about_delivery(
            session,
            OperationalEventType.DELIVERY_EXHAUSTED,
            event,
            endpoint,
            {
                "event": event.id,
                "event_type": event.type,
                "version": delivery.version if delivery.version is not None else event.version,
                "delivery": delivery.id,
                "dead_letter": letter.id,
                "reason": reason.value,
                "attempts": delivery.attempt_count,
                "last_status_code": last_status_code,
                "last_error": last_error,
            },
            now=now,
        )
        ordering.report_blocked(session, delivery, event, endpoint, letter)
    return letter
