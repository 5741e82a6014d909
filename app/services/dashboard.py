"""The operator dashboard: what needs a look now, read in one place (read-only).

Figures over every partner, so a partner-bound actor (a partner key, the portal) is answered
`404 not_found`, as for anything that does not exist for it. Each figure is a cheap query on
indexed columns; queue depths come from Redis and are read apart (`queues`), so a Redis that
does not answer leaves the database figures standing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.clock import utcnow
from app.errors import NotFound
from app.ids import id_floor
from app.models import (
    DELIVERY_STATES,
    DL_OPEN,
    DeadLetter,
    Delivery,
    Endpoint,
    InboundEvent,
    OperationalEvent,
)
from app.services import endpoints, partners
from app.services.actor import Actor
from app.services.metrics import QueueStat, queue_stats
from app.vocabulary import EndpointState, InboundStatus
from sender import ordering
from sender.ordering import BlockedCount

# How many disabled endpoints and operational events the dashboard lists.
DISABLED_SHOWN = 20
EVENTS_SHOWN = 10
CHART_HOURS = 24


def _require_operator(actor: Actor) -> None:
    """Every partner's figures: not for an actor bound to one partner."""
    if actor.bound_to_partner:
        raise NotFound("not found")
    actor.require("read")


@dataclass
class HourBar:
    hour: datetime
    counts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass
class Chart:
    """Deliveries created per hour over the last day, split by their current state."""

    bars: list[HourBar]
    states: tuple[str, ...] = DELIVERY_STATES
    totals: dict[str, int] = field(default_factory=dict)

    @property
    def peak(self) -> int:
        return max((bar.total for bar in self.bars), default=0)


@dataclass(frozen=True)
class Overview:
    """Everything the dashboard shows from the database."""

    chart: Chart
    in_flight: dict[str, int]  # pending / delivering / retrying -> deliveries
    open_letters: int
    quarantined: int  # inbound events in quarantine
    disabled: list[Endpoint]  # newest disabled first, live endpoints only
    partner_uids: dict[str, str]  # partner id -> uid, for the disabled endpoints
    events: list[OperationalEvent]  # the latest operational events, newest first
    blocked: list[BlockedCount]  # endpoints holding ordering keys
    held: int  # waiting deliveries behind a blocked ordering key (not in flight)
    failing: list[endpoints.Failing]  # enabled endpoints failing again and again


def overview(session: Session, actor: Actor, now: datetime | None = None) -> Overview:
    _require_operator(actor)
    disabled = _disabled_endpoints(session)
    return Overview(
        chart=_deliveries_by_hour(session, now=now),
        in_flight=_in_flight(session),
        open_letters=_open_dead_letters(session),
        quarantined=_quarantined_inbound(session),
        disabled=disabled,
        partner_uids=partners.uids(session, {e.partner_id for e in disabled}),
        events=_recent_operational_events(session),
        blocked=endpoints.blocked_key_counts(session),
        held=_held(session),
        failing=endpoints.failing(session, actor),
    )


def queues(actor: Actor, connection: redis.Redis) -> list[QueueStat]:
    """Depth and oldest-job age of every queue (raises when Redis does not answer)."""
    _require_operator(actor)
    return queue_stats(connection)


# ------------------------------------------------------------------------------ figures


def _hour_bucket(session: Session, column: Any) -> Any:
    if session.get_bind().dialect.name == "postgresql":
        return func.date_trunc("hour", column)
    return func.strftime("%Y-%m-%d %H:00:00", column)


def _as_hour(value: Any) -> datetime:
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _deliveries_by_hour(
    session: Session, *, hours: int = CHART_HOURS, now: datetime | None = None
) -> Chart:
    now = now or utcnow()
    start = (now - timedelta(hours=hours - 1)).replace(minute=0, second=0, microsecond=0)
    bucket = _hour_bucket(session, Delivery.created_at).label("hour")
    rows = session.execute(
        select(bucket, Delivery.state, func.count())
        .where(Delivery.id >= id_floor("dlv", start), Delivery.created_at >= start)
        .group_by(bucket, Delivery.state)
    )
    bars = {
        start + timedelta(hours=i): HourBar(start + timedelta(hours=i), {}) for i in range(hours)
    }
    totals: dict[str, int] = {}
    for hour, state, n in rows:
        bar = bars.get(_as_hour(hour))
        if bar is not None:
            bar.counts[state] = bar.counts.get(state, 0) + int(n)
            totals[state] = totals.get(state, 0) + int(n)
    return Chart(list(bars.values()), totals=totals)


def _in_flight(session: Session) -> dict[str, int]:
    """Deliveries still being worked on, from the (state, next_attempt_at) index; those
    held behind a blocked ordering key wait for an operator, not for Kurir, and are left
    out (`_held` counts them)."""
    rows = session.execute(
        select(Delivery.state, func.count())
        .where(
            Delivery.state.in_(("pending", "delivering", "retrying")),
            ~ordering.held_behind_blocked_key(),
        )
        .group_by(Delivery.state)
    )
    return {state: int(n) for state, n in rows}


def _held(session: Session) -> int:
    """Waiting deliveries that nothing sends until a blocked key is released."""
    return int(
        session.scalar(
            select(func.count()).select_from(Delivery).where(ordering.held_behind_blocked_key())
        )
        or 0
    )


def _open_dead_letters(session: Session) -> int:
    return int(
        session.scalar(
            select(func.count()).select_from(DeadLetter).where(DeadLetter.state == DL_OPEN)
        )
        or 0
    )


def _quarantined_inbound(session: Session) -> int:
    return int(
        session.scalar(
            select(func.count())
            .select_from(InboundEvent)
            .where(InboundEvent.status == InboundStatus.QUARANTINED)
        )
        or 0
    )


def _disabled_endpoints(session: Session, limit: int = DISABLED_SHOWN) -> list[Endpoint]:
    return list(
        session.scalars(
            select(Endpoint)
            .where(Endpoint.state == EndpointState.DISABLED, Endpoint.deleted_at.is_(None))
            .order_by(Endpoint.disabled_at.desc())
            .limit(limit)
        )
    )


def _recent_operational_events(
    session: Session, limit: int = EVENTS_SHOWN
) -> list[OperationalEvent]:
    return list(
        session.scalars(select(OperationalEvent).order_by(OperationalEvent.id.desc()).limit(limit))
    )
