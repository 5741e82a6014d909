"""The feed and pull endpoints: who may read which feed, acknowledging, and lag.

The mechanism (positions given after commit, cursors, pages) is `app.feed`; this module
decides what an actor may read and acknowledge. A feed is read with `read` (admin and read
keys, operators, and that partner's own partner keys and portal); an acknowledgement needs
`endpoints:write`. Acknowledgements are not written to the audit trail: a consumer makes one
per page, and the endpoint keeps the last one (`acked_seq`, `acked_at`).

A pull endpoint whose acknowledgement lies behind the retention horizon is never moved past
its old events silently: its reads without a cursor answer `410 backlog_expired` until the
consumer acknowledges a later cursor or skips them with `skip_expired`, a deliberate choice
that is audited (`endpoint.backlog_skipped`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from app.clock import isoformat, utcnow
from app.config import Settings
from app.errors import Conflict, Gone, ValidationFailed, reject_unknown_fields
from app.feed import cursor as cursors
from app.feed.backlog import ExpiredBacklog, expired
from app.feed.horizon import purged
from app.feed.lag import Lag, PullLag, lag, lags
from app.feed.read import Subscriber, page
from app.feed.sequencer import head, sequence
from app.models import Endpoint
from app.runtime import Runtime
from app.services import audit, partners
from app.services import endpoints as endpoint_service
from app.services.actor import Actor
from app.vocabulary import EndpointMode

__all__ = [
    "Lag",
    "PullLag",
    "ExpiredBacklog",
    "FeedPage",
    "Skipped",
    "read",
    "ack",
    "skip_expired",
    "expired_backlog",
    "lag_of",
    "pull_lags",
    "sequence_now",
]


@dataclass(frozen=True)
class FeedPage:
    """The exact bodies a push would send, and the cursor to read after them."""

    payloads: list[str]
    next_cursor: str


# Reading a partner's feed and acknowledging it (what a portal-made feed key holds).
FEED_WRITE = "feed:write"


def _retention(settings: Settings) -> timedelta:
    return timedelta(days=settings.retain_events_days)


def read(
    rt: Runtime,
    actor: Actor,
    uid: str,
    *,
    after: str | None,
    limit: int,
    endpoint_id: str | None = None,
    now: datetime | None = None,
) -> FeedPage:
    """One page of partner `uid`'s feed, optionally as endpoint `endpoint_id` receives it.

    Without `after`, a pull endpoint's feed starts after its last acknowledgement; any other
    feed starts at its oldest event within retention.

    Raises:
        NotFound: the partner (or endpoint) does not exist or is not the actor's to see.
        BadRequest: `invalid_cursor`. Gone: `cursor_expired`; `backlog_expired`, a pull
            endpoint read without a cursor whose acknowledgement lies behind retention.
    """
    now = now or utcnow()
    retention = _retention(rt.settings)
    # A pull endpoint resuming from its acknowledgement: its id and subscription.
    resuming: tuple[str, list[str] | None] | None = None
    with rt.db.begin() as session:
        partner = partners.visible(session, actor, uid)
        subscriber = None
        start: int | None = None
        # A start of our choosing skips what is past retention, unless it is a pull
        # endpoint's acknowledgement: that one is checked for an expired backlog below.
        not_before: datetime | None = now - retention
        if endpoint_id is not None:
            endpoint = endpoint_service.live(session, actor, uid, endpoint_id)
            subscriber = Subscriber(endpoint.event_types, endpoint.versions)
            if endpoint.mode == EndpointMode.PULL:
                start, not_before = endpoint.acked_seq, None
                resuming = (endpoint.id, endpoint.event_types)
        # A valid cursor sees everything after it (it is younger than retention, so nothing
        # after it is).
        if after is not None:
            position = cursors.decode(after, now=now, retention=retention)
            _not_ahead(session, position.seq, after)
            _not_behind_purge(
                session, partner.id, subscriber.event_types if subscriber else None, position.seq
            )
            start, not_before, resuming = position.seq, None, None
        partner_id = partner.id
    # Before reading, so the page holds every event committed before this request.
    sequence(rt.db)
    with rt.db.begin() as session:
        if resuming is not None:
            resuming_id, event_types = resuming
            connection = session.connection()
            gone = expired(
                connection,
                partner_id,
                event_types,
                start,
                horizon=now - retention,
                purged=purged(connection, partner_id, event_types),
            )
            if gone is not None:
                raise backlog_expired(gone, uid, resuming_id)
        found = page(
            session.connection(),
            partner_id,
            after=start,
            limit=limit,
            not_before=not_before,
            subscriber=subscriber,
        )
    return FeedPage(found.payloads, cursors.encode(found.position, now))


def backlog_expired(gone: ExpiredBacklog, uid: str, endpoint_id: str) -> Gone:
    """The refusal of a read that would otherwise skip events past retention."""
    return Gone(
        f"{gone.skipped} event(s) after this endpoint's last acknowledgement reach "
        f"past the retention period (the oldest is {gone.oldest_event}); move past "
        f"them on purpose with POST /v1/partners/{uid}/endpoints/{endpoint_id}/"
        "skip-expired, or acknowledge a later cursor",
        code="backlog_expired",
        details={
            "horizon": isoformat(gone.horizon),
            "skipped": gone.skipped,
            "oldest_event": gone.oldest_event,
        },
    )


def _not_ahead(session: Session, seq: int, raw: str) -> None:
    if seq > head(session.connection()):
        raise cursors.invalid(
            "cursor points beyond the end of the feed (use the next_cursor of a feed answer)", raw
        )


def _not_behind_purge(
    session: Session, partner_id: str, event_types: list[str] | None, seq: int
) -> None:
    """A position behind what retention purged of this feed would skip what is gone."""
    gone = purged(session.connection(), partner_id, event_types)
    if gone is not None and seq < gone.seq:
        raise Gone(
            "events after this cursor have been purged by retention; start again without "
            "a cursor (or from the endpoint's last acknowledgement)",
            code="cursor_expired",
            details={"horizon": isoformat(gone.horizon), "purged_through": gone.seq},
        )


def ack(
    session: Session,
    settings: Settings,
    actor: Actor,
    uid: str,
    endpoint_id: str,
    body: dict[str, Any],
    now: datetime | None = None,
) -> Endpoint:
    """Record that the consumer of pull endpoint `endpoint_id` has everything up to `cursor`.

    An acknowledgement never moves back: one older than the last (a retry arriving late) is
    accepted and changes nothing, so acknowledging is idempotent.

    Raises:
        Conflict: `push_endpoint`, only a pull endpoint is acknowledged.
        ValidationFailed: no `cursor` string, or other fields.
        BadRequest: `invalid_cursor`. Gone: `cursor_expired`.
    """
    now = now or utcnow()
    endpoint = endpoint_service.live(session, actor, uid, endpoint_id)
    if not actor.allows("endpoints:write"):
        actor.require(FEED_WRITE)  # a feed key acknowledges what it read
    reject_unknown_fields(body, {"cursor"})
    raw = body.get("cursor")
    if not isinstance(raw, str) or not raw:
        raise ValidationFailed(
            "cursor is required: the next_cursor of a feed answer",
            code="invalid_field",
            details={"field": "cursor"},
        )
    if endpoint.mode != EndpointMode.PULL:
        raise Conflict(
            "only a pull endpoint is acknowledged; a push endpoint's deliveries "
            "are confirmed by its 2xx answers",
            code="push_endpoint",
            details={"endpoint": endpoint.id, "mode": endpoint.mode},
        )
    position = cursors.decode(raw, now=now, retention=_retention(settings))
    _not_ahead(session, position.seq, raw)
    _not_behind_purge(session, endpoint.partner_id, endpoint.event_types, position.seq)
    if position.seq > (endpoint.acked_seq or 0):
        endpoint.acked_seq = position.seq
        endpoint.acked_at = now
        session.flush()
    return endpoint


@dataclass(frozen=True)
class Skipped:
    """A pull endpoint after `skip_expired`, and what it moved past (None: nothing)."""

    endpoint: Endpoint
    backlog: ExpiredBacklog | None


def expired_backlog(
    session: Session, settings: Settings, endpoint: Endpoint, now: datetime | None = None
) -> ExpiredBacklog | None:
    """What of a pull endpoint's backlog lies past retention (None for a push endpoint)."""
    if endpoint.mode != EndpointMode.PULL:
        return None
    connection = session.connection()
    return expired(
        connection,
        endpoint.partner_id,
        endpoint.event_types,
        endpoint.acked_seq,
        horizon=(now or utcnow()) - _retention(settings),
        purged=purged(connection, endpoint.partner_id, endpoint.event_types),
    )


def skip_expired(
    session: Session,
    settings: Settings,
    actor: Actor,
    uid: str,
    endpoint_id: str,
    now: datetime | None = None,
) -> Skipped:
    """Move pull endpoint `endpoint_id` past the events of its backlog that lie past
    retention, and past nothing younger; audited, since the consumer never gets them.

    Nothing to skip changes nothing (and records nothing), so it is safe to retry.

    Raises:
        NotFound: the endpoint is not the actor's to change. Conflict: `push_endpoint`.
    """
    now = now or utcnow()
    endpoint = endpoint_service.live(session, actor, uid, endpoint_id, "endpoints:write")
    if endpoint.mode != EndpointMode.PULL:
        raise Conflict(
            "only a pull endpoint has a backlog to skip; a push endpoint's "
            "deliveries are retried or dead-lettered",
            code="push_endpoint",
            details={"endpoint": endpoint.id, "mode": endpoint.mode},
        )
    gone = expired_backlog(session, settings, endpoint, now)
    if gone is None:
        return Skipped(endpoint, None)
    endpoint.acked_seq = max(endpoint.acked_seq or 0, gone.through)
    endpoint.acked_at = now
    session.flush()
    audit.record(
        session,
        actor,
        "endpoint.backlog_skipped",
        "endpoint",
        endpoint.id,
        partner_id=endpoint.partner_id,
        skipped=gone.skipped,
        oldest_event=gone.oldest_event,
        through=gone.through,
        horizon=isoformat(gone.horizon),
    )
    return Skipped(endpoint, gone)


def lag_of(
    session: Session, settings: Settings, endpoint: Endpoint, now: datetime | None = None
) -> Lag | None:
    """What a pull endpoint has not acknowledged (None for a push endpoint)."""
    if endpoint.mode != EndpointMode.PULL:
        return None
    horizon = (now or utcnow()) - _retention(settings)
    return lag(session.connection(), endpoint.id, horizon=horizon)


def pull_lags(session: Session, settings: Settings, now: datetime | None = None) -> list[PullLag]:
    """Every live pull endpoint with its partner's uid and its lag, in a fixed number of
    statements whatever their number (for /metrics)."""
    horizon = (now or utcnow()) - _retention(settings)
    return lags(session.connection(), horizon=horizon)


def sequence_now(rt: Runtime) -> int:
    """Give feed positions to the events committed since the last pass (the scheduler's job;
    readers do it too)."""
    return sequence(rt.db)
