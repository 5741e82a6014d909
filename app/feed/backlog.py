"""A pull endpoint's expired backlog: the events it never acknowledged that were created
before the retention horizon.

Retention promises events for `KURIR_RETAIN_EVENTS_DAYS`; a consumer whose acknowledgement lies
further back than that has lost the promise for those events. Reading on as if nothing had
happened would skip them silently (and once they are purged, for good), so its reads without
a cursor are refused (`410 backlog_expired`, with how many, the oldest one and the horizon)
until it moves past them on purpose: acknowledging a later cursor, or `skip-expired`.

It is computed from the events the endpoint has not acknowledged, never from the absence of
rows: a pull endpoint's unacknowledged backlog is not finished history, so retention keeps
these rows until the endpoint acknowledges or skips past them. One case reaches behind a
purge all the same: an endpoint whose subscription widened to types already purged past its
acknowledgement. The purge horizon of its feed (`app.feed.horizon`) then counts as expired
too, up to the highest position purged, so it is refused and skips past them as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, func, select

from app.event_types import RESERVED_PREFIX
from app.feed.horizon import Purged
from app.feed.read import OPERATIONAL_TYPES
from app.models import Event


@dataclass(frozen=True)
class ExpiredBacklog:
    # Events of the endpoint's feed between its acknowledgement and `through`: what moving
    # past the expired events skips (an event committed late can sit among them by position
    # while being a few seconds younger than the horizon; it is counted, since it is skipped).
    skipped: int
    # The first of them in feed order, where the consumer stopped (None: all of them purged).
    oldest_event: str | None
    oldest_at: datetime | None
    # The highest position of an expired event: an acknowledgement there moves past every
    # one of them, and every later position of the feed is within retention.
    through: int
    horizon: datetime


def expired(
    connection: Connection,
    partner_id: str,
    event_types: list[str] | None,
    acked_seq: int | None,
    *,
    horizon: datetime,
    purged: Purged | None = None,
) -> ExpiredBacklog | None:
    """What of the endpoint's feed after `acked_seq` lies past `horizon`, or was purged
    (`purged`: how far retention purged the endpoint's types), None: nothing.

    Three statements on the partner's feed index, from the acknowledgement on.
    """
    feed = [
        Event.partner_id == partner_id,
        Event.feed_seq > (acked_seq or 0),
        ~Event.type.startswith(RESERVED_PREFIX, autoescape=True),
    ]
    if event_types is not None:
        feed.append(Event.type.in_(event_types))
    else:
        feed.append(Event.type.not_in(OPERATIONAL_TYPES))
    through = connection.execute(
        select(func.max(Event.feed_seq)).where(*feed, Event.created_at < horizon)
    ).scalar()
    if purged is not None and purged.seq > (acked_seq or 0):
        through = max(int(through or 0), purged.seq)
        # What is gone went under the purge's horizon: the one the consumer needs to see.
        horizon = max(horizon, purged.horizon)
    if through is None:
        return None
    skipped = connection.execute(
        select(func.count()).where(*feed, Event.feed_seq <= through)
    ).scalar_one()
    oldest = connection.execute(
        select(Event.id, Event.created_at)
        .where(*feed, Event.feed_seq <= through)
        .order_by(Event.feed_seq)
        .limit(1)
    ).first()
    return ExpiredBacklog(
        int(skipped),
        oldest.id if oldest else None,
        oldest.created_at if oldest else None,
        int(through),
        horizon,
    )
