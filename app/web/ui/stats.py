"""Read-only figures for the operator pages: cheap queries on indexed columns only."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.clock import utcnow
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
from app.services.endpoints import Health
from app.services.endpoints import health_of as endpoint_health

__all__ = ["Health", "endpoint_health", "id_floor"]


def _hour_bucket(session: Session, column: Any) -> Any:
    if session.get_bind().dialect.name == "postgresql":
        return func.date_trunc("hour", column)
    return func.strftime("%Y-%m-%d %H:00:00", column)


def _as_hour(value: Any) -> datetime:
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


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


def deliveries_by_hour(session: Session, *, hours: int = 24,
                       now: datetime | None = None) -> Chart:
    now = now or utcnow()
    start = (now - timedelta(hours=hours - 1)).replace(minute=0, second=0, microsecond=0)
    bucket = _hour_bucket(session, Delivery.created_at).label("hour")
    rows = session.execute(
        select(bucket, Delivery.state, func.count())
        .where(Delivery.id >= id_floor("dlv", start), Delivery.created_at >= start)
        .group_by(bucket, Delivery.state))
    bars = {start + timedelta(hours=i): HourBar(start + timedelta(hours=i), {})
            for i in range(hours)}
    totals: dict[str, int] = {}
    for hour, state, n in rows:
        bar = bars.get(_as_hour(hour))
        if bar is not None:
            bar.counts[state] = bar.counts.get(state, 0) + int(n)
            totals[state] = totals.get(state, 0) + int(n)
    return Chart(list(bars.values()), totals=totals)


def in_flight(session: Session) -> dict[str, int]:
    """Deliveries still being worked on, from the (state, next_attempt_at) index."""
    rows = session.execute(
        select(Delivery.state, func.count())
        .where(Delivery.state.in_(("pending", "delivering", "retrying")))
        .group_by(Delivery.state))
    return {state: int(n) for state, n in rows}


def open_dead_letters(session: Session) -> int:
    return int(session.scalar(select(func.count()).select_from(DeadLetter)
                              .where(DeadLetter.state == DL_OPEN)) or 0)


def quarantined_inbound(session: Session) -> int:
    return int(session.scalar(select(func.count()).select_from(InboundEvent)
                              .where(InboundEvent.status == "quarantined")) or 0)


def disabled_endpoints(session: Session, limit: int = 20) -> list[Endpoint]:
    return list(session.scalars(
        select(Endpoint).where(Endpoint.state == "disabled", Endpoint.deleted_at.is_(None))
        .order_by(Endpoint.disabled_at.desc()).limit(limit)))


def recent_operational_events(session: Session, limit: int = 10) -> list[OperationalEvent]:
    return list(session.scalars(select(OperationalEvent)
                                .order_by(OperationalEvent.id.desc()).limit(limit)))


def open_letters_by_endpoint(session: Session, endpoint_ids: list[str]) -> dict[str, int]:
    if not endpoint_ids:
        return {}
    rows = session.execute(
        select(DeadLetter.endpoint_id, func.count())
        .where(DeadLetter.endpoint_id.in_(endpoint_ids), DeadLetter.state == DL_OPEN)
        .group_by(DeadLetter.endpoint_id))
    return {endpoint_id: int(n) for endpoint_id, n in rows}


def inbound_by_status(session: Session) -> dict[str, int]:
    rows = session.execute(select(InboundEvent.status, func.count())
                           .group_by(InboundEvent.status))
    return {status: int(n) for status, n in rows}
