"""The feed and pull endpoints: who may read which feed, acknowledging, and lag.

The mechanism (positions given after commit, cursors, pages) is `sender.feed`; this module
decides what an actor may read and acknowledge. A feed is read with `read` (admin and read
keys, operators, and that partner's own partner keys and portal); an acknowledgement needs
`endpoints:write`. Acknowledgements are not written to the audit trail: a consumer makes one
per page, and the endpoint keeps the last one (`acked_seq`, `acked_at`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.clock import utcnow
from app.config import Settings
from app.errors import Conflict, ValidationFailed
from app.models import Endpoint, Partner
from app.runtime import Runtime
from app.services import endpoints as endpoint_service
from app.services import partners
from app.services.actor import Actor
from sender.feed import cursor as cursors
from sender.feed.lag import Lag, lag
from sender.feed.read import Subscriber, page
from sender.feed.sequencer import head, sequence

PULL, PUSH = "pull", "push"

__all__ = ["Lag", "FeedPage", "read", "ack", "lag_of", "pull_lags", "sequence_now"]


@dataclass(frozen=True)
class FeedPage:
    """The exact bodies a push would send, and the cursor to read after them."""

    payloads: list[str]
    next_cursor: str


def _retention(settings: Settings) -> timedelta:
    return timedelta(days=settings.retention_days)


def read(rt: Runtime, actor: Actor, uid: str, *, after: str | None, limit: int,
         endpoint_id: str | None = None, now: datetime | None = None) -> FeedPage:
    """One page of partner `uid`'s feed, optionally as endpoint `endpoint_id` receives it.

    Without `after`, a pull endpoint's feed starts after its last acknowledgement; any other
    feed starts at its oldest event within retention.

    Raises:
        NotFound: the partner (or endpoint) does not exist or is not the actor's to see.
        BadRequest: `invalid_cursor`. Gone: `cursor_expired`.
    """
    now = now or utcnow()
    retention = _retention(rt.settings)
    with rt.db.begin() as session:
        partner = partners.visible(session, actor, uid)
        subscriber = None
        start: int | None = None
        if endpoint_id is not None:
            endpoint = endpoint_service.get(session, actor, uid, endpoint_id)
            subscriber = Subscriber(endpoint.event_types, endpoint.versions)
            if endpoint.mode == PULL:
                start = endpoint.acked_seq
        # A valid cursor sees everything after it (it is younger than retention, so nothing
        # after it is); a start of our choosing skips what is past retention.
        not_before: datetime | None = now - retention
        if after is not None:
            position = cursors.decode(after, now=now, retention=retention)
            _not_ahead(session, position.seq, after)
            start, not_before = position.seq, None
        partner_id = partner.id
    # Before reading, so the page holds every event committed before this request.
    sequence(rt.db)
    with rt.db.begin() as session:
        found = page(session.connection(), partner_id, after=start, limit=limit,
                     not_before=not_before, subscriber=subscriber)
    return FeedPage(found.payloads, cursors.encode(found.position, now))


def _not_ahead(session: Session, seq: int, raw: str) -> None:
    if seq > head(session.connection()):
        raise cursors.invalid("cursor points beyond the end of the feed (use the next_cursor "
                              "of a feed answer)", raw)


def ack(session: Session, settings: Settings, actor: Actor, uid: str, endpoint_id: str,
        body: dict[str, Any], now: datetime | None = None) -> Endpoint:
    """Record that the consumer of pull endpoint `endpoint_id` has everything up to `cursor`.

    An acknowledgement never moves back: one older than the last (a retry arriving late) is
    accepted and changes nothing, so acknowledging is idempotent.

    Raises:
        Conflict: `push_endpoint`, only a pull endpoint is acknowledged.
        ValidationFailed: no `cursor` string, or other fields.
        BadRequest: `invalid_cursor`. Gone: `cursor_expired`.
    """
    now = now or utcnow()
    endpoint = endpoint_service.get(session, actor, uid, endpoint_id, "endpoints:write")
    unknown = sorted(set(body) - {"cursor"})
    if unknown:
        raise ValidationFailed(f"unknown field(s): {', '.join(unknown)}", code="unknown_field",
                               details={"fields": unknown})
    raw = body.get("cursor")
    if not isinstance(raw, str) or not raw:
        raise ValidationFailed("cursor is required: the next_cursor of a feed answer",
                               code="invalid_field", details={"field": "cursor"})
    if endpoint.mode != PULL:
        raise Conflict("only a pull endpoint is acknowledged; a push endpoint's deliveries "
                       "are confirmed by its 2xx answers", code="push_endpoint",
                       details={"endpoint": endpoint.id, "mode": endpoint.mode})
    position = cursors.decode(raw, now=now, retention=_retention(settings))
    _not_ahead(session, position.seq, raw)
    if position.seq > (endpoint.acked_seq or 0):
        endpoint.acked_seq = position.seq
        endpoint.acked_at = now
        session.flush()
    return endpoint


def lag_of(session: Session, settings: Settings, endpoint: Endpoint,
           now: datetime | None = None) -> Lag | None:
    """What a pull endpoint has not acknowledged (None for a push endpoint)."""
    if endpoint.mode != PULL:
        return None
    not_before = (now or utcnow()) - _retention(settings)
    return lag(session.connection(), endpoint.partner_id, endpoint.event_types,
               endpoint.acked_seq, not_before=not_before)


def pull_lags(session: Session, settings: Settings, now: datetime | None = None
              ) -> list[tuple[Endpoint, str, Lag]]:
    """Every live pull endpoint with its partner's uid and its lag (for /metrics)."""
    now = now or utcnow()
    rows = session.execute(
        select(Endpoint, Partner.uid).join(Partner, Partner.id == Endpoint.partner_id)
        .where(Endpoint.mode == PULL, Endpoint.deleted_at.is_(None))
        .order_by(Endpoint.id)).all()
    found = []
    for endpoint, uid in rows:
        endpoint_lag = lag_of(session, settings, endpoint, now)
        if endpoint_lag is not None:
            found.append((endpoint, uid, endpoint_lag))
    return found


def sequence_now(rt: Runtime) -> int:
    """Give feed positions to the events committed since the last pass (the scheduler's job;
    readers do it too)."""
    return sequence(rt.db)
