"""How far retention has purged a partner's feed: the purge horizon per event type.

Retention (`app.lifecycle`) deletes finished events, never a pull endpoint's unacknowledged
backlog. A reader holding a cursor behind what was purged, or a pull endpoint whose
acknowledgement lies behind it (its subscription widened after the purge), would otherwise
be served what is left as if nothing were missing. So every purge records, per partner and
event type, the highest feed position it removed and the horizon it removed it under, and
the feed refuses such a read with `410` and that horizon.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, func, insert, select, update

from app.models import FeedPurge


@dataclass(frozen=True)
class Purged:
    """The highest feed position purged among the types asked about, and the latest horizon
    a purge of them ran under."""

    seq: int
    horizon: datetime


def record(
    connection: Connection,
    partner_id: str,
    highest: Mapping[str, int],
    *,
    horizon: datetime,
    now: datetime,
) -> None:
    """Remember that the feed positions up to `highest[type]` of the partner's events of each
    type may be gone (the record only ever moves forward)."""
    if not highest:
        return
    kept = {
        row.event_type: row.purged_seq
        for row in connection.execute(
            select(FeedPurge.event_type, FeedPurge.purged_seq).where(
                FeedPurge.partner_id == partner_id, FeedPurge.event_type.in_(list(highest))
            )
        )
    }
    for event_type, seq in highest.items():
        if event_type not in kept:
            connection.execute(
                insert(FeedPurge).values(
                    partner_id=partner_id,
                    event_type=event_type,
                    purged_seq=seq,
                    horizon=horizon,
                    purged_at=now,
                )
            )
        else:
            connection.execute(
                update(FeedPurge)
                .where(FeedPurge.partner_id == partner_id, FeedPurge.event_type == event_type)
                .values(purged_seq=max(seq, int(kept[event_type])), horizon=horizon, purged_at=now)
            )


def purged(connection: Connection, partner_id: str, event_types: list[str] | None) -> Purged | None:
    """How far the partner's feed, as these types (None: all), has been purged (None: never)."""
    stmt = select(func.max(FeedPurge.purged_seq), func.max(FeedPurge.horizon)).where(
        FeedPurge.partner_id == partner_id
    )
    if event_types is not None:
        stmt = stmt.where(FeedPurge.event_type.in_(event_types))
    seq, horizon = connection.execute(stmt).one()
    if seq is None:
        return None
    return Purged(int(seq), horizon)
