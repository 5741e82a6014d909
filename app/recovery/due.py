"""Which endpoints are due a probe, and claiming them so that one probe goes out per turn.

Only endpoints Kurir disabled after failures are probed: `disabled_by = health` and a
`probe_next_at` (a 410 disable sets none; an operator's or a partner's disable clears it).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from app.models import Endpoint
from app.recovery.schedule import window_ends
from app.vocabulary import DisabledBy, EndpointMode, EndpointState

# A claimed endpoint is not due again for this long: time for its probe job to run. A job
# Redis lost is claimed again after it.
CLAIM_S = 600


def probed() -> list[ColumnElement[Any]]:
    """The WHERE clauses of an endpoint that is being probed (whatever its next time)."""
    return [
        Endpoint.state == EndpointState.DISABLED,
        Endpoint.disabled_by == DisabledBy.HEALTH,
        Endpoint.probe_next_at.is_not(None),
        Endpoint.deleted_at.is_(None),
        Endpoint.mode == EndpointMode.PUSH,
    ]


def is_probed(endpoint: Endpoint) -> bool:
    """Whether this endpoint is one Kurir probes (disabled after failures, window open)."""
    return (
        endpoint.state == EndpointState.DISABLED
        and endpoint.disabled_by == DisabledBy.HEALTH
        and endpoint.probe_next_at is not None
        and endpoint.deleted_at is None
        and endpoint.mode == EndpointMode.PUSH
    )


def due(session: Session, now: datetime, limit: int) -> list[str]:
    """Ids of endpoints whose probe is due, longest waiting first."""
    stmt = (
        select(Endpoint.id)
        .where(*probed(), Endpoint.probe_next_at <= now)
        .order_by(Endpoint.probe_next_at, Endpoint.id)
        .limit(limit)
    )
    return list(session.scalars(stmt))


def claim(session: Session, now: datetime, limit: int, probe_days: int) -> list[str]:
    """Take up to `limit` due endpoints: each one's next time moves `CLAIM_S` on, so another
    pass does not take it again while its probe runs. An endpoint whose probe window has
    ended is probed no more (its `probe_next_at` is cleared) and is not returned."""
    taken: list[str] = []
    for endpoint_id in due(session, now, limit):
        endpoint = session.get(Endpoint, endpoint_id, with_for_update=True)
        if endpoint is None or not is_probed(endpoint) or endpoint.probe_next_at is None:
            continue
        if endpoint.probe_next_at > now:
            continue  # another pass took it meanwhile
        ended = endpoint.disabled_at is not None and now > window_ends(
            endpoint.disabled_at, probe_days
        )
        if ended:
            endpoint.probe_next_at = None
            continue
        endpoint.probe_next_at = now + timedelta(seconds=CLAIM_S)
        taken.append(endpoint_id)
    session.flush()
    return taken
