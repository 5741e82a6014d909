"""Endpoint health: consecutive failures and last success, and disabling what keeps failing.

Counters change only through single UPDATE statements (`x = x + n`), so workers in many
processes never lose each other's increments. An endpoint is disabled when it has failed
`disable_after_failures` attempts in a row *and* has gone `disable_after_seconds` without a
success, or at once when it answers 410 Gone. Disabling parks every delivery still
waiting for it as a dead letter with reason `endpoint_disabled`, and records the operational
event `endpoint.disabled` (shown in the UI, and published: `app.operational`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, bindparam, case, select, update
from sqlalchemy.orm import Session, selectinload

from app import operational
from app.clock import isoformat
from app.config import PROBE_SCHEDULE
from app.models import PENDING, RETRYING, Delivery, Endpoint, UTCDateTime
from app.vocabulary import DeadLetterReason, DisabledBy, EndpointState, OperationalEventType
from sender.park import park
from sender.policy import should_auto_disable

log = logging.getLogger(__name__)


def _table(model: Any) -> Table:
    """A model's Table, typed as one (the ORM types `__table__` as a FromClause)."""
    return cast(Table, model.__table__)


DISABLED_EVENT = OperationalEventType.ENDPOINT_DISABLED


@dataclass(frozen=True)
class Tally:
    """What a run of attempts to one endpoint, in finishing order, does to its counters."""

    failures: int
    last_success_at: datetime | None
    first_failure_at: datetime | None
    last_failure_at: datetime | None

    @property
    def reset(self) -> bool:
        """A success among the attempts resets the run of failures."""
        return self.last_success_at is not None


@dataclass(frozen=True)
class Health:
    """An endpoint's counters as the database holds them after an update."""

    endpoint_id: str
    state: str
    consecutive_failures: int
    last_success_at: datetime | None
    first_failure_at: datetime | None


@dataclass(frozen=True)
class Thresholds:
    failures: int
    seconds: int


def tally(outcomes: Iterable[tuple[datetime, bool]]) -> Tally:
    """Fold (finished_at, succeeded) pairs: only failures after the last success count."""
    ordered = sorted(outcomes, key=lambda o: o[0])
    last_success: datetime | None = None
    failures_after: list[datetime] = []
    for finished_at, ok in ordered:
        if ok:
            last_success = finished_at
            failures_after = []
        else:
            failures_after.append(finished_at)
    return Tally(
        failures=len(failures_after),
        last_success_at=last_success,
        first_failure_at=failures_after[0] if failures_after else None,
        last_failure_at=failures_after[-1] if failures_after else None,
    )


def _ts(value: datetime | None) -> Any:
    """A time bound with the models' UTC type, so SQLite and PostgreSQL store it alike."""
    return bindparam(None, value, type_=UTCDateTime())


def record(session: Session, endpoint_id: str, result: Tally) -> Health | None:
    """Apply a tally with one UPDATE ... RETURNING; None when the endpoint is gone."""
    table = _table(Endpoint)
    values: dict[str, Any]
    if result.reset:
        values = {
            "consecutive_failures": result.failures,
            "first_failure_at": result.first_failure_at,
            "last_success_at": case(
                (table.c.last_success_at.is_(None), _ts(result.last_success_at)),
                (
                    table.c.last_success_at < _ts(result.last_success_at),
                    _ts(result.last_success_at),
                ),
                else_=table.c.last_success_at,
            ),
        }
        if result.last_failure_at is not None:
            values["last_failure_at"] = result.last_failure_at
    elif result.failures:
        values = {
            "consecutive_failures": table.c.consecutive_failures + result.failures,
            "first_failure_at": case(
                (table.c.first_failure_at.is_(None), _ts(result.first_failure_at)),
                else_=table.c.first_failure_at,
            ),
            "last_failure_at": result.last_failure_at,
        }
    else:
        return None
    row = session.execute(
        update(table)
        .where(table.c.id == endpoint_id)
        .values(**values)
        .returning(
            table.c.state,
            table.c.consecutive_failures,
            table.c.last_success_at,
            table.c.first_failure_at,
        )
    ).first()
    if row is None:
        return None
    return Health(
        endpoint_id,
        row.state,
        row.consecutive_failures,
        _aware(row.last_success_at),
        _aware(row.first_failure_at),
    )


def record_successes(session: Session, successes: list[tuple[str, datetime]]) -> None:
    """Endpoints that only succeeded: reset their run of failures, move "last success" on.

    One statement for them all (executemany); nothing to judge, so nothing is returned.
    """
    if not successes:
        return
    table = _table(Endpoint)
    at = bindparam("b_at", type_=UTCDateTime())
    session.execute(
        update(table)
        .where(table.c.id == bindparam("b_id"))
        .values(
            consecutive_failures=0,
            first_failure_at=None,
            last_success_at=case(
                (table.c.last_success_at.is_(None), at),
                (table.c.last_success_at < at, at),
                else_=table.c.last_success_at,
            ),
        ),
        [{"b_id": endpoint_id, "b_at": at_} for endpoint_id, at_ in sorted(successes)],
    )


def _aware(value: datetime | None) -> datetime | None:
    """Make a naive time UTC (SQLite keeps no zone), leaving aware ones alone."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def should_disable(health: Health, thresholds: Thresholds, now: datetime) -> bool:
    """Both thresholds passed: many failures in a row and long without a success."""
    if health.state != EndpointState.ENABLED:
        return False
    return should_auto_disable(
        health.consecutive_failures,
        health.last_success_at,
        health.first_failure_at,
        now,
        thresholds.failures,
        thresholds.seconds,
    )


def disable(
    session: Session,
    endpoint_id: str,
    reason: str,
    now: datetime,
    details: dict[str, Any] | None = None,
    *,
    probe: bool = False,
) -> bool:
    """Disable an enabled endpoint and park its waiting deliveries; False if it was not enabled.

    The state change is one conditional UPDATE, so of two workers deciding at once only one
    disables, parks and records the operational event. `probe` (a disable for failures, not
    for a 410) schedules the first `kurir.endpoint.probe` (see app.recovery).
    """
    table = _table(Endpoint)
    won = session.execute(
        update(table)
        .where(table.c.id == endpoint_id, table.c.state == EndpointState.ENABLED)
        .values(
            state=EndpointState.DISABLED,
            disabled_reason=reason[:200],
            disabled_at=now,
            disabled_by=DisabledBy.HEALTH,
            probe_count=0,
            probe_next_at=now + timedelta(seconds=PROBE_SCHEDULE[0]) if probe else None,
        )
        .returning(table.c.id)
    ).first()
    if won is None:
        return False
    parked = park_waiting(session, endpoint_id)
    endpoint = session.get_one(Endpoint, endpoint_id)
    known = operational.CATALOG[DISABLED_EVENT].schema["properties"]
    operational.about_endpoint(
        session,
        DISABLED_EVENT,
        endpoint,
        {
            "reason": reason[:200],
            "disabled_by": DisabledBy.HEALTH.value,
            "disabled_at": isoformat(now),
            "parked_deliveries": parked,
            **{k: v for k, v in (details or {}).items() if k in known},
        },
        now=now,
    )
    log.warning(
        "endpoint disabled", extra={"endpoint_id": endpoint_id, "reason": reason, "parked": parked}
    )
    return True


def park_waiting(
    session: Session,
    endpoint_id: str,
    reason: DeadLetterReason = DeadLetterReason.ENDPOINT_DISABLED,
) -> int:
    """Park every pending and retrying delivery of an endpoint as a dead letter."""
    deliveries = session.scalars(
        select(Delivery)
        .where(Delivery.endpoint_id == endpoint_id, Delivery.state.in_((PENDING, RETRYING)))
        .options(selectinload(Delivery.event), selectinload(Delivery.endpoint))
        .with_for_update()
    ).all()
    for delivery in deliveries:
        park(session, delivery, delivery.event, delivery.endpoint, reason)
    session.flush()
    return len(deliveries)
