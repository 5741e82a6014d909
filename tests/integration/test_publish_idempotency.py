"""Idempotency-Key (issue 3 item 4): replay, reuse, scope, expiry and concurrency."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
import requests
from rq import Queue
from sqlalchemy import func, select, text

from app.accounts import create_api_key
from app.clock import utcnow
from app.ids import new_id
from app.intake import publish as publish_module
from app.intake.idempotency import request_hash
from app.intake.publish import publish_in_transaction
from app.models import Event, IdempotencyKey
from app.queues import DELIVERIES
from tests.support.publish import (
    counts,
    error_of,
    make_partner,
    order,
)

# Run once more through PgBouncer in transaction mode (tests/conftest.py).
pytestmark = pytest.mark.pgbouncer


def _post(client, auth, body, key):
    return client.post(
        "/v1/partners/acme/events", json=body, headers={**auth, "Idempotency-Key": key}
    )


def test_same_key_same_body_replays_the_first_answer(client, auth, acme, runtime, redis_client):
    first = _post(client, auth, order(), "k-1")
    assert first.status_code == 202 and "Idempotent-Replayed" not in first.headers
    after_first = counts(runtime.db)
    second = _post(client, auth, order(), "k-1")
    assert second.status_code == 202
    assert second.get_json() == first.get_json()
    assert second.headers["Idempotent-Replayed"] == "true"
    assert counts(runtime.db) == after_first
    assert after_first["events"] == 1 and after_first["deliveries"] == 1
    assert len(Queue(DELIVERIES, connection=redis_client).jobs) == 1


def test_key_is_stored_with_the_event_and_response(client, auth, acme, runtime):
    body = _post(client, auth, order(), "k-1").get_json()
    with runtime.db.Session() as session:
        [row] = session.scalars(select(IdempotencyKey)).all()
    assert row.event_id == body["id"] and row.response_body == body
    assert row.response_status == 202 and row.key == "k-1"
    assert row.request_hash == request_hash("acme", order())
    ttl = runtime.settings.idempotency_ttl_seconds
    assert row.expires_at - row.created_at == timedelta(seconds=ttl)


def test_body_is_compared_canonically(client, auth, acme, runtime):
    first = _post(client, auth, order(), "k-1").get_json()
    reordered = json.dumps(
        {"data": {"amount": 100, "order_id": "o-1"}, "version": 1, "type": "order.created"},
        indent=2,
    )
    replay = client.post(
        "/v1/partners/acme/events",
        data=reordered,
        headers={**auth, "Idempotency-Key": "k-1", "Content-Type": "application/json"},
    )
    assert replay.status_code == 202 and replay.get_json()["id"] == first["id"]
    assert counts(runtime.db)["events"] == 1


def test_same_key_other_body_is_422_reused(client, auth, acme, runtime):
    _post(client, auth, order(amount=1), "k-1")
    response = _post(client, auth, order(amount=2), "k-1")
    assert response.status_code == 422
    assert error_of(response)["code"] == "idempotency_key_reused"
    assert counts(runtime.db)["events"] == 1


def test_same_key_for_another_partner_is_reuse(client, auth, acme):
    make_partner(client, auth, "globex")
    _post(client, auth, order(), "k-1")
    response = client.post(
        "/v1/partners/globex/events", json=order(), headers={**auth, "Idempotency-Key": "k-1"}
    )
    assert response.status_code == 422
    assert error_of(response)["code"] == "idempotency_key_reused"


def test_keys_are_scoped_to_the_api_key(client, auth, acme, runtime):
    with runtime.db.begin() as session:
        _, other = create_api_key(session, "other-service", ["events:write"])
    first = _post(client, auth, order(), "shared")
    second = _post(client, {"Authorization": f"Bearer {other}"}, order(), "shared")
    assert second.status_code == 202 and second.get_json()["id"] != first.get_json()["id"]
    assert counts(runtime.db)["idempotency_keys"] == 2


def test_rejected_request_does_not_burn_the_key(client, auth, acme, runtime):
    bad = _post(client, auth, {"type": "order.created", "version": 1, "data": {}}, "k-1")
    assert bad.status_code == 422
    assert counts(runtime.db)["idempotency_keys"] == 0
    assert _post(client, auth, order(), "k-1").status_code == 202


@pytest.mark.parametrize(("key", "status"), [("x" * 255, 202), ("x" * 256, 400), ("", 400)])
def test_key_length_limit(client, auth, acme, key, status):
    response = _post(client, auth, order(), key)
    assert response.status_code == status
    if status == 400:
        assert error_of(response)["code"] == "invalid_idempotency_key"


def test_expired_key_starts_afresh(client, auth, acme, runtime):
    key_id = client.get("/v1/me", headers=auth).get_json()["id"]
    ttl = runtime.settings.idempotency_ttl_seconds
    t0 = utcnow()
    with runtime.db.begin() as session:
        first = publish_in_transaction(
            session,
            runtime.redis,
            runtime.settings,
            partner_uid="acme",
            body=order(),
            api_key_id=key_id,
            idempotency_key="k",
            now=t0,
        )
    with runtime.db.begin() as session:
        within = publish_in_transaction(
            session,
            runtime.redis,
            runtime.settings,
            partner_uid="acme",
            body=order(),
            api_key_id=key_id,
            idempotency_key="k",
            now=t0 + timedelta(seconds=ttl - 1),
        )
    assert within.replayed and within.body["id"] == first.body["id"]
    with runtime.db.begin() as session:
        later = publish_in_transaction(
            session,
            runtime.redis,
            runtime.settings,
            partner_uid="acme",
            body=order(amount=5),
            api_key_id=key_id,
            idempotency_key="k",
            now=t0 + timedelta(seconds=ttl + 1),
        )
    assert not later.replayed and later.body["id"] != first.body["id"]
    assert counts(runtime.db)["idempotency_keys"] == 1


def test_fifty_concurrent_publishes_with_one_key_make_one_event(
    live_server, admin_token, client, auth, acme, runtime
):
    barrier = threading.Barrier(50)
    results: list[tuple[int, dict]] = []
    lock = threading.Lock()

    def fire() -> None:
        with requests.Session() as http:
            barrier.wait()
            response = http.post(
                f"{live_server.url}/v1/partners/acme/events",
                json=order(),
                timeout=60,
                headers={"Authorization": f"Bearer {admin_token}", "Idempotency-Key": "race"},
            )
        with lock:
            results.append((response.status_code, response.json()))

    threads = [threading.Thread(target=fire) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert len(results) == 50
    assert {status for status, _ in results} <= {202, 409}, results
    accepted = {body["id"] for status, body in results if status == 202}
    assert len(accepted) == 1
    for status, body in results:
        if status == 409:
            assert body["error"]["code"] == "idempotency_key_in_flight"
    with runtime.db.Session() as session:
        assert session.scalar(select(func.count()).select_from(Event)) == 1
    assert counts(runtime.db)["deliveries"] == 1


def _hold_key(db, api_key_id: str, key: str, digest: str, body: dict):
    """Open a transaction that has written the key row and not committed: a twin in flight."""
    connection = db.engine.connect()
    transaction = connection.begin()
    now = utcnow()
    connection.execute(
        IdempotencyKey.__table__.insert().values(
            id=new_id("idk"),
            api_key_id=api_key_id,
            key=key,
            request_hash=digest,
            response_status=202,
            response_body=body,
            event_id=body["id"],
            created_at=now,
            expires_at=now + timedelta(days=1),
        )
    )
    return connection, transaction


def _wait_until_blocked(db, timeout_s: float = 10.0) -> None:
    """PostgreSQL: until some backend waits on a lock (our twin, on the unique index)."""
    deadline = time.monotonic() + timeout_s
    with db.engine.connect() as probe:
        while time.monotonic() < deadline:
            waiting = probe.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
            ).scalar()
            if waiting:
                return
            time.sleep(0.01)
    raise AssertionError("the second request never blocked on the key")


def test_twin_waiting_on_an_unfinished_key_gets_the_stored_answer(
    live_server, admin_token, client, auth, acme, runtime
):
    key_id = client.get("/v1/me", headers=auth).get_json()["id"]
    stored = {
        "id": "evt_FROMTHEWINNER",
        "type": "order.created",
        "version": 1,
        "deliveries": [],
        "warnings": [],
    }
    digest = request_hash("acme", order())
    if runtime.db.is_sqlite:
        # SQLite has one writer: the twin cannot even start until the winner commits.
        connection, transaction = _hold_key(runtime.db, key_id, "k", digest, stored)
        transaction.commit()
        connection.close()
        response = _post(client, auth, order(), "k")
    else:
        connection, transaction = _hold_key(runtime.db, key_id, "k", digest, stored)
        answer: list[requests.Response] = []
        thread = threading.Thread(
            target=lambda: answer.append(
                requests.post(
                    f"{live_server.url}/v1/partners/acme/events",
                    json=order(),
                    timeout=30,
                    headers={"Authorization": f"Bearer {admin_token}", "Idempotency-Key": "k"},
                )
            )
        )
        thread.start()
        _wait_until_blocked(runtime.db)
        transaction.commit()
        connection.close()
        thread.join(30)
        response = answer[0]
    assert response.status_code == 202
    body = response.get_json() if runtime.db.is_sqlite else response.json()
    assert body == stored
    assert counts(runtime.db)["events"] == 0


def test_twin_stuck_behind_an_unfinished_key_gets_409(
    live_server, admin_token, client, auth, acme, runtime, monkeypatch
):
    if runtime.db.is_sqlite:
        pytest.skip(
            "SQLite serialises writers: a twin waits (busy timeout), never sees one in flight"
        )
    monkeypatch.setattr(publish_module, "IN_FLIGHT_WAIT_MS", 300)
    key_id = client.get("/v1/me", headers=auth).get_json()["id"]
    stored = {
        "id": "evt_X",
        "type": "order.created",
        "version": 1,
        "deliveries": [],
        "warnings": [],
    }
    connection, transaction = _hold_key(
        runtime.db, key_id, "k", request_hash("acme", order()), stored
    )
    try:
        response = requests.post(
            f"{live_server.url}/v1/partners/acme/events",
            json=order(),
            timeout=30,
            headers={"Authorization": f"Bearer {admin_token}", "Idempotency-Key": "k"},
        )
    finally:
        transaction.rollback()
        connection.close()
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_key_in_flight"
    assert counts(runtime.db)["events"] == 0
