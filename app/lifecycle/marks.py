"""What retention has done, per kind, kept in `retention_marks`: rows purged so far and by
the last run, the last horizon, and the oldest row kept after it.

Written once per kind at the end of a run; read in one statement by `/metrics`, `/ui` and
`kurir db stats`, so showing them costs nothing that grows with the tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import Attempt, AuditRecord, DeadLetter, Event, InboundEvent, RetentionMark
from app.vocabulary import RetentionKind

# Per kind, the table whose oldest row is "the oldest row kept", and its creation column.
OLDEST: dict[RetentionKind, tuple[Any, Any]] = {
    RetentionKind.DEAD_LETTERS: (DeadLetter, DeadLetter.created_at),
    RetentionKind.ATTEMPTS: (Attempt, Attempt.created_at),
    RetentionKind.EVENTS: (Event, Event.created_at),
    RetentionKind.INBOUND: (InboundEvent, InboundEvent.received_at),
    RetentionKind.AUDIT: (AuditRecord, AuditRecord.created_at),
}


@dataclass(frozen=True)
class Mark:
    kind: RetentionKind
    purged_total: int
    last_purged: int
    horizon: datetime | None
    oldest_kept_at: datetime | None
    last_run_at: datetime | None


def oldest_kept(session: Session, kind: RetentionKind) -> datetime | None:
    """When the oldest row of the kind's table was made (ids are creation times: the primary
    key finds it)."""
    model, created = OLDEST[kind]
    found: datetime | None = session.scalar(select(created).order_by(model.id).limit(1))
    return found


def record(
    session: Session, kind: RetentionKind, purged: int, *, horizon: datetime, now: datetime
) -> None:
    """Add one run's figures to the kind's mark."""
    mark = session.get(RetentionMark, kind.value)
    if mark is None:
        mark = RetentionMark(kind=kind.value, purged_total=0, last_purged=0)
        session.add(mark)
    mark.purged_total = int(mark.purged_total or 0) + purged
    mark.last_purged = purged
    mark.horizon = horizon
    mark.last_run_at = now
    mark.oldest_kept_at = oldest_kept(session, kind)
    session.flush()


def read(session: Session) -> list[Mark]:
    """Every kind's mark, in `RetentionKind` order (a kind never purged yet: zeros)."""
    found = {row.kind: row for row in session.scalars(select(RetentionMark))}
    marks = []
    for kind in RetentionKind:
        row = found.get(kind.value)
        if row is None:
            marks.append(Mark(kind, 0, 0, None, None, None))
        else:
            marks.append(
                Mark(
                    kind,
                    int(row.purged_total),
                    int(row.last_purged),
                    row.horizon,
                    row.oldest_kept_at,
                    row.last_run_at,
                )
            )
    return marks
