"""One delivery with its attempts, and "try it now" (SPEC §4)."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify
from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from app.clock import utcnow
from app.errors import Conflict, NotFound
from app.models import (
    DEAD,
    DELIVERING,
    DL_OPEN,
    PENDING,
    RETRYING,
    SUCCEEDED,
    DeadLetter,
    Delivery,
)
from app.web.api.serializers import delivery_json
from app.web.auth import require_scope
from app.web.context import runtime
from sender.dispatch import enqueue_after_commit

blueprint = Blueprint("api_deliveries", __name__)


def _load(session: Session, delivery_id: str) -> Delivery:
    delivery = session.scalar(
        select(Delivery).where(Delivery.id == delivery_id)
        .options(selectinload(Delivery.attempts)))
    if delivery is None:
        raise NotFound(f"no delivery {delivery_id!r}", details={"delivery": delivery_id})
    return delivery


@blueprint.get("/deliveries/<delivery_id>")
@require_scope("read")
def get_delivery(delivery_id: str) -> Response:
    with runtime().db.begin() as session:
        return jsonify(delivery_json(_load(session, delivery_id)))


@blueprint.post("/deliveries/<delivery_id>/retry")
@require_scope("dlq:write")
def retry_delivery(delivery_id: str) -> Response:
    """Make the delivery due now and enqueue it; a succeeded one is sent again as a new run.

    A delivery in flight answers 409; a dead one is resent through its dead letter, so the
    operator action is audited there.
    """
    rt = runtime()
    now = utcnow()
    with rt.db.begin() as session:
        delivery = session.get(Delivery, delivery_id, with_for_update=True)
        if delivery is None:
            raise NotFound(f"no delivery {delivery_id!r}", details={"delivery": delivery_id})
        if delivery.state == DELIVERING:
            raise Conflict("the delivery is being attempted right now", code="delivery_in_flight",
                           details={"delivery": delivery_id})
        if delivery.state == DEAD:
            letter = session.scalar(select(DeadLetter.id).where(
                DeadLetter.delivery_id == delivery_id, DeadLetter.state == DL_OPEN))
            raise Conflict("the delivery is dead: resend its dead letter",
                           code="delivery_dead",
                           details={"delivery": delivery_id, "dead_letter": letter,
                                    "resend": f"/v1/dead-letters/{letter}/resend"
                                    if letter else None})
        if delivery.state == SUCCEEDED:
            delivery.run += 1
            delivery.run_attempts = 0
            delivery.succeeded_at = None
            delivery.state = PENDING
        elif delivery.state not in (PENDING, RETRYING):
            raise Conflict(f"a {delivery.state} delivery cannot be retried")
        delivery.next_attempt_at = now
        delivery.lease_expires_at = None
        delivery.updated_at = now
        session.flush()
        enqueue_after_commit(session, rt.redis, [delivery_id], tag=f"r{int(now.timestamp() * 1e6)}")
    with rt.db.begin() as session:
        response = jsonify(delivery_json(_load(session, delivery_id)))
    response.status_code = 202
    return response
