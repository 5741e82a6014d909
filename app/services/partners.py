"""Partners: create, read, list — and the one place that decides whether an actor sees one.

Every service that takes a partner uid goes through `visible`, so a partner-bound actor
(a partner key, the portal) meets `404 not_found` for any other partner, exactly as if it did
not exist.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.errors import Forbidden, NotFound
from app.models import Partner
from app.pagination import paginate
from app.registry import partners as rules
from app.services import audit
from app.services.actor import Actor


def _not_found(uid: str) -> NotFound:
    return NotFound(f"partner {uid!r} does not exist", details={"uid": uid})


def visible(session: Session, actor: Actor, uid: str, scope: str = "read") -> Partner:
    """The partner `uid` if the actor holds `scope` and may see it; else 403 / 404."""
    actor.require(scope)
    partner = session.scalar(select(Partner).where(Partner.uid == uid))
    if partner is None or not actor.may_see_partner(partner.id):
        raise _not_found(uid)
    return partner


def by_id(session: Session, actor: Actor, partner_id: str, scope: str = "read") -> Partner:
    """The partner by its id (rows carry the id, pages link the uid), as `visible` decides."""
    actor.require(scope)
    partner = session.get(Partner, partner_id)
    if partner is None or not actor.may_see_partner(partner.id):
        raise NotFound(f"partner {partner_id!r} does not exist", details={"id": partner_id})
    return partner


def create(session: Session, actor: Actor, body: dict[str, Any]) -> Partner:
    actor.require("endpoints:write")
    if actor.bound_to_partner:
        raise NotFound("not found")
    partner = rules.create_partner(session, body)
    audit.record(
        session,
        actor,
        "partner.created",
        "partner",
        partner.id,
        partner_id=partner.id,
        uid=partner.uid,
        name=partner.name,
    )
    return partner


def update(session: Session, actor: Actor, uid: str, body: dict[str, Any]) -> Partner:
    """Change a partner's name or its operational-events opt-in. A partner-bound actor (its
    key, its portal) may change only its own opt-in: the name is the publisher's."""
    partner = visible(session, actor, uid, "endpoints:write")
    if actor.bound_to_partner and set(body) - {"operational_events"}:
        raise Forbidden(
            "a partner may change only its operational_events opt-in",
            details={"fields": sorted(set(body) - {"operational_events"})},
        )
    changed = rules.update_partner(session, partner, body)
    if changed:
        audit.record(
            session,
            actor,
            "partner.updated",
            "partner",
            partner.id,
            partner_id=partner.id,
            **changed,
        )
    return partner


def set_operational_events(session: Session, actor: Actor, uid: str, on: bool) -> Partner:
    """The opt-in toggle of the UI and the portal."""
    return update(session, actor, uid, {"operational_events": on})


def get(session: Session, actor: Actor, uid: str) -> Partner:
    return visible(session, actor, uid)


def page(
    session: Session, actor: Actor, *, limit: int, cursor: str | None
) -> tuple[list[Partner], str | None]:
    actor.require("read")
    stmt = select(Partner)
    if actor.partner_id is not None:
        stmt = stmt.where(Partner.id == actor.partner_id)
    return paginate(session, stmt, Partner.id, limit=limit, cursor=cursor)


def uids(session: Session, partner_ids: set[str]) -> dict[str, str]:
    """Partner id → uid, for rendering rows that carry only the id."""
    if not partner_ids:
        return {}
    return dict(
        session.execute(select(Partner.id, Partner.uid).where(Partner.id.in_(partner_ids))).all()
    )


# A picker lists at most this many partners; past that the face falls back to typing.
CHOICES_LIMIT = 500


def choices(session: Session, actor: Actor, limit: int = CHOICES_LIMIT) -> list[Partner]:
    """The partners a filter's picker offers, by uid (empty when there are more than
    `limit`: a picker that long helps nobody, and the face offers a text box)."""
    actor.require("read")
    stmt = select(Partner).order_by(Partner.uid).limit(limit + 1)
    if actor.partner_id is not None:
        stmt = stmt.where(Partner.id == actor.partner_id)
    rows = list(session.scalars(stmt))
    return [] if len(rows) > limit else rows
