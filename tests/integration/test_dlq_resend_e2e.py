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
from sender.secrets import rotate
from sender.signing import generate_secret
from tests.dlq_factories import letters_for, make_scene
from tests.factories import Receiver, WorkerThread, wait_for


def test_resend_is_delivered_with_the_same_id_and_the_rotated_secret(client, auth, runtime):
    with Receiver() as receiver:
        with runtime.db.begin() as session:
            scene = make_scene(session, runtime.secret_box, url=receiver.url + "/hook")
            (letter_id,) = letters_for(session, scene, 1, attempts=2)
            endpoint = session.get_one(Endpoint, scene.endpoint_id)
            new_secret = generate_secret()
            # The old secret stops signing at once, so only the current one can verify.
            rotate(session, endpoint, new_secret, runtime.secret_box,
                   utcnow() - timedelta(seconds=1), overlap_s=0)
            letter = session.get_one(DeadLetter, letter_id)
            event = session.get_one(Event, letter.event_id)
            event_id, payload, delivery_id = event.id, event.payload, letter.delivery_id
        sent_at = int(time.time())
        response = client.post(f"/v1/dead-letters/{letter_id}/resend", headers=auth)
        assert response.status_code == 200, response.get_json()
        with WorkerThread(runtime):
            wait_for(lambda: receiver.on("/hook"), message="the resend to arrive")
            wait_for(lambda: _state(runtime, delivery_id) == "succeeded",
                     message="the delivery to be recorded as succeeded")
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
        numbers = session.scalars(select(Attempt.n).where(Attempt.delivery_id == delivery_id)
                                  .order_by(Attempt.n)).all()
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
                response = http.post(f"{live_server.url}/v1/dead-letters/{letter_id}/resend",
                                     headers=auth, timeout=30)
                code = (response.json().get("error") or {}).get("code")
                with lock:
                    codes.append((response.status_code, code))

    threads = [threading.Thread(target=operator) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(codes, key=str) == sorted([(200, None)] * 3 +
                                            [(409, "dead_letter_not_open")] * 3, key=str)
    with runtime.db.begin() as session:
        assert sorted(session.scalars(select(Delivery.run))) == [2, 2, 2]
