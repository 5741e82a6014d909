"""One partner whose endpoints received an event in different versions, through the real
engine: the scene for the tests of what the web faces show as delivered.

`payment.succeeded` v2 is published; `/pinned-ok` and `/pinned-dead` are pinned to v1 (made
by v2's downgrade), `/latest` is not pinned. `/pinned-dead` answers 500 until its delivery
dies (the test's settings allow one retry). v1 is deprecated with a sunset. The data carries
what a page could get wrong: HTML, quotes, non-ASCII and doubled spaces.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select

from app.clock import isoformat, utcnow
from app.models import DeadLetter, Delivery
from tests.support.factories import Received, Receiver, wait_for
from tests.support.publish import make_endpoint, make_partner

V1 = {
    "type": "object",
    "required": ["amount", "currency"],
    "properties": {
        "amount": {"type": "integer"},
        "currency": {"type": "string"},
        "note": {"type": "string"},
    },
}
V2 = {
    "type": "object",
    "required": ["money"],
    "properties": {
        "money": {
            "type": "object",
            "required": ["amount_minor", "currency"],
            "properties": {"amount_minor": {"type": "integer"}, "currency": {"type": "string"}},
        },
        "note": {"type": "string"},
    },
}
DOWNGRADE = "{amount: money.amount_minor, currency: money.currency, note: note}"
NOTE = "<b>Zoë & \"co\"</b>  paid ✓ </pre> 'twice'"
DATA_V2 = {"money": {"amount_minor": 4242, "currency": "EUR"}, "note": NOTE}
PATHS = ("/pinned-ok", "/pinned-dead", "/latest")
SETTINGS = {"retry_schedule": (1,), "retry_jitter": 0.0}  # one retry 1 s later, then dead


def reply(received: Received, count: int) -> tuple[int, dict[str, str], bytes]:
    if received.path == "/pinned-dead":
        return 500, {"content-type": "text/plain"}, b"down"
    return 200, {"content-type": "text/plain"}, b"ok"


@dataclass
class Scene:
    event_id: str
    endpoints: dict[str, str]  # path -> endpoint id
    deliveries: dict[str, str]  # path -> delivery id
    letter_id: str  # the dead letter of /pinned-dead
    captured: dict[str, bytes]  # path -> the body the receiver got
    sunset: datetime


def _states(runtime: Any, ids: list[str]) -> dict[str, str]:
    with runtime.db.begin() as session:
        return dict(
            session.execute(select(Delivery.id, Delivery.state).where(Delivery.id.in_(ids))).all()
        )


def setup(client: Any, auth: dict[str, str], base_url: str) -> tuple[dict[str, str], datetime]:
    """The contracts (v1 deprecated with a sunset), the partner and its three endpoints under
    `base_url`; returns path -> endpoint id, and the sunset."""
    for version, schema, extra in (
        (1, V1, {}),
        (
            2,
            V2,
            {
                "downgrade": DOWNGRADE,
                "examples": [{"money": {"amount_minor": 1, "currency": "EUR"}, "note": "x"}],
            },
        ),
    ):
        answer = client.post(
            "/v1/event-types",
            headers=auth,
            json={"name": "payment.succeeded", "version": version, "schema": schema, **extra},
        )
        assert answer.status_code == 201, answer.get_json()
    sunset = (utcnow() + timedelta(days=90)).replace(microsecond=0)
    assert (
        client.post(
            "/v1/event-types/payment.succeeded/1/deprecate",
            headers=auth,
            json={"sunset_at": isoformat(sunset)},
        ).status_code
        == 200
    )
    make_partner(client, auth, "acme")
    endpoints = {
        path: make_endpoint(
            client,
            auth,
            url=base_url + path,
            **({} if path == "/latest" else {"versions": {"payment.succeeded": 1}}),
        )["id"]
        for path in PATHS
    }
    return endpoints, sunset


def build(client: Any, auth: dict[str, str], runtime: Any, receiver: Receiver) -> Scene:
    """Set up, publish and wait until every delivery is final (a worker must run)."""
    endpoints, sunset = setup(client, auth, receiver.url)
    published = client.post(
        "/v1/partners/acme/events",
        headers=auth,
        json={"type": "payment.succeeded", "version": 2, "data": DATA_V2},
    )
    assert published.status_code == 202, published.get_json()
    answer = published.get_json()
    by_endpoint = {d["endpoint"]: d["id"] for d in answer["deliveries"]}
    deliveries = {path: by_endpoint[endpoint_id] for path, endpoint_id in endpoints.items()}
    wanted = {
        deliveries["/pinned-ok"]: "succeeded",
        deliveries["/latest"]: "succeeded",
        deliveries["/pinned-dead"]: "dead",
    }
    wait_for(
        lambda: _states(runtime, list(wanted)) == wanted,
        timeout_s=60,
        message="two deliveries to succeed and one to die",
    )
    with runtime.db.begin() as session:
        letter_id = session.scalars(
            select(DeadLetter.id).where(DeadLetter.delivery_id == deliveries["/pinned-dead"])
        ).one()
    captured = {}
    for path in PATHS:
        bodies = {r.body for r in receiver.on(path)}
        assert len(bodies) == 1, f"{path} got different bodies on different attempts"
        captured[path] = bodies.pop()
    return Scene(answer["id"], endpoints, deliveries, letter_id, captured, sunset)
