"""What every list's filter form shares: the choices its pickers offer, and one rule for a
filter value that names nothing.

A partner uid or endpoint id that does not exist (or that the actor may not see) is not an
error page and not a silently empty list: the list answers nothing, the form keeps what was
typed, and the field says why (`unknown`). The operator UI's lists (dead letters,
deliveries, events, endpoints) and the portal's delivery log all go through here.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.errors import NotFound
from app.models import Endpoint, Partner
from app.services import event_types, partners
from app.services.actor import Actor
from app.vocabulary import DeadLetterReason

# A picker lists at most this many choices; past that the face offers a text box.
PICKER_LIMIT = 500


def unknown(
    session: Session, actor: Actor, *, partner: str | None = None, endpoint: str | None = None
) -> dict[str, str]:
    """Field -> message for each value that names nothing the actor may see."""
    errors: dict[str, str] = {}
    if partner:
        try:
            partners.visible(session, actor, partner)
        except NotFound:
            errors["partner"] = f"partner {partner!r} does not exist"
    if endpoint:
        found = session.get(Endpoint, endpoint)
        if found is None or not actor.may_see_partner(found.partner_id):
            errors["endpoint"] = f"endpoint {endpoint!r} does not exist"
    return errors


@dataclass(frozen=True)
class EndpointChoice:
    id: str
    label: str  # partner uid, URL (or "pull") and description


@dataclass(frozen=True)
class Choices:
    """What a filter form's pickers offer; an empty list means "type it instead"."""

    partners: list[Partner]
    endpoints: list[EndpointChoice]
    types: list[str]
    reasons: list[str]


def choices(session: Session, actor: Actor, *, partner: str | None = None) -> Choices:
    """The pickers' choices: partners, the live endpoints (of `partner` when it exists),
    event types and dead-letter reasons."""
    actor.require("read")
    stmt = (
        select(Endpoint, Partner.uid)
        .join(Partner, Partner.id == Endpoint.partner_id)
        .where(Endpoint.deleted_at.is_(None))
        .order_by(Partner.uid, Endpoint.url, Endpoint.id)
        .limit(PICKER_LIMIT + 1)
    )
    if actor.partner_id is not None:
        stmt = stmt.where(Endpoint.partner_id == actor.partner_id)
    elif partner:
        stmt = stmt.where(Partner.uid == partner)
    rows = session.execute(stmt).all()
    shown_uid = actor.partner_id is None
    endpoints = [
        EndpointChoice(
            ep.id,
            " — ".join(
                part
                for part in (
                    uid if shown_uid else "",
                    ep.url or f"pull {ep.id}",
                    ep.description or "",
                )
                if part
            ),
        )
        for ep, uid in rows
    ]
    return Choices(
        partners=partners.choices(session, actor, PICKER_LIMIT),
        endpoints=[] if len(endpoints) > PICKER_LIMIT else endpoints,
        types=[entry.name for entry in event_types.catalog(session, actor)],
        reasons=[str(r) for r in DeadLetterReason],
    )
