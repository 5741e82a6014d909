"""One delivery with its attempts, and "try it now" (SPEC §4)."""

from __future__ import annotations

import redis
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
from app.web.api.dead_letters import optional_body, parse_force
from app.web.api.serializers import delivery_json
from app.web.auth import current_principal, require_scope
from app.web.context import runtime
from dlq import resend as resend_mod
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


def _resend_dead(session: Session, connection: redis.Redis, delivery_id: str, *, actor: str,
                 force: bool) -> None:
    """A dead delivery is resent through its open dead letter, so the action is audited there.

    Raises:
        Conflict: `dead_letter_not_open` when no letter is open (discarded, or resent
            already), or what the dead-letter resend refuses (`endpoint_disabled` without
            `force`, `endpoint_deleted`).
    """
    letters = session.execute(
        select(DeadLetter.id, DeadLetter.state)
        .where(DeadLetter.delivery_id == delivery_id)
        .order_by(DeadLetter.id.desc())
    ).all()
    open_ids = [letter_id for letter_id, state in letters if state == DL_OPEN]
    if not open_ids:
        last_id, last_state = letters[0] if letters else (None, None)
        raise Conflict(
            "the delivery is dead and has no open dead letter to resend it from"
            + (f": its dead letter {last_id} was {last_state}" if last_id else ""),
            code=resend_mod.NOT_OPEN,
            details={"delivery": delivery_id, "dead_letter": last_id, "state": last_state})
    resend_mod.resend_one(session, connection, open_ids[0], actor=actor, force=force)


def _make_due(session: Session, connection: redis.Redis, delivery: Delivery) -> None:
    """Bring a waiting delivery forward to now; a succeeded one starts a new run."""
    if delivery.state == SUCCEEDED:
        delivery.run += 1
        delivery.run_attempts = 0
        delivery.succeeded_at = None
        delivery.state = PENDING
    elif delivery.state not in (PENDING, RETRYING):
        raise Conflict(f"a {delivery.state} delivery cannot be retried")
    now = utcnow()
    delivery.next_attempt_at = now
    delivery.lease_expires_at = None
    delivery.updated_at = now
    session.flush()
    enqueue_after_commit(session, connection, [delivery.id],
                         tag=f"r{int(now.timestamp() * 1e6)}")


@blueprint.post("/deliveries/<delivery_id>/retry")
@require_scope("dlq:write")
def retry_delivery(delivery_id: str) -> Response:
    """Make the delivery due now and enqueue it; a succeeded one is sent again as a new run.

    A delivery in flight answers 409; a dead one is resent through its dead letter (audited
    there, refused for a disabled endpoint unless `force`, like the dead-letter resend).
    """
    force = parse_force(optional_body())
    rt = runtime()
    with rt.db.begin() as session:
        delivery = session.get(Delivery, delivery_id, with_for_update=True)
        if delivery is None:
            raise NotFound(f"no delivery {delivery_id!r}", details={"delivery": delivery_id})
        if delivery.state == DELIVERING:
            raise Conflict("the delivery is being attempted right now", code="delivery_in_flight",
                           details={"delivery": delivery_id})
        if delivery.state == DEAD:
            _resend_dead(session, rt.redis, delivery_id, actor=current_principal().name,
                         force=force)
        else:
            _make_due(session, rt.redis, delivery)
    with rt.db.begin() as session:
        response = jsonify(delivery_json(_load(session, delivery_id)))
    response.status_code = 202
    return response
