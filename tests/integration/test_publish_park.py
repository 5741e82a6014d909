"""sender.park: the one way a delivery becomes dead, shared by publishing and the engine."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from app.clock import utcnow
from app.models import DeadLetter, DeadLetterAudit, Delivery, Endpoint, Event
from sender.park import park
from tests.support.publish import (
    make_endpoint,
    make_event_type,
    make_partner,
    order,
)


@pytest.fixture
def pending(client, auth):
    make_event_type(client, auth)
    make_partner(client, auth)
    make_endpoint(client, auth)
    return client.post("/v1/partners/acme/events", headers=auth, json=order()).get_json()


def test_park_kills_the_delivery_and_opens_one_audited_letter(runtime, pending):
    delivery_id = pending["deliveries"][0]["id"]
    with runtime.db.begin() as session:
        delivery = session.get(Delivery, delivery_id)
        delivery.lease_expires_at = utcnow() + timedelta(seconds=60)
        event = session.get(Event, pending["id"])
        endpoint = session.get(Endpoint, delivery.endpoint_id)
        letter = park(
            session,
            delivery,
            event,
            endpoint,
            "retries_exhausted",
            last_status_code=503,
            last_error="http_503",
        )
        assert isinstance(letter, DeadLetter)
    with runtime.db.Session() as session:
        delivery = session.get(Delivery, delivery_id)
        assert delivery.state == "dead"
        assert delivery.next_attempt_at is None and delivery.lease_expires_at is None
        assert (delivery.last_status_code, delivery.last_error) == (503, "http_503")
        [stored] = session.scalars(select(DeadLetter)).all()
        assert stored.id == letter.id and stored.state == "open"
        assert (stored.reason, stored.last_status_code, stored.last_error) == (
            "retries_exhausted",
            503,
            "http_503",
        )
        assert stored.search_text == session.get(Event, pending["id"]).payload
        assert stored.event_type == "order.created"
        [audit] = session.scalars(select(DeadLetterAudit)).all()
        assert (audit.actor, audit.action, audit.outcome) == ("system", "park", "retries_exhausted")


def test_park_keeps_the_delivery_last_outcome_when_none_is_given(runtime, pending):
    delivery_id = pending["deliveries"][0]["id"]
    with runtime.db.begin() as session:
        delivery = session.get(Delivery, delivery_id)
        delivery.last_status_code, delivery.last_error = 500, "http_500"
        letter = park(
            session,
            delivery,
            session.get(Event, pending["id"]),
            session.get(Endpoint, delivery.endpoint_id),
            "endpoint_disabled",
        )
        assert (letter.last_status_code, letter.last_error) == (500, "http_500")


def test_a_delivery_has_at_most_one_open_letter(runtime, pending):
    delivery_id = pending["deliveries"][0]["id"]

    def park_twice() -> None:
        with runtime.db.begin() as session:
            delivery = session.get(Delivery, delivery_id)
            event = session.get(Event, pending["id"])
            endpoint = session.get(Endpoint, delivery.endpoint_id)
            park(session, delivery, event, endpoint, "retries_exhausted")
            session.flush()
            park(session, delivery, event, endpoint, "retries_exhausted")

    with pytest.raises(IntegrityError):
        park_twice()
    with runtime.db.Session() as session:
        assert session.scalars(select(DeadLetter)).all() == []
