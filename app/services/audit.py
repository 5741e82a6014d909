"""The audit trail: one row per state change, whichever face made it.

Services call `record` inside the caller's transaction, so a change and its audit row commit
or roll back together.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import AuditRecord
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
