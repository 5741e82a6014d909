"""JSON that Python parses but no store or partner can take is `400 invalid_json`.

A lone UTF-16 surrogate has no UTF-8 form, so the database write failed (500); NaN and
Infinity are not JSON, so they were stored and sent on to partners as broken bodies.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import func, select

from app.db import Database
from app.models import Event, InboundSource
from tests.support.publish import counts, error_of, make_event_type

LONE = r"\ud800"  # six characters of JSON text, as a client would send them
PAIR = r"\ud83d\ude00"  # U+1F600, escaped as its surrogate pair

# (path, body template) for every write API; <S> marks the contents of a string.
WRITES_WITH_A_LONE_SURROGATE = [
    (
        "/v1/partners/acme/events",
        '{"type": "order.created", "version": 1, "data": {"order_id": "o<S>", "amount": 1}}',
    ),
    ("/v1/partners", '{"uid": "globex", "name": "Globex <S>"}'),
    (
        "/v1/event-types",
        '{"name": "thing.done", "version": 1, "schema": {"type": "object"}, "description": "<S>"}',
    ),
    ("/v1/partners/acme/endpoints", '{"url": "http://127.0.0.1:9/h", "description": "<S>"}'),
    ("/v1/dead-letters/resend", '{"filter": {"q": "<S>"}}'),
    ("/v1/sources", '{"name": "psp", "scheme": "github", "secrets": ["s3cret<S>"]}'),
]


def _with(template: str, text: str) -> bytes:
    return template.replace("<S>", text).encode()


def _post(client: Any, auth: dict[str, str], path: str, body: bytes) -> Any:
    return client.post(path, data=body, headers={**auth, "Content-Type": "application/json"})


def _stored(db: Database) -> dict[str, int]:
    with db.Session() as session:
        sources = int(session.scalar(select(func.count()).select_from(InboundSource)))
    return {**counts(db), "inbound_sources": sources}


def _assert_invalid_json(response: Any) -> None:
    assert response.status_code == 400, response.get_data(as_text=True)
    assert error_of(response)["code"] == "invalid_json"


@pytest.mark.parametrize(("path", "template"), WRITES_WITH_A_LONE_SURROGATE)
def test_lone_surrogate_is_400_on_every_write_and_stores_nothing(
    client, auth, acme, runtime, path, template
):
    before = _stored(runtime.db)
    response = _post(client, auth, path, _with(template, LONE))
    _assert_invalid_json(response)
    assert "surrogate" in error_of(response)["message"]
    assert _stored(runtime.db) == before


def test_lone_surrogate_as_raw_bytes_is_400_too(client, auth, acme, runtime):
    # json.loads(bytes) would decode these bytes into a lone surrogate ('surrogatepass').
    before = _stored(runtime.db)
    body = (
        b'{"type": "order.created", "version": 1, "data": {"order_id": "o\xed\xa0\x80", '
        b'"amount": 1}}'
    )
    _assert_invalid_json(_post(client, auth, "/v1/partners/acme/events", body))
    assert _stored(runtime.db) == before


def test_lone_surrogate_in_a_key_is_400(client, auth, acme, runtime):
    before = _stored(runtime.db)
    body = _with(
        '{"type": "order.created", "version": 1, '
        '"data": {"order_id": "o", "amount": 1}, "x<S>": 1}',
        LONE,
    )
    _assert_invalid_json(_post(client, auth, "/v1/partners/acme/events", body))
    assert _stored(runtime.db) == before


def test_surrogate_pair_is_published_and_stored_as_its_character(client, auth, acme, runtime):
    body = _with(WRITES_WITH_A_LONE_SURROGATE[0][1], PAIR)
    response = _post(client, auth, "/v1/partners/acme/events", body)
    assert response.status_code == 202, response.get_json()
    with runtime.db.Session() as session:
        event = session.get(Event, response.get_json()["id"])
        assert json.loads(event.payload)["data"]["order_id"] == "o\U0001f600"
    # An escaped backslash before "ud800" is ordinary text, not an escape.
    body = body.replace(PAIR.encode(), rb"\\ud800")
    response = _post(client, auth, "/v1/partners/acme/events", body)
    assert response.status_code == 202, response.get_json()


@pytest.fixture
def loose(client: Any, auth: dict[str, str], acme: str) -> str:
    """A contract that accepts any data, so only the parser stands between NaN and the store."""
    make_event_type(client, auth, name="metric.recorded", schema={"type": "object"})
    return "acme"


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_non_finite_numbers_are_400_and_store_nothing(client, auth, loose, runtime, number):
    before = _stored(runtime.db)
    body = f'{{"type": "metric.recorded", "version": 1, "data": {{"v": {number}}}}}'.encode()
    response = _post(client, auth, "/v1/partners/acme/events", body)
    _assert_invalid_json(response)
    schema = f'{{"name": "m.x", "version": 1, "schema": {{"maximum": {number}}}}}'.encode()
    _assert_invalid_json(_post(client, auth, "/v1/event-types", schema))
    assert _stored(runtime.db) == before


def test_finite_numbers_still_publish(client, auth, loose, runtime):
    body = b'{"type": "metric.recorded", "version": 1, "data": {"v": [1.5, -2e-3, 1e-400, 1E308]}}'
    response = _post(client, auth, "/v1/partners/acme/events", body)
    assert response.status_code == 202, response.get_json()
    with runtime.db.Session() as session:
        event = session.get(Event, response.get_json()["id"])
        assert json.loads(event.payload)["data"] == {"v": [1.5, -0.002, 0.0, 1e308]}
