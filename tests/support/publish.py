"""Factories for the publish-API tests: build contracts, partners and endpoints over HTTP."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from app.clock import utcnow
from app.db import Database
from app.ids import new_id
from app.intake.envelope import PublishRequest, payload_json
from app.models import (
    DeadLetter,
    DeadLetterAudit,
    Delivery,
    Endpoint,
    EndpointSecret,
    Event,
    EventType,
    IdempotencyKey,
    Partner,
)

ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["order_id", "amount"],
    "properties": {
        "order_id": {"type": "string"},
        "amount": {"type": "integer", "minimum": 0},
        "currency": {"type": "string", "enum": ["EUR", "USD"]},
    },
    "additionalProperties": False,
}

COUNTED = (
    Event,
    Delivery,
    DeadLetter,
    DeadLetterAudit,
    IdempotencyKey,
    EventType,
    Partner,
    Endpoint,
    EndpointSecret,
)


def error_of(response: Any) -> dict[str, Any]:
    body = response.get_json()
    assert set(body) == {"error"}, body
    return body["error"]


def make_event_type(
    client: Any,
    auth: dict[str, str],
    name: str = "order.created",
    version: int = 1,
    schema: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    response = client.post(
        "/v1/event-types",
        headers=auth,
        json={"name": name, "version": version, "schema": schema or ORDER_SCHEMA, **extra},
    )
    assert response.status_code in (200, 201), response.get_json()
    return response.get_json()


def make_partner(client: Any, auth: dict[str, str], uid: str = "acme") -> dict[str, Any]:
    response = client.post("/v1/partners", headers=auth, json={"uid": uid, "name": uid.title()})
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def make_endpoint(
    client: Any,
    auth: dict[str, str],
    uid: str = "acme",
    url: str | None = "http://127.0.0.1:9/hook",
    **fields: Any,
) -> dict[str, Any]:
    body = {"url": url, **fields} if url is not None else fields
    response = client.post(f"/v1/partners/{uid}/endpoints", headers=auth, json=body)
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def order(order_id: str = "o-1", amount: int = 100, **extra: Any) -> dict[str, Any]:
    return {
        "type": "order.created",
        "version": 1,
        "data": {"order_id": order_id, "amount": amount},
        **extra,
    }


def blocked_endpoint(
    client: Any,
    auth: dict[str, str],
    uid: str = "acme",
    keys: tuple[str, ...] = ("stock:1",),
    per_key: int = 2,
    event_type: str = "order.created",
    disabled_by: dict[str, str] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """An ordered `on_dead: "block"` endpoint that was disabled while `per_key` events of
    each key were published: they are parked dead with open letters, still numbered, so each
    key's first one holds the rest (as after any disable window).

    `disabled_by` is the credential that disables it: the operator's `auth` unless given (a
    partner's own key opens a window the partner may close itself).
    """
    endpoint = make_endpoint(client, auth, uid, ordering="key", on_dead="block", **fields)
    disabled = client.post(
        f"/v1/partners/{uid}/endpoints/{endpoint['id']}/disable",
        headers=disabled_by or auth,
        json={"reason": "maintenance"},
    )
    assert disabled.status_code == 200, disabled.get_json()
    for key in keys:
        for n in range(per_key):
            published = client.post(
                f"/v1/partners/{uid}/events",
                headers=auth,
                json=order(f"{key}-{n}", ordering_key=key, type=event_type),
            )
            assert published.status_code == 202, published.get_json()
    return endpoint


def old_event(runtime: Any, uid: str, order_id: str, age: timedelta) -> str:
    """An `order.created` event of partner `uid` created `age` ago, as if it had waited that
    long in the feed (it gets its feed position at the next sequencer run)."""
    created = utcnow() - age
    with runtime.db.begin() as session:
        partner_id = session.scalars(select(Partner.id).where(Partner.uid == uid)).one()
        event_id = new_id("evt")
        request = PublishRequest(
            "order.created", 1, {"order_id": order_id, "amount": 1}, created, None, None
        )
        session.add(
            Event(
                id=event_id,
                partner_id=partner_id,
                type="order.created",
                version=1,
                data=request.data,
                occurred_at=created,
                created_at=created,
                payload=payload_json(event_id, request, uid, created),
            )
        )
    return event_id


def counts(db: Database) -> dict[str, int]:
    with db.Session() as session:
        return {
            model.__tablename__: int(session.scalar(select(func.count()).select_from(model)))
            for model in COUNTED
        }


def contract_and_partner(client: Any, auth: dict[str, str]) -> str:
    """The `order.created` contract and partner `acme`, with no endpoint yet."""
    make_event_type(client, auth)
    make_partner(client, auth, "acme")
    return "acme"


@pytest.fixture
def acme(client: Any, auth: dict[str, str]) -> str:
    """Partner `acme` with one endpoint subscribed to `order.created` (import to use)."""
    contract_and_partner(client, auth)
    make_endpoint(client, auth)
    return "acme"
