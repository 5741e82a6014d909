"""End to end against real HTTP receivers on 127.0.0.1: RQ worker, engine, sweeper, database."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select
from standardwebhooks.webhooks import Webhook

from app.clock import utcnow
from app.models import (
    DEAD,
    RETRYING,
    SUCCEEDED,
    Attempt,
    DeadLetter,
    Delivery,
    Endpoint,
    OperationalEvent,
)
from app.registry.secrets import rotate
from app.runtime import Runtime
from app.signing import generate_secret
from sender.dispatch import enqueue_now
from tests.support.factories import (
    Receiver,
    SweeperThread,
    WorkerThread,
    make_endpoint,
    make_event_with_deliveries,
    make_events,
    make_partner,
    wait_for,
)

# Run once more through PgBouncer in transaction mode (tests/conftest.py).
pytestmark = pytest.mark.pgbouncer

FAST_SCHEDULE = (1, 1, 1)


def _states(rt: Runtime, ids: list[str]) -> dict[str, str]:
    with rt.db.begin() as session:
        return dict(
            session.execute(select(Delivery.id, Delivery.state).where(Delivery.id.in_(ids))).all()
        )


def _all_in(rt: Runtime, ids: list[str], *states: str) -> bool:
    found = _states(rt, ids)
    return len(found) == len(ids) and all(s in states for s in found.values())


def test_delivered_request_is_signed_and_verifies_with_standardwebhooks(make_rt):
    rt = make_rt()
    with Receiver() as receiver:
        with rt.db.begin() as session:
            partner = make_partner(session, "acme")
            endpoint = make_endpoint(
                session,
                partner,
                receiver.url + "/hook",
                rt.secret_box,
                headers={"X-Partner-Token": "abc", "X-Trace": "t1"},
            )
            secret = endpoint.test_secret
            event, deliveries = make_event_with_deliveries(session, partner, [endpoint])
            ids = [d.id for d in deliveries]
        enqueue_now(rt.redis, ids)
        with WorkerThread(rt):
            wait_for(lambda: _all_in(rt, ids, SUCCEEDED), message="delivery succeeded")
        [request] = receiver.on("/hook")
    headers = request.headers
    assert headers["webhook-id"] == event.id
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"].startswith("Kurir/")
    assert headers["x-trace"] == "t1"
    assert request.body == event.payload.encode()
    payload = Webhook(secret).verify(
        request.body,
        {
            "webhook-id": headers["webhook-id"],
            "webhook-timestamp": headers["webhook-timestamp"],
            "webhook-signature": headers["webhook-signature"],
        },
    )
    assert payload["id"] == event.id and payload["partner"] == "acme"
    with rt.db.begin() as session:
        [attempt] = session.scalars(select(Attempt)).all()
        assert attempt.n == 1 and attempt.response_status == 200
        assert attempt.response_body == b"ok"
        assert attempt.request_headers["X-Partner-Token"] == "[redacted]"
        delivery = session.get(Delivery, ids[0])
        assert delivery.attempt_count == 1 and delivery.lease_expires_at is None
        assert session.get(Endpoint, endpoint.id).last_success_at is not None


def test_500_then_success_on_retry_with_fresh_timestamp_and_same_id(make_rt):
    rt = make_rt(retry_schedule=FAST_SCHEDULE, retry_jitter=0.0)

    def reply(received: Any, count: int) -> tuple[int, dict[str, str], bytes]:
        return (500, {}, b"boom") if count == 1 else (200, {}, b"ok")

    with Receiver(reply) as receiver:
        with rt.db.begin() as session:
            partner = make_partner(session)
            endpoint = make_endpoint(session, partner, receiver.url + "/h", rt.secret_box)
            event, deliveries = make_event_with_deliveries(session, partner, [endpoint])
            ids = [d.id for d in deliveries]
        enqueue_now(rt.redis, ids)
        # No sweeper runs: only the worker's own timer can fire the retry.
        with WorkerThread(rt):
            wait_for(lambda: _all_in(rt, ids, SUCCEEDED), timeout_s=30, message="success on retry")
        first, second = receiver.on("/h")
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == event.id
    assert first.headers["webhook-timestamp"] != second.headers["webhook-timestamp"] or (
        first.headers["webhook-signature"] != second.headers["webhook-signature"]
    )
    # The retry waited its scheduled second (it is due 1 s after the first answer).
    assert second.at - first.at >= 1.0
    with rt.db.begin() as session:
        attempts = session.scalars(select(Attempt).order_by(Attempt.n)).all()
        assert [(a.n, a.response_status) for a in attempts] == [(1, 500), (2, 200)]
        assert attempts[0].response_body == b"boom"
        delivery = session.get(Delivery, ids[0])
        assert delivery.state == SUCCEEDED and delivery.attempt_count == 2
        assert session.get(Endpoint, endpoint.id).consecutive_failures == 0


def test_exhausted_retries_open_a_dead_letter(make_rt):
    rt = make_rt(retry_schedule=(1, 1), retry_jitter=0.0)
    with Receiver(lambda r, c: (503, {}, b"down")) as receiver:
        with rt.db.begin() as session:
            partner = make_partner(session)
            endpoint = make_endpoint(session, partner, receiver.url + "/h", rt.secret_box)
            event, deliveries = make_event_with_deliveries(session, partner, [endpoint])
            ids = [d.id for d in deliveries]
        enqueue_now(rt.redis, ids)
        with WorkerThread(rt):
            wait_for(lambda: _all_in(rt, ids, DEAD), timeout_s=30, message="dead")
        assert len(receiver.on("/h")) == 3
    with rt.db.begin() as session:
        [letter] = session.scalars(select(DeadLetter)).all()
        assert letter.reason == "retries_exhausted"
        assert letter.last_status_code == 503
        assert letter.event_id == event.id and letter.endpoint_id == endpoint.id
        assert [a.action for a in letter.audit] == ["park"]
        assert session.scalar(select(func.count()).select_from(Attempt)) == 3


def test_410_disables_the_endpoint_and_parks_its_waiting_deliveries(make_rt):
    rt = make_rt()
    with Receiver(lambda r, c: (410, {}, b"gone")) as receiver:
        with rt.db.begin() as session:
            partner = make_partner(session)
            endpoint = make_endpoint(session, partner, receiver.url + "/h", rt.secret_box)
            _, first = make_event_with_deliveries(session, partner, [endpoint])
            # Another delivery waiting for a retry later: parked when the endpoint goes.
            _, waiting = make_event_with_deliveries(session, partner, [endpoint], state=RETRYING)
            session.get(Delivery, waiting[0].id).next_attempt_at = waiting[0].created_at.replace(
                year=2099
            )
        enqueue_now(rt.redis, [first[0].id])
        with WorkerThread(rt):
            wait_for(
                lambda: _all_in(rt, [first[0].id, waiting[0].id], DEAD),
                timeout_s=30,
                message="both parked",
            )
        assert len(receiver.requests) == 1
    with rt.db.begin() as session:
        ep = session.get(Endpoint, endpoint.id)
        assert ep.state == "disabled" and ep.disabled_reason.startswith("gone")
        letters = session.scalars(select(DeadLetter)).all()
        assert {letter.reason for letter in letters} == {"endpoint_disabled"}
        assert len(letters) == 2
        [op] = session.scalars(select(OperationalEvent)).all()
        assert op.kind == "endpoint.disabled" and op.subject_id == endpoint.id


def test_auto_disable_after_n_consecutive_failures_parks_the_rest(make_rt):
    rt = make_rt(
        retry_schedule=(1,) * 10,
        retry_jitter=0.0,
        disable_after_failures=3,
        disable_after_seconds=0,
    )
    with Receiver(lambda r, c: (500, {}, b"")) as receiver:
        with rt.db.begin() as session:
            partner = make_partner(session)
            endpoint = make_endpoint(session, partner, receiver.url + "/h", rt.secret_box)
            _, deliveries = make_event_with_deliveries(session, partner, [endpoint])
            ids = [d.id for d in deliveries]
        enqueue_now(rt.redis, ids)
        with WorkerThread(rt):
            wait_for(lambda: _all_in(rt, ids, DEAD), timeout_s=30, message="parked")
        assert len(receiver.on("/h")) == 3
    with rt.db.begin() as session:
        ep = session.get(Endpoint, endpoint.id)
        assert ep.state == "disabled" and ep.consecutive_failures == 3
        assert ep.disabled_reason.startswith("failing")
        [letter] = session.scalars(select(DeadLetter)).all()
        assert letter.reason == "endpoint_disabled" and letter.last_status_code == 500
        [op] = session.scalars(select(OperationalEvent)).all()
        assert op.kind == "endpoint.disabled"
        assert op.data["consecutive_failures"] == 3


def test_deliveries_for_a_disabled_endpoint_are_parked_not_sent(make_rt):
    rt = make_rt()
    with Receiver() as receiver:
        with rt.db.begin() as session:
            partner = make_partner(session)
            endpoint = make_endpoint(
                session, partner, receiver.url + "/h", rt.secret_box, state="disabled"
            )
            ids = make_events(session, partner, [endpoint], 3)
        enqueue_now(rt.redis, ids)
        with WorkerThread(rt):
            wait_for(lambda: _all_in(rt, ids, DEAD), message="parked")
        assert receiver.requests == []
    with rt.db.begin() as session:
        letters = session.scalars(select(DeadLetter)).all()
        assert len(letters) == 3 and {x.reason for x in letters} == {"endpoint_disabled"}


def test_many_deliveries_to_several_endpoints_all_arrive_once(make_rt):
    rt = make_rt()
    with Receiver() as receiver:
        with rt.db.begin() as session:
            partner = make_partner(session)
            endpoints = [
                make_endpoint(session, partner, f"{receiver.url}/e{i}", rt.secret_box)
                for i in range(3)
            ]
            ids = make_events(session, partner, endpoints, 100)
        enqueue_now(rt.redis, ids)
        with WorkerThread(rt), SweeperThread(rt):
            wait_for(lambda: _all_in(rt, ids, SUCCEEDED), timeout_s=60, message="all delivered")
        assert len(receiver.requests) == 300
        for i in range(3):
            assert len(set(receiver.event_ids(f"/e{i}"))) == 100


def test_a_rotated_secret_and_a_moved_url_apply_to_the_very_next_delivery(make_rt):
    """The worker keeps no stale copy of an endpoint: a partner that switches to the new
    secret at once must not see a delivery signed only with the old one."""
    rt = make_rt()
    with Receiver() as receiver:
        with rt.db.begin() as session:
            partner = make_partner(session, "acme")
            endpoint = make_endpoint(session, partner, receiver.url + "/old", rt.secret_box)
            endpoint_id = endpoint.id
            _, first = make_event_with_deliveries(session, partner, [endpoint])
        with WorkerThread(rt):
            enqueue_now(rt.redis, [first[0].id])
            wait_for(lambda: receiver.on("/old"), message="the first delivery")
            new_secret = generate_secret()
            with rt.db.begin() as session:
                endpoint = session.get_one(Endpoint, endpoint_id)
                rotate(session, endpoint, new_secret, rt.secret_box, utcnow(), overlap_s=3600)
                endpoint.url = receiver.url + "/new"
            with rt.db.begin() as session:
                endpoint = session.get_one(Endpoint, endpoint_id)
                _, second = make_event_with_deliveries(session, endpoint.partner, [endpoint])
            enqueue_now(rt.redis, [second[0].id])
            [request] = wait_for(lambda: receiver.on("/new"), message="the second delivery")
    Webhook(new_secret).verify(request.body, request.headers)
    assert len(request.headers["webhook-signature"].split()) == 2  # new and old, overlapping
    assert len(receiver.on("/old")) == 1
