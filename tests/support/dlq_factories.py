"""Rows for dead-letter tests: partners, endpoints with real secrets, events, dead deliveries.

Everything goes through the same services production uses where one exists (`add_secret`,
`sender.park`), so a test sees the rows the engine would have written.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from app.clock import isoformat, utcnow
from app.crypto import SecretBox
from app.ids import new_id
from app.models import DEAD, Attempt, DeadLetter, Delivery, Endpoint, Event, Partner
from app.registry.secrets import add_secret
from app.signing import generate_secret
from sender.park import park

_seq = itertools.count(1)


def make_partner(session: Session, uid: str | None = None, name: str | None = None) -> Partner:
    uid = uid or f"partner-{next(_seq)}"
    partner = Partner(uid=uid, name=name or uid.title())
    session.add(partner)
    session.flush()
    return partner


def make_endpoint(
    session: Session,
    box: SecretBox,
    partner: Partner,
    *,
    url: str = "http://127.0.0.1:9/hook",
    state: str = "enabled",
    secret: str | None = None,
    headers: dict[str, str] | None = None,
    disabled_at: datetime | None = None,
) -> tuple[Endpoint, str]:
    secret = secret or generate_secret()
    endpoint = Endpoint(partner=partner, url=url, state=state, headers=headers or {}, timeout_s=5)
    if state == "disabled":
        endpoint.disabled_at = disabled_at or utcnow()
        endpoint.disabled_reason = "manual"
    session.add(endpoint)
    session.flush()
    add_secret(session, endpoint, secret, box)
    session.flush()
    return endpoint, secret


def make_event(
    session: Session,
    partner: Partner,
    *,
    type: str = "order.created",
    data: dict[str, Any] | None = None,
    occurred_at: datetime | None = None,
) -> Event:
    event_id = new_id("evt")
    occurred_at = occurred_at or utcnow()
    data = data if data is not None else {"order": f"ord_{next(_seq)}", "amount": 1200}
    payload = json.dumps(
        {
            "id": event_id,
            "type": type,
            "version": 1,
            "occurred_at": isoformat(occurred_at),
            "partner": partner.uid,
            "resource": None,
            "correlation_id": None,
            "data": data,
        },
        ensure_ascii=False,
        separators=(",", ":"),
    )
    event = Event(
        id=event_id,
        partner_id=partner.id,
        type=type,
        version=1,
        data=data,
        payload=payload,
        occurred_at=occurred_at,
    )
    session.add(event)
    session.flush()
    return event


def make_dead_letter(
    session: Session,
    endpoint: Endpoint,
    event: Event,
    *,
    reason: str = "retries_exhausted",
    status_code: int | None = 500,
    error: str | None = "http_500",
    attempts: int = 1,
    created_at: datetime | None = None,
) -> DeadLetter:
    """A delivery that tried `attempts` times and died, parked the way the engine parks it."""
    start = utcnow() - timedelta(minutes=10)
    delivery = Delivery(
        event_id=event.id,
        endpoint_id=endpoint.id,
        state=DEAD,
        attempt_count=attempts,
        run_attempts=attempts,
        run=1,
        last_status_code=status_code,
        last_error=error,
    )
    session.add(delivery)
    session.flush()
    for n in range(1, attempts + 1):
        session.add(
            Attempt(
                delivery_id=delivery.id,
                n=n,
                started_at=start + timedelta(seconds=n),
                duration_ms=40 * n,
                url=endpoint.url,
                request_headers={
                    "webhook-id": event.id,
                    "webhook-timestamp": "1700000000",
                    "webhook-signature": "v1,c2VjcmV0LXNpZ25hdHVyZQ==",
                    "content-type": "application/json",
                    "user-agent": "Kurir/0.1.0",
                    **(endpoint.headers or {}),
                },
                response_status=status_code,
                response_body=(b'{"error":"upstream exploded"}' if status_code else None),
                error=error,
            )
        )
    letter = park(
        session, delivery, event, endpoint, reason, last_status_code=status_code, last_error=error
    )
    session.flush()
    if created_at is not None:
        letter.created_at = created_at
        session.flush()
    return letter


@dataclass
class Scene:
    """A partner with one endpoint and its plaintext secret, ready for dead letters."""

    partner_id: str
    partner_uid: str
    endpoint_id: str
    secret: str


def make_scene(
    session: Session,
    box: SecretBox,
    *,
    uid: str | None = None,
    url: str = "http://127.0.0.1:9/hook",
    state: str = "enabled",
    headers: dict[str, str] | None = None,
) -> Scene:
    partner = make_partner(session, uid)
    endpoint, secret = make_endpoint(session, box, partner, url=url, state=state, headers=headers)
    return Scene(partner.id, partner.uid, endpoint.id, secret)


def letters_for(
    session: Session,
    scene: Scene,
    count: int,
    *,
    type: str = "order.created",
    data: Any = None,
    **kwargs: Any,
) -> list[str]:
    """`count` dead letters on the scene's endpoint; `data(i)` gives each event's data."""
    partner = session.get_one(Partner, scene.partner_id)
    endpoint = session.get_one(Endpoint, scene.endpoint_id)
    ids = []
    for i in range(count):
        event = make_event(session, partner, type=type, data=data(i) if callable(data) else data)
        ids.append(make_dead_letter(session, endpoint, event, **kwargs).id)
    return ids


def make_delivery(
    session: Session,
    endpoint: Endpoint,
    event: Event,
    state: str,
    statuses: list[int],
    **extra: Any,
) -> Delivery:
    """A delivery with one attempt per HTTP status in `statuses` (the last 30 minutes),
    as the engine records them; `extra` sets other columns (ordering, times)."""
    delivery = Delivery(
        event_id=event.id,
        endpoint_id=endpoint.id,
        state=state,
        attempt_count=len(statuses),
        run_attempts=len(statuses),
        run=1,
        last_status_code=statuses[-1] if statuses else None,
        next_attempt_at=utcnow() + timedelta(hours=1),
        **extra,
    )
    session.add(delivery)
    session.flush()
    start = utcnow() - timedelta(minutes=30)
    for n, status in enumerate(statuses, 1):
        session.add(
            Attempt(
                delivery_id=delivery.id,
                n=n,
                started_at=start + timedelta(seconds=n),
                duration_ms=20,
                url=endpoint.url,
                request_headers={},
                response_status=status,
            )
        )
    session.flush()
    return delivery
