"""Discarding a dead letter: the operator decides it will never be resent, and says why."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import insert, update
from sqlalchemy.orm import Session

from app.clock import utcnow
from app.errors import Conflict, NotFound
from app.models import DL_DISCARDED, DL_OPEN, DeadLetter, DeadLetterAudit
from app.vocabulary import ResendSkip
from dlq.audit import audit_row

MAX_NOTE_LENGTH = 2000


def discard(
    session: Session,
    letter_id: str,
    *,
    actor: str,
    note: str | None = None,
    now: datetime | None = None,
    actor_partner_id: str | None = None,
) -> DeadLetter:
    """Close an open letter as `discarded`, keeping the note on the letter and in its audit.

    Raises:
        NotFound: no such letter.
        Conflict: `dead_letter_not_open` when it was already resent or discarded.
    """
    now = now or utcnow()
    note = (note or "").strip()[:MAX_NOTE_LENGTH] or None
    letter = session.get(DeadLetter, letter_id)
    if letter is None:
        raise NotFound(f"dead letter {letter_id} not found")
    # Conditional, like a resend: a discard racing a resend cannot undo it, nor vice versa.
    flipped = session.execute(
        update(DeadLetter)
        .where(DeadLetter.id == letter_id, DeadLetter.state == DL_OPEN)
        .values(state=DL_DISCARDED, note=note, resolved_at=now, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    if not flipped.rowcount:  # type: ignore[attr-defined]
        session.refresh(letter)
        raise Conflict(
            f"dead letter {letter_id} is {letter.state}, not open",
            code=ResendSkip.NOT_OPEN,
            details={"dead_letter": letter_id, "state": letter.state},
        )
    session.execute(
        insert(DeadLetterAudit),
        [
            audit_row(
                letter_id,
                actor,
                "discard",
                "discarded",
                now,
                note,
                actor_partner_id=actor_partner_id,
            )
        ],
    )
    session.expire(letter)
    return letter
