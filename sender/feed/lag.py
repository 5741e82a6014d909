"""How far a pull endpoint's consumer is behind: events it has not acknowledged, and since when.

Counted as the endpoint's feed would show them (its subscription, no `kurir.*` events, only
what is within retention), including events committed but not yet given a position: those
are certainly after the acknowledged one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, func, select

from app.contracts import RESERVED_PREFIX
from app.models import Event


@dataclass(frozen=True)
class Lag:
    events: int
    oldest_at: datetime | None  # created_at of the oldest unacknowledged event


def lag(connection: Connection, partner_id: str, event_types: list[str] | None,
        acked_seq: int | None, *, not_before: datetime) -> Lag:
    """Two index-backed counts: the numbered events after the acknowledged position, and the
    ones still waiting for a number."""
    base = (select(func.count(), func.min(Event.created_at))
            .where(Event.partner_id == partner_id, Event.created_at >= not_before,
                   ~Event.type.startswith(RESERVED_PREFIX, autoescape=True)))
    if event_types is not None:
        base = base.where(Event.type.in_(event_types))
    numbered = connection.execute(base.where(Event.feed_seq > (acked_seq or 0))).one()
    waiting = connection.execute(base.where(Event.feed_seq.is_(None))).one()
    oldest = [t for t in (numbered[1], waiting[1]) if t is not None]
    return Lag(int(numbered[0]) + int(waiting[0]), min(oldest) if oldest else None)
