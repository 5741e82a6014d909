"""One page of a partner's feed, as the published version or as one endpoint receives it.

Every item is the exact body a push of that event sends (the stored payload), so a consumer
parses pulled and pushed events alike. Kurir's own `kurir.*` events (a test sent to one
endpoint) are not in any feed.

Seen through an endpoint, the feed holds the types it subscribes to now, each in the version
it is pinned to now when the event is stored in that version (the publish stores the version
every pinned endpoint, push or pull, needs); an event published before the pin, and not
stored in the pinned version, comes in the version published, as it would have been pushed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from app.event_types import RESERVED_PREFIX
from app.feed.sequencer import head
from app.models import Event, EventVersion
from app.vocabulary import OperationalEventType


@dataclass(frozen=True)
class Subscriber:
    """What an endpoint receives: its subscribed types (None: all) and version pins."""

    event_types: list[str] | None
    versions: dict[str, Any] | None


@dataclass(frozen=True)
class Page:
    payloads: list[str]
    # The position to read after next time: the last event returned, or, when the page was
    # not full, the head seen before reading (everything up to it has been looked at).
    position: int


OPERATIONAL_TYPES = tuple(t.value for t in OperationalEventType)


def page(
    connection: Connection,
    partner_id: str,
    *,
    after: int | None,
    limit: int,
    not_before: datetime | None,
    subscriber: Subscriber | None = None,
) -> Page:
    """Up to `limit` events after position `after` (from the start without one), in feed
    order, leaving out those created before `not_before` (past retention) when given.

    The head is read first: a later statement sees at least every position up to it, so when
    the page is not full the consumer can move there without skipping anything.
    """
    seen_head = head(connection)
    stmt = (
        select(Event.feed_seq, Event.id, Event.type, Event.version, Event.payload)
        .where(
            Event.partner_id == partner_id,
            Event.feed_seq > (after or 0),
            ~Event.type.startswith(RESERVED_PREFIX, autoescape=True),
        )
        .order_by(Event.feed_seq)
        .limit(limit)
    )
    if not_before is not None:
        stmt = stmt.where(Event.created_at >= not_before)
    if subscriber is not None and subscriber.event_types is not None:
        stmt = stmt.where(Event.type.in_(subscriber.event_types))
    elif subscriber is not None:
        # Subscribed to everything is not subscribed to Kurir's operational events: those
        # reach the endpoints that name them.
        stmt = stmt.where(Event.type.not_in(OPERATIONAL_TYPES))
    rows = list(connection.execute(stmt).all())
    payloads = [row.payload for row in rows]
    if subscriber is not None and subscriber.versions:
        payloads = _pinned(connection, rows, subscriber.versions, payloads)
    if len(rows) == limit:
        position = int(rows[-1].feed_seq)
    else:
        position = max([seen_head, after or 0, *(int(r.feed_seq) for r in rows[-1:])])
    return Page(payloads, position)


def _pinned(
    connection: Connection, rows: list[Any], pins: dict[str, Any], payloads: list[str]
) -> list[str]:
    """Swap in the stored version a pin asks for, where there is one."""
    wanted = {
        (row.id, int(pins[row.type]))
        for row in rows
        if row.type in pins and int(pins[row.type]) != row.version
    }
    if not wanted:
        return payloads
    found = {
        (event_id, version): payload
        for event_id, version, payload in connection.execute(
            select(EventVersion.event_id, EventVersion.version, EventVersion.payload).where(
                EventVersion.event_id.in_({event_id for event_id, _ in wanted})
            )
        )
    }
    return [
        found.get((row.id, int(pins.get(row.type, row.version))), payload)
        for row, payload in zip(rows, payloads, strict=True)
    ]
