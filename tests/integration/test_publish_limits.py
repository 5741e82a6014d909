"""Limits and bad input (issue 3 item 6): refused early, and nothing is stored for any of them."""

from __future__ import annotations

import pytest
import requests

from tests.support.publish import (
    counts,
    error_of,
    order,
)


def _padded(size: int) -> bytes:
    body = order(order_id="x" * size)
    return __import__("json").dumps(body).encode()


def test_body_over_the_limit_is_413_before_parsing(client, auth, acme, runtime):
    limit = runtime.settings.max_payload_bytes
    before = counts(runtime.db)
    too_big = _padded(limit)
    response = client.post(
        "/v1/partners/acme/events",
        data=too_big,
        headers={**auth, "Content-Type": "application/json"},
    )
    assert response.status_code == 413
    assert error_of(response)["code"] == "payload_too_large"
    # Not even parsed: garbage of that size is 413 too, not 400.
    garbage = client.post(
        "/v1/partners/acme/events",
        data=b"{" * (limit + 1),
        headers={**auth, "Content-Type": "application/json"},
    )
    assert garbage.status_code == 413
    assert counts(runtime.db) == before


def test_body_just_under_the_limit_is_accepted(client, auth, acme, runtime):
    limit = runtime.settings.max_payload_bytes
    body = _padded(limit - 200)
    assert len(body) <= limit
    response = client.post(
        "/v1/partners/acme/events", data=body, headers={**auth, "Content-Type": "application/json"}
    )
    assert response.status_code == 202


def test_chunked_body_over_the_limit_is_413(live_server, admin_token, acme, runtime):
    limit = runtime.settings.max_payload_bytes
    before = counts(runtime.db)

    def chunks():
        yield b'{"type": "order.created", "version": 1, "data": {"order_id": "'
        for _ in range(limit // 1024 + 2):
            yield b"x" * 1024
        yield b'", "amount": 1}}'

    response = requests.post(
        f"{live_server.url}/v1/partners/acme/events",
        data=chunks(),
        timeout=30,
        headers={"Authorization": f"Bearer {admin_token}", "Content-Type": "application/json"},
    )
    assert response.status_code == 413
    assert counts(runtime.db) == before


@pytest.mark.parametrize(
    ("data", "content_type", "status", "code"),
    [
        (b"{not json", "application/json", 400, "invalid_json"),
        (b"", "application/json", 400, "invalid_json"),
        (b"[1, 2]", "application/json", 400, "invalid_json"),
        (b"\xff\xfe", "application/json", 400, "invalid_json"),
        (b'{"type": "order.created"}', "text/plain", 415, "unsupported_media_type"),
        (b'{"type": "order.created"}', None, 415, "unsupported_media_type"),
        (b"type=order.created", "application/x-www-form-urlencoded", 415, "unsupported_media_type"),
    ],
)
def test_bad_bodies_are_refused_and_store_nothing(
    client, auth, acme, runtime, data, content_type, status, code
):
    before = counts(runtime.db)
    headers = dict(auth)
    if content_type:
        headers["Content-Type"] = content_type
    response = client.post("/v1/partners/acme/events", data=data, headers=headers)
    assert response.status_code == status
    assert error_of(response)["code"] == code
    assert counts(runtime.db) == before


def test_unknown_partner_is_404_and_stores_nothing(client, auth, acme, runtime):
    before = counts(runtime.db)
    response = client.post(
        "/v1/partners/ghost/events", headers={**auth, "Idempotency-Key": "k"}, json=order()
    )
    assert response.status_code == 404
    assert counts(runtime.db) == before


def test_every_rejection_leaves_every_table_as_it_was(client, auth, acme, runtime):
    before = counts(runtime.db)
    rejected = [
        client.post("/v1/partners/acme/events", json=order()),  # no key: 401
        client.post(
            "/v1/partners/acme/events", headers=auth, json={"type": "x", "version": 1, "data": {}}
        ),
        client.post(
            "/v1/partners/acme/events", headers=auth, json={**order(), "data": {"order_id": 1}}
        ),
        client.post(
            "/v1/partners/acme/events",
            headers={**auth, "Idempotency-Key": "k"},
            json={**order(), "data": {}},
        ),
        client.post(
            "/v1/partners/acme/events", headers={**auth, "Idempotency-Key": "x" * 300}, json=order()
        ),
    ]
    assert [r.status_code for r in rejected] == [401, 422, 422, 422, 400]
    assert counts(runtime.db) == before
