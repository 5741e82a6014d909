"""A `kurir.test` event to one endpoint, through the normal delivery path.

The event is an ordinary row (its payload is the exact body sent, as for any publish) with one
ordinary delivery to the chosen endpoint, whatever the endpoint subscribes to; the engine then
signs, sends, retries, records attempts and parks it like any other, and like any other it is
not sent to a disabled endpoint (the service refuses a test to one). The contract belongs to
Kurir (`app.event_types.TEST_EVENT`), and the publish API refuses it.
"""

from __future__ import annotations

from datetime import datetime

import redis
from sqlalchemy.orm import Session

from app import event_types
from app.clock import utcnow
from app.errors import ValidationFailed
from app.ids import new_id
from app.intake.envelope import PublishRequest, payload_json
from app.models import PENDING, Delivery, Endpoint, Event, Partner
from app.queues import enqueue_after_commit
from sender.dispatch import job_specs

MESSAGE = "This is a test event from Kurir. If you can read it, your endpoint works."


def send_test_event(
    session: Session,
    redis_client: redis.Redis,
    partner: Partner,
    endpoint: Endpoint,
    *,
    sent_by: str,
    now: datetime | None = None,
) -> Delivery:
    """Write the event and its one delivery; enqueue it once the caller commits.

    `sent_by` is written into the event's data, which the partner receives: the caller
    passes the name the partner may be shown.
    """
    now = now or utcnow()
    contract = event_types.ensure_test_contract(session)
    data = {"message": MESSAGE, "endpoint": endpoint.id, "sent_by": sent_by[:200]}
    errors = event_types.data_errors(event_types.compile_schema(contract.schema), data)
    if errors:  # Kurir's own schema and data disagree: a bug, said plainly rather than sent
        raise ValidationFailed(
            "the test event does not match its own schema",
            code="schema_validation_failed",
            details=errors,
        )
    event_id = new_id("evt")
    request = PublishRequest(
        event_types.TEST_EVENT, event_types.TEST_EVENT_VERSION, data, now, None, None
    )
    event = Event(
        id=event_id,
        partner_id=partner.id,
        type=request.type,
        version=request.version,
        data=data,
        payload=payload_json(event_id, request, partner.uid, now),
        occurred_at=now,
        created_at=now,
    )
    delivery = Delivery(
        id=new_id("dlv"),
        event_id=event_id,
        endpoint_id=endpoint.id,
        state=PENDING,
        attempt_count=0,
        run_attempts=0,
        run=1,
        forced=False,
        next_attempt_at=now,
        created_at=now,
        updated_at=now,
    )
    session.add(event)
    session.flush()
    session.add(delivery)
    session.flush()
    enqueue_after_commit(session, redis_client, job_specs([delivery.id], tag="t"))
    return delivery
