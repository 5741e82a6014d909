"""The audit trail: one row per state change, whichever face made it.

Services call `record` inside the caller's transaction, so a change and its audit row commit
or roll back together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import ApiKey, AuditRecord, PortalLink
from app.pagination import paginate
from app.services.actor import Actor

MAX_PAGE = 250


def record(
    session: Session,
    actor: Actor,
    action: str,
    subject_type: str,
    subject_id: str,
    *,
    partner_id: str | None = None,
    **details: Any,
) -> AuditRecord:
    """Write one audit row; `details` must be JSON and must never hold a secret.

    A portal session's changes name the session, so an operator can tell which magic link
    (and so who handed it out) they came through.
    """
    if actor.session_id is not None:
        details.setdefault("session", actor.session_id)
    row = AuditRecord(
        actor=str(actor)[:320],
        actor_partner_id=actor.partner_id,
        action=action,
        subject_type=subject_type,
        subject_id=subject_id,
        partner_id=partner_id,
        details=details,
    )
    session.add(row)
    return row


def search(
    session: Session,
    actor: Actor,
    *,
    subject_id: str | None = None,
    action: str | None = None,
    partner_id: str | None = None,
    actor_prefix: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> tuple[list[AuditRecord], str | None]:
    """Newest first; a partner-bound actor sees only what concerns its partner.

    `partner_id` narrows to one partner's records, `actor_prefix` to one kind of actor
    (`portal:` for everything done through the partner portal).
    """
    actor.require("read")
    stmt = select(AuditRecord)
    if actor.partner_id is not None:
        stmt = stmt.where(AuditRecord.partner_id == actor.partner_id)
    if partner_id is not None:
        stmt = stmt.where(AuditRecord.partner_id == partner_id)
    if actor_prefix:
        stmt = stmt.where(AuditRecord.actor.startswith(actor_prefix, autoescape=True))
    if subject_id:
        stmt = stmt.where(AuditRecord.subject_id == subject_id)
    if action:
        stmt = stmt.where(AuditRecord.action == action)
    return paginate(session, stmt, AuditRecord.id, limit=min(limit, MAX_PAGE), cursor=cursor)


@dataclass(frozen=True)
class Shown:
    """An audit row as one reader may see it: actor names masked for partners."""

    id: str
    actor: str
    action: str
    subject_type: str
    subject_id: str
    details: dict[str, Any]
    created_at: datetime


# Details that name an actor, and how to find the partner that actor was bound to.
_LINK_CREATOR = "link_created_by"


def shown(session: Session, reader: Actor, rows: Sequence[AuditRecord]) -> list[Shown]:
    """The rows as `reader` is shown them: who acted, and who made the link a portal session
    came through (`link_created_by`), read through `Actor.shows` — a partner sees its own
    credentials by name and the publisher's people and keys as "publisher"."""
    creators: dict[str, str | None] = {}
    link_ids = [
        str(row.details["link"])
        for row in rows
        if reader.bound_to_partner
        and _LINK_CREATOR in (row.details or {})
        and (row.details or {}).get("link")
    ]
    if link_ids:
        # The link's minting key says whose it was; an operator's link has no key.
        creators = {
            link_id: partner_id
            for link_id, partner_id in session.execute(
                select(PortalLink.id, ApiKey.partner_id)
                .outerjoin(ApiKey, ApiKey.id == PortalLink.key_id)
                .where(PortalLink.id.in_(link_ids))
            )
        }
    views = []
    for row in rows:
        details = dict(row.details or {})
        if _LINK_CREATOR in details:
            details[_LINK_CREATOR] = reader.shows(
                str(details[_LINK_CREATOR]), creators.get(str(details.get("link")))
            )
        views.append(
            Shown(
                row.id,
                reader.shows(row.actor, row.actor_partner_id),
                row.action,
                row.subject_type,
                row.subject_id,
                details,
                row.created_at,
            )
        )
    return views
