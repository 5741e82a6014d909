"""Reading events (issue 3 item 5): the partner feed with its filters, and one event."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from app.clock import isoformat, utcnow
from app.models import Attempt, Delivery, Event
from tests.support.publish import (
    error_of,
    make_endpoint,
    make_event_type,
    make_partner,
    order,
)


@pytest.fixture
def acme(client, auth):
    make_event_type(client, auth, "order.created")
    make_event_type(client, auth, "order.paid", schema={"type": "object"})
    make_partner(client, auth, "acme")
    return make_endpoint(client, auth)


def _publish(client, auth, type_="order.created", uid="acme"):
    body = order() if type_ == "order.created" else {"type": type_, "version": 1, "data": {}}
    response = client.post(f"/v1/partners/{uid}/events", headers=auth, json=body)
    assert response.status_code == 202
    return response.get_json()


def _ids(client, auth, query=""):
    response = client.get(f"/v1/partners/acme/events{query}", headers=auth)
    assert response.status_code == 200, response.get_json()
    return [e["id"] for e in response.get_json()["data"]]


def test_list_is_newest_first_and_only_this_partner(client, auth, acme):
    make_partner(client, auth, "globex")
    a = _publish(client, auth)["id"]
    _publish(client, auth, uid="globex")
    b = _publish(client, auth)["id"]
    assert _ids(client, auth) == [b, a]
    page = client.get("/v1/partners/acme/events", headers=auth).get_json()
    item = page["data"][0]
    assert set(item) == {
        "id",
        "type",
        "version",
        "occurred_at",
        "partner",
        "resource",
        "correlation_id",
        "ordering_key",
        "data",
        "created_at",
    }
    assert item["partner"] == "acme" and item["data"] == order()["data"]


def test_filter_by_type(client, auth, acme):
    created = _publish(client, auth)["id"]
    paid = _publish(client, auth, "order.paid")["id"]
    assert _ids(client, auth, "?type=order.paid") == [paid]
    assert _ids(client, auth, "?type=order.created") == [created]


def test_filter_by_since_and_until(client, auth, acme, runtime):
    old, mid, new = (_publish(client, auth)["id"] for _ in range(3))
    base = utcnow() - timedelta(days=3)
    with runtime.db.begin() as session:
        for offset, event_id in enumerate((old, mid, new)):
            session.execute(
                update(Event)
                .where(Event.id == event_id)
                .values(created_at=base + timedelta(days=offset))
            )
    since = isoformat(base + timedelta(hours=12))
    until = isoformat(base + timedelta(days=1, hours=12))
    assert _ids(client, auth, f"?since={since}") == [new, mid]
    assert _ids(client, auth, f"?until={until}") == [mid, old]
    assert _ids(client, auth, f"?since={since}&until={until}") == [mid]


def test_delivery_success_false_lists_what_did_not_arrive(client, auth, acme, runtime):
    make_endpoint(client, auth)
    delivered = _publish(client, auth)
    half = _publish(client, auth)
    failed = _publish(client, auth)
    nothing_to_deliver = _publish(client, auth, "order.paid")
    with runtime.db.begin() as session:
        for event in (delivered, nothing_to_deliver):
            session.execute(
                update(Delivery).where(Delivery.event_id == event["id"]).values(state="succeeded")
            )
        session.execute(
            update(Delivery)
            .where(Delivery.id == half["deliveries"][0]["id"])
            .values(state="succeeded")
        )
        session.execute(
            update(Delivery).where(Delivery.event_id == failed["id"]).values(state="dead")
        )
    assert _ids(client, auth, "?delivery_success=false") == [failed["id"], half["id"]]
    assert _ids(client, auth, "?delivery_success=true") == [
        nothing_to_deliver["id"],
        delivered["id"],
    ]


def test_cursor_pagination_walks_every_event_once(client, auth, acme):
    published = [_publish(client, auth)["id"] for _ in range(7)]
    seen: list[str] = []
    cursor = None
    while True:
        query = "?limit=3" + (f"&cursor={cursor}" if cursor else "")
        page = client.get(f"/v1/partners/acme/events{query}", headers=auth).get_json()
        assert len(page["data"]) <= 3
        seen += [e["id"] for e in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(published))


@pytest.mark.parametrize(
    "query",
    [
        "?limit=251",
        "?limit=0",
        "?limit=x",
        "?since=yesterday",
        "?until=2026-13-01",
        "?delivery_success=maybe",
        "?cursor=garbage!",
        "?cursor=eyJ4IjoxfQ",  # {"x":1}
    ],
)
def test_bad_query_parameters_are_400(client, auth, acme, query):
    response = client.get(f"/v1/partners/acme/events{query}", headers=auth)
    assert response.status_code == 400, query


def test_limit_250_is_allowed(client, auth, acme):
    assert client.get("/v1/partners/acme/events?limit=250", headers=auth).status_code == 200


def test_unknown_partner_feed_is_404(client, auth):
    assert client.get("/v1/partners/ghost/events", headers=auth).status_code == 404


def test_one_event_with_its_deliveries_and_attempts(client, auth, acme, runtime):
    second = make_endpoint(client, auth)
    published = _publish(client, auth)
    first_delivery = next(d["id"] for d in published["deliveries"] if d["endpoint"] == acme["id"])
    started = utcnow()
    with runtime.db.begin() as session:
        session.add(
            Attempt(
                delivery_id=first_delivery,
                n=1,
                started_at=started,
                duration_ms=12,
                url=acme["url"],
                request_headers={},
                response_status=500,
                response_body=b"oops \xff\xfe",
                error=None,
            )
        )
        session.execute(
            update(Delivery)
            .where(Delivery.id == first_delivery)
            .values(state="retrying", attempt_count=1, last_status_code=500)
        )
    response = client.get(f"/v1/events/{published['id']}", headers=auth)
    assert response.status_code == 200
    body = response.get_json()
    assert body["id"] == published["id"] and body["partner"] == "acme"
    assert body["data"] == order()["data"]
    by_endpoint = {d["endpoint"]: d for d in body["deliveries"]}
    assert set(by_endpoint) == {acme["id"], second["id"]}
    tried = by_endpoint[acme["id"]]
    assert set(tried) == {
        "id",
        "event",
        "endpoint",
        "version",
        "state",
        "attempt_count",
        "next_attempt_at",
        "last_status_code",
        "last_error",
        "ordering",
        "created_at",
        "updated_at",
        "attempts",
    }
    assert (tried["state"], tried["attempt_count"], tried["event"]) == (
        "retrying",
        1,
        published["id"],
    )
    assert tried["attempts"] == [
        {
            "n": 1,
            "started_at": isoformat(started),
            "duration_ms": 12,
            "response_status": 500,
            "response_body": "oops \ufffd\ufffd",
            "response_headers": None,
            "error": None,
        }
    ]
    assert by_endpoint[second["id"]]["attempts"] == []


def test_unknown_event_is_404(client, auth):
    response = client.get("/v1/events/evt_NOPE", headers=auth)
    assert response.status_code == 404
    assert error_of(response)["code"] == "not_found"
