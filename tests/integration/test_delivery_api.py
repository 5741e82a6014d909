"""GET /v1/deliveries/{id} and POST /v1/deliveries/{id}/retry, through the Flask app."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from app.accounts import create_api_key
from app.clock import utcnow
from app.models import DEAD, PENDING, RETRYING, SUCCEEDED, DeadLetter, Delivery
from app.runtime import Runtime
from sender.dispatch import enqueue_now
from tests.support.dlq_factories import Scene, letters_for, make_scene
from tests.support.factories import (
    Receiver,
    WorkerThread,
    make_endpoint,
    make_event_with_deliveries,
    make_partner,
    wait_for,
)


def _state(runtime, delivery_id):
    with runtime.db.begin() as session:
        return session.get(Delivery, delivery_id).state


def test_get_delivery_shows_every_attempt_in_the_spec_shape(runtime, client, auth):
    calls = iter([(500, {}, b"first failed"), (200, {}, b"fine")])
    rt = runtime
    # The worker's schedule waits an hour after a failure: only the retry call can send it.
    worker_rt = Runtime(rt.settings.with_overrides(retry_schedule=(3600,)), database=rt.db)
    with Receiver(lambda r, c: next(calls)) as receiver:
        with rt.db.begin() as session:
            partner = make_partner(session)
            endpoint = make_endpoint(session, partner, receiver.url + "/h", rt.secret_box)
            event, [delivery] = make_event_with_deliveries(session, partner, [endpoint])
        enqueue_now(rt.redis, [delivery.id])
        with WorkerThread(worker_rt):
            wait_for(lambda: _state(rt, delivery.id) == RETRYING, message="first failure")
            response = client.post(f"/v1/deliveries/{delivery.id}/retry", headers=auth)
            assert response.status_code == 202, response.get_json()
            wait_for(
                lambda: _state(rt, delivery.id) == SUCCEEDED, timeout_s=30, message="retried now"
            )
    worker_rt.close()
    body = client.get(f"/v1/deliveries/{delivery.id}", headers=auth).get_json()
    assert {
        "id",
        "event",
        "endpoint",
        "state",
        "attempt_count",
        "next_attempt_at",
        "attempts",
    } <= set(body)
    assert body["id"] == delivery.id and body["event"] == event.id
    assert body["endpoint"] == endpoint.id and body["state"] == "succeeded"
    assert body["attempt_count"] == 2 and body["next_attempt_at"] is None
    first, second = body["attempts"]
    assert set(first) == {
        "n",
        "started_at",
        "duration_ms",
        "response_status",
        "response_body",
        "response_headers",
        "error",
    }
    assert (first["n"], first["response_status"], first["response_body"]) == (
        1,
        500,
        "first failed",
    )
    assert (second["n"], second["response_status"]) == (2, 200)
    assert first["started_at"].endswith("Z") and isinstance(first["duration_ms"], int)


def _dead_delivery(runtime, url: str, state: str = "enabled") -> tuple[Scene, str, str]:
    """A dead delivery parked with an open dead letter, on an endpoint in `state`."""
    with runtime.db.begin() as session:
        scene = make_scene(session, runtime.secret_box, url=url, state=state)
        (letter_id,) = letters_for(session, scene, 1, attempts=2)
        delivery_id = session.get_one(DeadLetter, letter_id).delivery_id
    return scene, letter_id, delivery_id


def test_retry_of_a_dead_delivery_resends_it_once_its_endpoint_is_enabled(runtime, client, auth):
    with Receiver() as receiver:
        scene, letter_id, delivery_id = _dead_delivery(
            runtime, receiver.url + "/hook", state="disabled"
        )
        refused = client.post(f"/v1/deliveries/{delivery_id}/retry", headers=auth)
        assert refused.status_code == 409
        error = refused.get_json()["error"]
        assert error["code"] == "endpoint_disabled" and "force" in error["message"]
        assert (
            client.get(f"/v1/dead-letters/{letter_id}", headers=auth).get_json()["state"] == "open"
        )
        assert (
            client.post(
                f"/v1/partners/{scene.partner_uid}/endpoints/{scene.endpoint_id}/enable",
                headers=auth,
            ).status_code
            == 200
        )
        with WorkerThread(runtime):
            response = client.post(f"/v1/deliveries/{delivery_id}/retry", headers=auth)
            assert response.status_code == 202, response.get_json()
            body = response.get_json()
            # The running worker may already have taken it by the time the answer is read.
            assert body["id"] == delivery_id
            assert body["state"] in (PENDING, "delivering", SUCCEEDED)
            wait_for(lambda: _state(runtime, delivery_id) == SUCCEEDED, message="resent")
        [request] = receiver.on("/hook")
    letter = client.get(f"/v1/dead-letters/{letter_id}", headers=auth).get_json()
    assert letter["state"] == "resent" and letter["run"] == 2
    last = letter["audit"][-1]
    assert (last["actor"], last["action"]) == ("key:test-admin", "resend")
    assert last["outcome"] == "resent as run 2"
    delivery = client.get(f"/v1/deliveries/{delivery_id}", headers=auth).get_json()
    assert delivery["state"] == SUCCEEDED and delivery["attempt_count"] == 3
    assert request.headers["webhook-id"] == delivery["event"]


@pytest.mark.parametrize(("query", "body"), [("?force=true", None), ("", {"force": True})])
def test_forced_retry_of_a_dead_delivery_goes_to_a_disabled_endpoint(
    runtime, client, auth, query, body
):
    _, letter_id, delivery_id = _dead_delivery(runtime, "http://127.0.0.1:9/h", state="disabled")
    response = client.post(f"/v1/deliveries/{delivery_id}/retry{query}", json=body, headers=auth)
    assert response.status_code == 202, response.get_json()
    assert response.get_json()["state"] == PENDING
    letter = client.get(f"/v1/dead-letters/{letter_id}", headers=auth).get_json()
    assert letter["state"] == "resent"
    assert letter["audit"][-1]["outcome"] == "resent as run 2 (forced: endpoint disabled)"
    with runtime.db.begin() as session:
        assert session.get_one(Delivery, delivery_id).forced is True
    assert runtime.redis.llen("rq:queue:kurir-deliveries") == 1


def test_retry_of_a_dead_delivery_whose_letter_was_discarded_is_a_clear_409(runtime, client, auth):
    _, letter_id, delivery_id = _dead_delivery(runtime, "http://127.0.0.1:9/h")
    assert (
        client.post(
            f"/v1/dead-letters/{letter_id}/discard", headers=auth, json={"note": "sent by hand"}
        ).status_code
        == 200
    )
    response = client.post(f"/v1/deliveries/{delivery_id}/retry", headers=auth)
    assert response.status_code == 409
    error = response.get_json()["error"]
    assert error["code"] == "dead_letter_not_open" and "discarded" in error["message"]
    assert error["details"] == {
        "delivery": delivery_id,
        "dead_letter": letter_id,
        "state": "discarded",
    }
    assert _state(runtime, delivery_id) == DEAD
    assert runtime.redis.llen("rq:queue:kurir-deliveries") == 0


def test_retry_rejects_a_force_that_is_not_a_boolean(runtime, client, auth):
    _, letter_id, delivery_id = _dead_delivery(runtime, "http://127.0.0.1:9/h", state="disabled")
    response = client.post(
        f"/v1/deliveries/{delivery_id}/retry", json={"force": "yes"}, headers=auth
    )
    assert response.status_code == 422
    assert response.get_json()["error"]["details"] == {"parameter": "force"}
    assert client.get(f"/v1/dead-letters/{letter_id}", headers=auth).get_json()["state"] == "open"


def test_retry_of_a_succeeded_delivery_sends_it_again_as_a_new_run(runtime, client, auth):
    with Receiver() as receiver:
        with runtime.db.begin() as session:
            partner = make_partner(session)
            endpoint = make_endpoint(session, partner, receiver.url + "/h", runtime.secret_box)
            _, [delivery] = make_event_with_deliveries(
                session, partner, [endpoint], state=SUCCEEDED
            )
            session.get(Delivery, delivery.id).attempt_count = 1
        with WorkerThread(runtime):
            assert (
                client.post(f"/v1/deliveries/{delivery.id}/retry", headers=auth).status_code == 202
            )
            wait_for(lambda: len(receiver.requests) == 1, message="sent again")
            wait_for(lambda: _state(runtime, delivery.id) == SUCCEEDED, message="recorded")
    with runtime.db.begin() as session:
        row = session.get(Delivery, delivery.id)
        assert row.run == 2 and row.attempt_count == 2 and row.run_attempts == 1


def test_retry_makes_a_waiting_delivery_due_now(runtime, client, auth):
    with runtime.db.begin() as session:
        partner = make_partner(session)
        endpoint = make_endpoint(session, partner, "http://127.0.0.1:9/h", runtime.secret_box)
        _, [delivery] = make_event_with_deliveries(
            session,
            partner,
            [endpoint],
            state=RETRYING,
            next_attempt_at=utcnow() + timedelta(hours=3),
        )
    before = utcnow()
    response = client.post(f"/v1/deliveries/{delivery.id}/retry", headers=auth)
    assert response.status_code == 202
    body = response.get_json()
    assert body["state"] == RETRYING
    with runtime.db.begin() as session:
        row = session.get(Delivery, delivery.id)
        assert row.next_attempt_at <= utcnow() and row.next_attempt_at >= before
        assert session.scalar(select(DeadLetter.id)) is None
    # And a job for it is on the queue.
    assert runtime.redis.llen("rq:queue:kurir-deliveries") == 1


def test_unknown_delivery_is_404_and_scopes_are_enforced(runtime, client, auth):
    assert client.get("/v1/deliveries/dlv_nope", headers=auth).status_code == 404
    assert client.post("/v1/deliveries/dlv_nope/retry", headers=auth).status_code == 404
    with runtime.db.begin() as session:
        _, token = create_api_key(session, "reader", ["read"])
        partner = make_partner(session)
        endpoint = make_endpoint(session, partner, "http://127.0.0.1:9/h", runtime.secret_box)
        _, [delivery] = make_event_with_deliveries(session, partner, [endpoint], state=PENDING)
    reader = {"Authorization": f"Bearer {token}"}
    assert client.get(f"/v1/deliveries/{delivery.id}", headers=reader).status_code == 200
    assert client.post(f"/v1/deliveries/{delivery.id}/retry", headers=reader).status_code == 403
    assert client.get(f"/v1/deliveries/{delivery.id}").status_code == 401
