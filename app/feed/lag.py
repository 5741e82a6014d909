"""How far pull endpoints' consumers are behind: events not acknowledged, since when, and how
many of them lie past the retention horizon.

Counted as each endpoint's feed would show them (its subscription, no `kurir.*` events),
including events committed but not yet given a position: those are certainly after every
acknowledgement. Nothing is left out for its age: an event past retention that the consumer
never acknowledged is still its backlog (its next read answers `410 backlog_expired`), so it
counts, and `expired` says how many such events there are.

Every live pull endpoint's lag is computed in the same three statements (the endpoints; the
numbered events after each one's acknowledgement, per type; the events still waiting for a
position, per partner and type), whatever the number of endpoints: `/metrics` reads them all
on a scrape, and its cost must not grow with them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, case, func, select

from app.event_types import RESERVED_PREFIX
from app.feed.read import OPERATIONAL_TYPES
from app.models import Endpoint, Event, Partner
from app.vocabulary import EndpointMode


@dataclass(frozen=True)
class Lag:
    events: int
    oldest_at: datetime | None  # created_at of the oldest unacknowledged event
    # Of `events`, those created before the retention horizon: the consumer's next read
    # without a cursor is refused with 410 `backlog_expired` until it moves past them.
    expired: int = 0


@dataclass(frozen=True)
class PullLag:
    """One live pull endpoint, its partner's uid and its lag."""

    endpoint_id: str
    partner_uid: str
    lag: Lag


@dataclass
class _Tally:
    events: int = 0
    oldest_at: datetime | None = None
    expired: int = 0

    def add(self, n: int, oldest: datetime | None, expired: int) -> None:
        self.events += n
        self.expired += expired
        if oldest is not None and (self.oldest_at is None or oldest < self.oldest_at):
            self.oldest_at = oldest


def lags(
    connection: Connection, *, horizon: datetime, endpoint_id: str | None = None
) -> list[PullLag]:
    """The lag of every live pull endpoint (or of `endpoint_id` only), by endpoint id."""
    pulls = select(Endpoint.id).where(
        Endpoint.mode == EndpointMode.PULL, Endpoint.deleted_at.is_(None)
    )
    if endpoint_id is not None:
        pulls = pulls.where(Endpoint.id == endpoint_id)
    endpoints = connection.execute(
        select(Endpoint.id, Endpoint.partner_id, Endpoint.event_types, Partner.uid)
        .join(Partner, Partner.id == Endpoint.partner_id)
        .where(Endpoint.id.in_(pulls))
        .order_by(Endpoint.id)
    ).all()
    if not endpoints:
        return []
    columns = (
        Event.type,
        func.count(),
        func.min(Event.created_at),
        func.coalesce(func.sum(case((Event.created_at < horizon, 1), else_=0)), 0),
    )
    mine = ~Event.type.startswith(RESERVED_PREFIX, autoescape=True)
    numbered: dict[str, list[Any]] = defaultdict(list)
    for row in connection.execute(
        select(Endpoint.id, *columns)
        .join(
            Event,
            (Event.partner_id == Endpoint.partner_id)
            & (Event.feed_seq > func.coalesce(Endpoint.acked_seq, 0)),
        )
        .where(Endpoint.id.in_(pulls), mine)
        .group_by(Endpoint.id, Event.type)
    ):
        numbered[row[0]].append(row[1:])
    waiting: dict[str, list[Any]] = defaultdict(list)
    for row in connection.execute(
        select(Event.partner_id, *columns)
        .where(
            Event.feed_seq.is_(None),
            mine,
            Event.partner_id.in_(select(Endpoint.partner_id).where(Endpoint.id.in_(pulls))),
        )
        .group_by(Event.partner_id, Event.type)
    ):
        waiting[row[0]].append(row[1:])
    found = []
    for endpoint_id_, partner_id, event_types, uid in endpoints:
        wanted = None if event_types is None else set(event_types)
        tally = _Tally()
        for type_, n, oldest, expired in (*numbered[endpoint_id_], *waiting[partner_id]):
            if (wanted is None and type_ not in OPERATIONAL_TYPES) or (
                wanted is not None and type_ in wanted
            ):
                tally.add(int(n), oldest, int(expired))
        found.append(PullLag(endpoint_id_, uid, Lag(tally.events, tally.oldest_at, tally.expired)))
    return found


def lag(connection: Connection, endpoint_id: str, *, horizon: datetime) -> Lag:
    """One pull endpoint's lag (no lag at all when it is not a live pull endpoint)."""
    found = lags(connection, horizon=horizon, endpoint_id=endpoint_id)
    return found[0].lag if found else Lag(0, None)
