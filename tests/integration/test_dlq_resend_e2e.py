"""A resent dead letter really arrives: same webhook-id, current secret, fresh timestamp."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import requests
from sqlalchemy import select
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from app.clock import utcnow
from app.models import Attempt, DeadLetter, Delivery, Endpoint, Event
from app.registry.secrets import rotate
from app.signing import generate_secret
from tests.support.dlq_factories import letters_for, make_scene
from tests.support.factories import Receiver, WorkerThread, wait_for


def test_resend_is_delivered_with_the_same_id_and_the_rotated_secret(client, auth, runtime):
    with Receiver() as receiver:
        with runtime.db.begin() as session:
            scene = make_scene(session, runtime.secret_box, url=receiver.url + "/hook")
            (letter_id,) = letters_for(session, scene, 1, attempts=2)
            endpoint = session.get_one(Endpoint, scene.endpoint_id)
            new_secret = generate_secret()
            # The old secret stops signing at once, so only the current one can verify.
            rotate(
                session,
                endpoint,
                new_secret,
                runtime.secret_box,
                utcnow() - timedelta(seconds=1),
                overlap_s=0,
            )
            letter = session.get_one(DeadLetter, letter_id)
            event = session.get_one(Event, letter.event_id)
            event_id, payload, delivery_id = event.id, event.payload, letter.delivery_id
        sent_at = int(time.time())
        response = client.post(f"/v1/dead-letters/{letter_id}/resend", headers=auth)
        assert response.status_code == 200, response.get_json()
        with WorkerThread(runtime):
            wait_for(lambda: receiver.on("/hook"), message="the resend to arrive")
            wait_for(
                lambda: _state(runtime, delivery_id) == "succeeded",
                message="the delivery to be recorded as succeeded",
            )
        [request] = receiver.on("/hook")
    assert request.headers["webhook-id"] == event_id
    assert request.body.decode() == payload
    assert int(request.headers["webhook-timestamp"]) >= sent_at - 1
    Webhook(new_secret).verify(request.body, request.headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(scene.secret).verify(request.body, request.headers)  # rotated out
    with runtime.db.begin() as session:
        delivery = session.get_one(Delivery, delivery_id)
        assert (delivery.run, delivery.attempt_count) == (2, 3)
        numbers = session.scalars(
            select(Attempt.n).where(Attempt.delivery_id == delivery_id).order_by(Attempt.n)
        ).all()
        assert list(numbers) == [1, 2, 3]


def _state(runtime, delivery_id: str) -> str:
    with runtime.db.begin() as session:
        return session.get_one(Delivery, delivery_id).state


def test_two_concurrent_http_resends_of_one_letter_make_one_run(live_server, auth, runtime):
    with runtime.db.begin() as session:
        scene = make_scene(session, runtime.secret_box)
        letter_ids = letters_for(session, scene, 3)
    barrier = threading.Barrier(2)
    codes: list[tuple[int, str | None]] = []
    lock = threading.Lock()

    def operator() -> None:
        with requests.Session() as http:
            for letter_id in letter_ids:
                barrier.wait(10)
                response = http.post(
                    f"{live_server.url}/v1/dead-letters/{letter_id}/resend",
                    headers=auth,
                    timeout=30,
                )
                code = (response.json().get("error") or {}).get("code")
                with lock:
                    codes.append((response.status_code, code))

    threads = [threading.Thread(target=operator) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(codes, key=str) == sorted(
        [(200, None)] * 3 + [(409, "dead_letter_not_open")] * 3, key=str
    )
    with runtime.db.begin() as session:
        assert sorted(session.scalars(select(Delivery.run))) == [2, 2, 2]


def _open_letters(runtime, delivery_id: str) -> list[DeadLetter]:
    with runtime.db.begin() as session:
        return list(
            session.scalars(
                select(DeadLetter).where(
                    DeadLetter.delivery_id == delivery_id, DeadLetter.state == "open"
                )
            )
        )


def test_forced_resend_reaches_a_disabled_endpoint_which_stays_disabled(client, auth, runtime):
    with Receiver() as receiver:
        with runtime.db.begin() as session:
            scene = make_scene(
                session, runtime.secret_box, url=receiver.url + "/hook", state="disabled"
            )
            (letter_id,) = letters_for(session, scene, 1, reason="endpoint_disabled")
            letter = session.get_one(DeadLetter, letter_id)
            event_id, delivery_id = letter.event_id, letter.delivery_id
        refused = client.post(f"/v1/dead-letters/{letter_id}/resend", headers=auth)
        assert refused.status_code == 409
        forced = client.post(
            f"/v1/dead-letters/{letter_id}/resend", headers=auth, json={"force": True}
        )
        assert forced.status_code == 200, forced.get_json()
        with WorkerThread(runtime):
            wait_for(
                lambda: _state(runtime, delivery_id) == "succeeded",
                message="the forced resend to be delivered",
            )
        [request] = receiver.on("/hook")
    assert request.headers["webhook-id"] == event_id
    Webhook(scene.secret).verify(request.body, request.headers)
    with runtime.db.begin() as session:
        endpoint = session.get_one(Endpoint, scene.endpoint_id)
        assert endpoint.state == "disabled"  # enabling stays an operator's decision
        assert session.get_one(DeadLetter, letter_id).state == "resent"


def test_a_failing_forced_resend_is_tried_once_and_parked_again(client, auth, runtime):
    with Receiver(reply=lambda received, count: (503, {}, b"still down")) as receiver:
        with runtime.db.begin() as session:
            scene = make_scene(
                session, runtime.secret_box, url=receiver.url + "/hook", state="disabled"
            )
            (letter_id,) = letters_for(session, scene, 1, reason="endpoint_disabled")
            delivery_id = session.get_one(DeadLetter, letter_id).delivery_id
        forced = client.post(
            f"/v1/dead-letters/{letter_id}/resend", headers=auth, json={"force": True}
        )
        assert forced.status_code == 200, forced.get_json()
        with WorkerThread(runtime):
            [again] = wait_for(
                lambda: _open_letters(runtime, delivery_id),
                message="the failed forced run to be parked again",
            )
            time.sleep(0.5)  # a second attempt, if one were made, would show by now
        assert len(receiver.on("/hook")) == 1
    assert (again.reason, again.last_status_code) == ("endpoint_disabled", 503)
    with runtime.db.begin() as session:
        delivery = session.get_one(Delivery, delivery_id)
        assert (delivery.state, delivery.run, delivery.run_attempts) == ("dead", 2, 1)


def test_an_unforced_resend_after_enabling_is_not_marked_forced(client, auth, runtime):
    with runtime.db.begin() as session:
        scene = make_scene(session, runtime.secret_box, state="disabled")
        forced_id, plain_id = letters_for(session, scene, 2, reason="endpoint_disabled")
    assert (
        client.post(
            f"/v1/dead-letters/{forced_id}/resend", headers=auth, json={"force": True}
        ).status_code
        == 200
    )
    assert (
        client.post(
            f"/v1/partners/{scene.partner_uid}/endpoints/{scene.endpoint_id}/enable", headers=auth
        ).status_code
        == 200
    )
    assert client.post(f"/v1/dead-letters/{plain_id}/resend", headers=auth).status_code == 200
    with runtime.db.begin() as session:
        flags = {
            letter.id: session.get_one(Delivery, letter.delivery_id).forced
            for letter in session.scalars(select(DeadLetter))
        }
    assert flags == {forced_id: True, plain_id: False}
