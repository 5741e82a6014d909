"""The receiver over real HTTP: verify the raw bytes, store before answering, deduplicate."""

from __future__ import annotations

import http.client
import json
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from rq import Queue
from sqlalchemy import func, select

from app.inbound import process, receive
from app.models import InboundEvent
from app.ports import free_port
from app.queues import INBOUND, INBOUND_PROCESS
from app.runtime import Runtime
from app.web import create_app
from tests.conftest import LiveServer
from tests.support import inbound as kit

# Run once more through PgBouncer in transaction mode (tests/conftest.py).
pytestmark = pytest.mark.pgbouncer

NUMERIC_IDS = {"github": "4242", "shopify": "820982911946154508"}


def _rid(scheme: str) -> str:
    return NUMERIC_IDS.get(scheme, "pay_1")


def _count(runtime: Runtime) -> int:
    with runtime.db.begin() as session:
        return int(session.scalar(select(func.count()).select_from(InboundEvent)) or 0)


def _post(server: Any, name: str, body: bytes, headers: list[tuple[str, str]]) -> Any:
    return requests.post(
        f"{server.url}/inbound/{name}", data=body, headers=dict(headers), timeout=10
    )


def _raw_post(
    server: Any,
    name: str,
    body: bytes,
    headers: list[tuple[str, bytes | str]],
    *,
    path: str | None = None,
) -> int:
    """http.client, so a header can be repeated or carry raw non-ASCII bytes."""
    url = urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    conn.putrequest("POST", path or f"/inbound/{name}")
    for key, value in headers:
        conn.putheader(key, value)
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    status = conn.getresponse().status
    conn.close()
    return status


@pytest.mark.parametrize("scheme", kit.SCHEMES)
def test_good_signature_is_stored_then_answered_202(scheme, runtime, live_server, redis_client):
    kit.create_source(runtime, "partner", scheme)
    body, headers = kit.signed_callback(scheme, event_id="evt_1", resource_id=_rid(scheme))
    if scheme == "stripe":
        assert kit.stripe_accepts(body, headers, kit.SECRETS["stripe"])
    response = _post(live_server, "partner", body, headers)
    assert response.status_code == 202, response.text
    answer = response.json()
    assert answer["status"] == "received" and answer["duplicate"] is False
    with runtime.db.begin() as session:
        event = session.get(InboundEvent, answer["id"])
        assert event.raw_body == body  # the exact bytes, odd spacing and UTF-8 included
        assert event.event_id == "evt_1"
        assert event.resource_id == _rid(scheme)
        assert event.status == "received"
    # Enqueued after the commit, on the inbound queue, carrying the id only.
    jobs = Queue(INBOUND, connection=redis_client).jobs
    assert [(j.func_name, j.args) for j in jobs] == [(INBOUND_PROCESS, (answer["id"],))]


@pytest.mark.parametrize("scheme", kit.SCHEMES)
def test_tampered_body_and_wrong_secret_are_401_with_nothing_stored(scheme, runtime, live_server):
    kit.create_source(runtime, "partner", scheme)
    body, headers = kit.signed_callback(scheme, event_id="evt_1", resource_id=_rid(scheme))
    tampered = body.replace(b"created", b"paid!!!")
    assert tampered != body
    response = _post(live_server, "partner", tampered, headers)
    assert response.status_code == 401
    assert response.json()["error"]["details"]["reason"] == "signature_mismatch"

    body, headers = kit.signed_callback(
        scheme, secret=kit.OTHER_SECRETS[scheme], event_id="evt_2", resource_id=_rid(scheme)
    )
    response = _post(live_server, "partner", body, headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_signature"
    assert _count(runtime) == 0


@pytest.mark.parametrize("scheme", kit.TIMESTAMPED)
@pytest.mark.parametrize("offset", [-310, +310, -86400, +86400])
def test_expired_and_future_timestamps_are_401(scheme, offset, runtime, live_server):
    # 10 s past the tolerance: a loaded machine may take seconds between signing and
    # verifying, which brings a future timestamp closer (a past one only further away).
    kit.create_source(runtime, "partner", scheme, tolerance_s=300)
    body, headers = kit.signed_callback(
        scheme, event_id="evt_1", resource_id="pay_1", timestamp=int(time.time()) + offset
    )
    response = _post(live_server, "partner", body, headers)
    assert response.status_code == 401
    assert response.json()["error"]["details"]["reason"] == "timestamp_out_of_tolerance"
    assert _count(runtime) == 0


@pytest.mark.parametrize("scheme", kit.TIMESTAMPED)
def test_timestamp_inside_the_tolerance_is_accepted(scheme, runtime, live_server):
    kit.create_source(runtime, "partner", scheme, tolerance_s=300)
    body, headers = kit.signed_callback(
        scheme, event_id="evt_1", resource_id="pay_1", timestamp=int(time.time()) - 240
    )
    assert _post(live_server, "partner", body, headers).status_code == 202


@pytest.mark.parametrize("scheme", ["github", "shopify"])
def test_untimestamped_schemes_stop_replays_by_event_id(scheme, runtime, live_server):
    # GitHub and Shopify sign no timestamp: a replayed genuine delivery verifies, and the
    # (source, event id) uniqueness is what stops it.
    kit.create_source(runtime, "partner", scheme)
    body, headers = kit.signed_callback(
        scheme, event_id="delivery-1", resource_id=_rid(scheme), occurred=time.time() - 3 * 86400
    )
    assert _post(live_server, "partner", body, headers).status_code == 202
    replayed = _post(live_server, "partner", body, headers)
    assert replayed.status_code == 200 and replayed.json()["duplicate"] is True
    assert _count(runtime) == 1


def test_several_secrets_verify_during_a_rotation(runtime, live_server):
    kit.create_source(
        runtime, "partner", "stripe", secrets=[kit.OTHER_SECRETS["stripe"], kit.SECRETS["stripe"]]
    )
    for n, secret in enumerate((kit.SECRETS["stripe"], kit.OTHER_SECRETS["stripe"])):
        body, headers = kit.signed_callback(
            "stripe", secret=secret, event_id=f"evt_{n}", resource_id="pi_1"
        )
        assert _post(live_server, "partner", body, headers).status_code == 202


MALFORMED: dict[str, list[list[tuple[str, str]]]] = {
    "standard-webhooks": [
        [("webhook-id", "evt_1"), ("webhook-timestamp", "{ts}"), ("webhook-signature", "v1")],
        [("webhook-id", "evt_1"), ("webhook-timestamp", "{ts}"), ("webhook-signature", "v1,a,b")],
        [
            ("webhook-id", "evt_1"),
            ("webhook-timestamp", "{ts}"),
            ("webhook-signature", "v1,!!!notbase64"),
        ],
        [("webhook-id", "evt_1"), ("webhook-timestamp", "12.5"), ("webhook-signature", "v1,AAAA")],
        [("webhook-id", "evt_1"), ("webhook-signature", "v1,AAAA")],
    ],
    "stripe": [
        [("Stripe-Signature", "v1")],
        [("Stripe-Signature", "t={ts},v1=nothex")],
        [("Stripe-Signature", "t=abc,v1=" + "0" * 64)],
        [("Stripe-Signature", "v1=" + "0" * 64)],
        [],
    ],
    "github": [
        [("X-Hub-Signature-256", "sha256=zz")],
        [("X-Hub-Signature-256", "sha1=" + "0" * 40)],
        [("X-Hub-Signature-256", "0" * 64)],
        [],
    ],
    "shopify": [
        [("X-Shopify-Hmac-Sha256", "not base64!")],
        [("X-Shopify-Hmac-Sha256", "AAAA")],
        [],
    ],
}


@pytest.mark.parametrize(
    ("scheme", "case"),
    [(scheme, n) for scheme, cases in MALFORMED.items() for n in range(len(cases))],
)
def test_missing_or_malformed_signature_headers_are_401_never_500(
    scheme, case, runtime, live_server
):
    kit.create_source(runtime, "partner", scheme)
    body, base = kit.callback(scheme, event_id="evt_1", resource_id=_rid(scheme))
    headers = base + [
        (k, v.replace("{ts}", str(int(time.time())))) for k, v in MALFORMED[scheme][case]
    ]
    response = _post(live_server, "partner", body, headers)
    assert response.status_code == 401, response.text
    assert _count(runtime) == 0


@pytest.mark.parametrize("scheme", kit.SCHEMES)
def test_duplicated_signature_header_is_401(scheme, runtime, live_server):
    """Werkzeug folds repeats into one comma-joined value, which never verifies."""
    kit.create_source(runtime, "partner", scheme)
    body, headers = kit.signed_callback(scheme, event_id="evt_1", resource_id=_rid(scheme))
    signature_names = {
        "standard-webhooks": "webhook-signature",
        "stripe": "Stripe-Signature",
        "github": "X-Hub-Signature-256",
        "shopify": "X-Shopify-Hmac-Sha256",
    }
    name = signature_names[scheme]
    value = dict(headers)[name]
    # The genuine value twice: a verifier that took either copy would accept it.
    doubled = [*headers, (name, value)]
    assert _raw_post(live_server, "partner", body, doubled) == 401
    assert _raw_post(live_server, "partner", body, headers) == 202


def test_non_ascii_signature_header_is_401(runtime, live_server):
    kit.create_source(runtime, "partner", "github")
    body, headers = kit.callback("github", event_id="evt_1", resource_id="4242")
    raw = [*headers, ("X-Hub-Signature-256", "sha256=\u00e9\u00e9".encode("latin-1"))]
    assert _raw_post(live_server, "partner", body, raw) == 401
    assert _count(runtime) == 0


def test_werkzeug_passes_repeated_headers_as_one_joined_value(app):
    """Why the view can use request.headers.items(): the WSGI server has already joined."""
    seen: list[list[tuple[str, str]]] = []

    @app.post("/_probe/headers")
    def probe() -> str:
        from flask import request

        seen.append(list(request.headers.items()))
        return ""

    with LiveServer(app) as server:
        assert (
            _raw_post(server, "", b"", [("X-Twice", "a"), ("X-Twice", "b")], path="/_probe/headers")
            == 200
        )
    assert ("X-Twice", "a,b") in seen[0]


def test_duplicate_is_200_and_processed_once(runtime, live_server, redis_client):
    kit.create_source(runtime, "partner", "standard-webhooks")
    body, headers = kit.signed_callback(
        "standard-webhooks", event_id="evt_dup", resource_id="pay_1", version=1
    )
    first = _post(live_server, "partner", body, headers)
    assert first.status_code == 202
    for _ in range(3):
        again = _post(live_server, "partner", body, headers)
        assert again.status_code == 200
        assert again.json() == {"id": first.json()["id"], "status": "received", "duplicate": True}
    assert _count(runtime) == 1
    assert Queue(INBOUND, connection=redis_client).count == 1
    assert process.process_event(first.json()["id"]) == "applied"
    assert process.process_event(first.json()["id"]) is None
    # Re-sent after processing: still a duplicate, never processed again.
    late = _post(live_server, "partner", body, headers)
    assert late.status_code == 200 and late.json()["status"] == "applied"


def test_oversized_body_is_413_with_nothing_stored(settings, runtime):
    small = Runtime(settings.with_overrides(max_payload_bytes=2048), database=runtime.db)
    kit.create_source(small, "partner", "github")
    body, headers = kit.callback("github", event_id="evt_big", resource_id="4242")
    body = body[:-1] + b', "pad": "' + b"x" * 4096 + b'"}'
    headers = kit.sign("github", kit.SECRETS["github"], body, headers)
    with LiveServer(create_app(runtime=small)) as server:
        response = _post(server, "partner", body, headers)
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "payload_too_large"
        assert response.json()["error"]["details"]["limit"] > 0
    assert _count(runtime) == 0


def test_unknown_source_is_404(runtime, live_server):
    body, headers = kit.signed_callback("github", event_id="x", resource_id="1")
    response = _post(live_server, "nobody", body, headers)
    assert response.status_code == 404
    assert _count(runtime) == 0


def test_genuine_body_that_is_not_json_is_400_and_audited_once(runtime, live_server):
    kit.create_source(runtime, "partner", "shopify")
    body = b"not json at all \xff"
    headers = kit.sign(
        "shopify", kit.SECRETS["shopify"], body, [("X-Shopify-Topic", "orders/paid")]
    )
    first = _post(live_server, "partner", body, headers)
    assert first.status_code == 400
    error = first.json()["error"]
    assert error["code"] == "invalid_payload" and error["details"]["reason"].startswith(
        "invalid_json"
    )
    again = _post(live_server, "partner", body, headers)
    assert again.status_code == 400
    assert again.json()["error"]["details"]["id"] == error["details"]["id"]
    with runtime.db.begin() as session:
        rows = list(session.scalars(select(InboundEvent)))
    assert len(rows) == 1
    row = rows[0]
    assert row.status == "failed" and row.reason.startswith("invalid_payload: invalid_json")
    assert row.event_id == receive.synthetic_event_id(body)
    assert row.raw_body == body
    assert row.headers["x-shopify-topic"] == "orders/paid"


def test_a_body_that_is_not_json_keeps_the_provider_delivery_id_from_a_header(runtime, live_server):
    # Operators look a failed callback up by the id the provider shows them.
    kit.create_source(runtime, "gh", "github")
    body = b""
    headers = kit.sign(
        "github",
        kit.SECRETS["github"],
        body,
        [("X-GitHub-Delivery", "empty-1"), ("X-GitHub-Event", "push")],
    )
    assert _post(live_server, "gh", body, headers).status_code == 400
    with runtime.db.begin() as session:
        row = session.scalars(select(InboundEvent)).one()
    assert (row.event_id, row.status) == ("empty-1", "failed")


def test_genuine_body_missing_fields_is_400_audited_under_its_own_event_id(runtime, live_server):
    kit.create_source(runtime, "partner", "standard-webhooks")
    doc = {
        "id": "evt_nores",
        "type": "payment.created",
        "resource": {"type": "payment", "id": "pay_1"},
    }  # neither version nor time
    body = json.dumps(doc).encode()
    headers = kit.sign(
        "standard-webhooks", kit.SECRETS["standard-webhooks"], body, [("webhook-id", "evt_nores")]
    )
    response = _post(live_server, "partner", body, headers)
    assert response.status_code == 400
    assert "resource_version or occurred_at" in response.json()["error"]["message"]
    with runtime.db.begin() as session:
        row = session.scalars(select(InboundEvent)).one()
    assert (row.event_id, row.status, row.resource_id) == ("evt_nores", "failed", "pay_1")
    assert "missing field(s)" in row.reason


def test_nul_and_overlong_fields_are_400_not_5xx(runtime, live_server):
    """PostgreSQL refuses NUL in text and long varchars; the receiver must refuse first."""
    kit.create_source(runtime, "partner", "standard-webhooks")
    for n, resource_id in enumerate(("pay\u0000nul", "p" * 300)):
        doc = {
            "id": f"evt_{n}",
            "type": "payment.created",
            "occurred_at": kit.iso(time.time()),
            "resource": {"id": resource_id, "version": 1},
        }
        body = json.dumps(doc).encode()
        headers = kit.sign(
            "standard-webhooks",
            kit.SECRETS["standard-webhooks"],
            body,
            [("webhook-id", f"evt_{n}")],
        )
        assert _post(live_server, "partner", body, headers).status_code == 400
    # NUL elsewhere in the body is fine: raw bytes are stored as bytes.
    doc = {
        "id": "evt_ok",
        "type": "payment.created",
        "occurred_at": kit.iso(time.time()),
        "resource": {"id": "pay_1", "version": 1},
        "data": {"memo": "a\u0000b"},
    }
    body = json.dumps(doc).encode()
    headers = kit.sign(
        "standard-webhooks", kit.SECRETS["standard-webhooks"], body, [("webhook-id", "evt_ok")]
    )
    assert _post(live_server, "partner", body, headers).status_code == 202
    with runtime.db.begin() as session:
        stored = session.scalars(select(InboundEvent).where(InboundEvent.event_id == "evt_ok"))
        assert stored.one().raw_body == body


def test_credentials_and_the_signature_are_stored_by_name_only(runtime, live_server):
    kit.create_source(runtime, "partner", "github")
    body, headers = kit.signed_callback("github", event_id="evt_1", resource_id="4242")
    headers += [("Authorization", "Basic c2VjcmV0"), ("Cookie", "session=abc")]
    response = _post(live_server, "partner", body, headers)
    with runtime.db.begin() as session:
        event = session.get(InboundEvent, response.json()["id"])
    for name in ("authorization", "cookie", "x-hub-signature-256"):
        assert event.headers[name] == "[redacted]", name
    assert event.headers["x-github-delivery"] == "evt_1"


def test_inbound_callbacks_are_stored_without_credentials_or_signatures(client, auth, runtime):
    kit.create_source(runtime, "psp", "standard-webhooks")
    body, headers = kit.signed_callback(
        "standard-webhooks", event_id="e-1", resource_id="pay_1", version=1
    )
    headers += [
        ("Authorization", "Bearer partner-token"),
        ("Proxy-Authorization", "Basic cHJveHk="),
        ("X-Request-Id", "r-1"),
    ]
    response = client.post("/inbound/psp", data=body, headers=headers)
    assert response.status_code == 202, response.get_json()
    detail = client.get(f"/v1/inbound-events/{response.get_json()['id']}", headers=auth)
    stored = detail.get_json()["headers"]
    assert stored["authorization"] == stored["proxy-authorization"] == "[redacted]"
    assert stored["webhook-signature"] == "[redacted]"
    assert stored["x-request-id"] == "r-1" and stored["webhook-id"] == "e-1"
    assert "partner-token" not in detail.text and "cHJveHk=" not in detail.text
    with runtime.db.begin() as session:
        raw = session.scalar(select(InboundEvent.headers))
    assert "partner-token" not in str(raw)


def test_redis_down_still_202_and_the_sweeper_enqueues_it(settings, runtime, redis_client):
    dead = Runtime(
        settings.with_overrides(redis_url=f"redis://127.0.0.1:{free_port()}/0"), database=runtime.db
    )
    kit.create_source(runtime, "partner", "github")
    body, headers = kit.signed_callback("github", event_id="evt_1", resource_id="4242")
    with LiveServer(create_app(runtime=dead)) as server:
        response = _post(server, "partner", body, headers)
    assert response.status_code == 202
    event_id = response.json()["id"]
    queue = Queue(INBOUND, connection=redis_client)
    assert queue.count == 0
    from datetime import timedelta

    from app.clock import utcnow

    assert process.sweep(runtime, now=utcnow()) == 0  # within the grace period
    assert process.sweep(runtime, now=utcnow() + timedelta(seconds=60)) == 1
    assert [j.args for j in queue.jobs] == [(event_id,)]


def test_settings_default_tolerance_applies_to_new_sources(settings, runtime):
    custom = Runtime(settings.with_overrides(inbound_tolerance_seconds=42), database=runtime.db)
    kit.create_source(custom, "partner", "stripe")
    from app.inbound.sources import verification_config

    assert verification_config(runtime.db.Session, runtime.secret_box, "partner").tolerance_s == 42


def _signed_with(scheme: str, event_id: str, status_json: bytes) -> tuple[bytes, list]:
    """A genuine callback whose status is ``status_json``, verbatim JSON string contents."""
    body, headers = kit.callback(
        scheme, event_id=event_id, resource_id=_rid(scheme), version=1, status="__STATUS__"
    )
    body = body.replace(b"__STATUS__", status_json)
    return body, kit.sign(scheme, kit.SECRETS[scheme], body, headers)


def _only_row(runtime: Runtime, event_id: str) -> InboundEvent:
    with runtime.db.begin() as session:
        return session.scalars(select(InboundEvent).where(InboundEvent.event_id == event_id)).one()


@pytest.mark.parametrize(
    ("scheme", "status_json"),
    [
        ("standard-webhooks", rb"x\ud800"),  # the escape, the only way in for UTF-8 JSON
        ("github", b"x\xed\xa0\x80"),  # raw surrogate bytes, which json.loads passes
    ],
)
def test_lone_surrogate_is_400_and_audited_then_good_callbacks_still_work(
    scheme, status_json, runtime, live_server
):
    kit.create_source(runtime, "partner", scheme)
    body, headers = _signed_with(scheme, "evt_bad", status_json)
    first = _post(live_server, "partner", body, headers)
    assert first.status_code == 400, first.text
    error = first.json()["error"]
    assert error["code"] == "invalid_payload"
    assert error["details"]["reason"].startswith("invalid_json")
    row = _only_row(runtime, "evt_bad")  # audited under its own id, from the header
    assert (row.status, row.id) == ("failed", error["details"]["id"])
    assert row.reason.startswith("invalid_payload: invalid_json")
    assert row.resource_status is None  # the unstorable value was not kept
    assert row.raw_body == body
    # The partner retries: the same 400, the same row.
    again = _post(live_server, "partner", body, headers)
    assert again.status_code == 400 and again.json()["error"]["details"]["id"] == row.id
    # A surrogate pair (an emoji) is fine, and so is its duplicate.
    body, headers = _signed_with(scheme, "evt_ok", rb"paid \ud83d\ude00")
    ok = _post(live_server, "partner", body, headers)
    assert ok.status_code == 202, ok.text
    assert _post(live_server, "partner", body, headers).status_code == 200
    assert _only_row(runtime, "evt_ok").resource_status == "paid \U0001f600"
    assert process.process_event(ok.json()["id"]) == "applied"
    assert _count(runtime) == 2


def test_lone_surrogate_in_the_event_id_is_audited_under_a_synthetic_id(runtime, live_server):
    kit.create_source(runtime, "partner", "stripe")
    body, headers = kit.callback("stripe", event_id="evt__ID__", resource_id="pi_1")
    body = body.replace(b"__ID__", rb"\udc00")
    headers = kit.sign("stripe", kit.SECRETS["stripe"], body, headers)
    response = _post(live_server, "partner", body, headers)
    assert response.status_code == 400
    with runtime.db.begin() as session:
        row = session.scalars(select(InboundEvent)).one()
    assert (row.event_id, row.status) == (receive.synthetic_event_id(body), "failed")
    assert row.resource_id == "pi_1"  # what could be stored was kept


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e400"])
def test_non_finite_number_is_400_and_audited(number, runtime, live_server):
    kit.create_source(runtime, "partner", "standard-webhooks")
    body, headers = kit.callback(
        "standard-webhooks", event_id="evt_nan", resource_id="pay_1", version=1
    )
    body = body.replace(b'"version" : 1', b'"version" : 1, "amount" : ' + number, 1)
    assert number in body
    headers = kit.sign("standard-webhooks", kit.SECRETS["standard-webhooks"], body, headers)
    response = _post(live_server, "partner", body, headers)
    assert response.status_code == 400
    assert response.json()["error"]["details"]["reason"].startswith("invalid_json")
    row = _only_row(runtime, "evt_nan")
    assert row.status == "failed" and row.raw_body == body
