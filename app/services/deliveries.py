"""One delivery with its attempts, and "try it now".

A dead delivery is resent through its open dead letter, so the action is audited there like
any resend; a waiting one is brought forward; a succeeded one is sent again as a new run.
"""

from __future__ import annotations

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
    Endpoint,
)
from app.runtime import Runtime
from app.services import audit, dead_letters
from app.services.actor import Actor
from dlq import resend as resend_mod
from sender.dispatch import enqueue_after_commit


def _not_found(delivery_id: str) -> NotFound:
    return NotFound(f"no delivery {delivery_id!r}", details={"delivery": delivery_id})


def _partner_of(session: Session, delivery: Delivery) -> str:
    return session.scalar(select(Endpoint.partner_id)
                          .where(Endpoint.id == delivery.endpoint_id)) or ""


def get(session: Session, actor: Actor, delivery_id: str) -> Delivery:
    actor.require("read")
    delivery = session.scalar(select(Delivery).where(Delivery.id == delivery_id)
                              .options(selectinload(Delivery.attempts)))
    if delivery is None or not actor.may_see_partner(_partner_of(session, delivery)):
        raise _not_found(delivery_id)
    return delivery


def retry(session: Session, rt: Runtime, actor: Actor, delivery_id: str, *,
          force: bool = False) -> None:
    """Make the delivery due now and enqueue it after the caller commits.

    Raises:
        NotFound: no such delivery (or not the actor's partner's).
        Conflict: `delivery_in_flight`; for a dead one, what a dead-letter resend refuses
            (`dead_letter_not_open`, `endpoint_disabled` without `force`, `endpoint_deleted`).
    """
    actor.require("dlq:write")
    delivery = session.get(Delivery, delivery_id, with_for_update=True)
    if delivery is None or not actor.may_see_partner(_partner_of(session, delivery)):
        raise _not_found(delivery_id)
    if delivery.state == DELIVERING:
        raise Conflict("the delivery is being attempted right now", code="delivery_in_flight",
                       details={"delivery": delivery_id})
    if delivery.state == DEAD:
        _resend_dead(session, rt, actor, delivery_id, force=force)
        return
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
    audit.record(session, actor, "delivery.retried", "delivery", delivery.id,
                 partner_id=_partner_of(session, delivery), run=delivery.run)
    enqueue_after_commit(session, rt.redis, [delivery.id], tag=f"r{int(now.timestamp() * 1e6)}")


def _resend_dead(session: Session, rt: Runtime, actor: Actor, delivery_id: str, *,
                 force: bool) -> None:
    letters = session.execute(
        select(DeadLetter.id, DeadLetter.state).where(DeadLetter.delivery_id == delivery_id)
        .order_by(DeadLetter.id.desc())).all()
    open_ids = [letter_id for letter_id, state in letters if state == DL_OPEN]
    if not open_ids:
        last_id, last_state = letters[0] if letters else (None, None)
        raise Conflict(
            "the delivery is dead and has no open dead letter to resend it from"
            + (f": its dead letter {last_id} was {last_state}" if last_id else ""),
            code=resend_mod.NOT_OPEN,
            details={"delivery": delivery_id, "dead_letter": last_id, "state": last_state})
    dead_letters.resend_one(session, rt, actor, open_ids[0], force=force)
