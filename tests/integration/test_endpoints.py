"""Partners and endpoints: every path, with the validation of issue 3 item 2."""

from __future__ import annotations

import base64
import logging
from datetime import timedelta

import pytest
from sqlalchemy import select

from app.accounts import create_api_key
from app.clock import parse_time, utcnow
from app.models import Attempt, Endpoint, EndpointSecret
from app.registry.secrets import active_secrets
from app.runtime import Runtime
from app.signing import generate_secret
from app.web import create_app
from tests.support.factories import Receiver, WorkerThread, wait_for
from tests.support.publish import (
    contract_and_partner,
    error_of,
    make_endpoint,
    make_event_type,
    make_partner,
    order,
)

ENDPOINT_KEYS = {
    "id",
    "partner",
    "url",
    "event_types",
    "description",
    "headers",
    "public_headers",
    "versions",
    "timeout_s",
    "mode",
    "ordering",
    "on_dead",
    "send_traceparent",
    "filter",
    "signature",
    "public_key",
    "public_keys",
    "rate_limit_per_s",
    "state",
    "verify",
    "verified_at",
    "verification",
    "disabled_reason",
    "disabled_at",
    "disabled_by",
    "created_at",
    "updated_at",
    "consecutive_failures",
    "last_success_at",
    "last_failure_at",
    "auto_recover",
    "probe_next_at",
    "probe_count",
}


@pytest.fixture
def strict_app(settings, migrated, redis_client):
    """The app with production SSRF rules: private targets refused, https required."""
    from app.web.auth import clear_cache

    clear_cache()
    rt = Runtime(
        settings.with_overrides(allow_private_targets=False, require_https=True),
        database=migrated.db,
    )
    yield create_app(runtime=rt)
    rt.close()


# ---------------------------------------------------------------------------- partners


def test_partner_create_read_list(client, auth):
    created = make_partner(client, auth, "acme")
    assert created["id"].startswith("ptn_") and created["uid"] == "acme"
    assert client.get("/v1/partners/acme", headers=auth).get_json() == created
    make_partner(client, auth, "globex")
    listed = client.get("/v1/partners?limit=1", headers=auth).get_json()
    assert [p["uid"] for p in listed["data"]] == ["globex"]
    rest = client.get(f"/v1/partners?cursor={listed['next_cursor']}", headers=auth).get_json()
    assert [p["uid"] for p in rest["data"]] == ["acme"] and rest["next_cursor"] is None


def test_duplicate_partner_uid_is_409(client, auth):
    make_partner(client, auth, "acme")
    response = client.post("/v1/partners", headers=auth, json={"uid": "acme", "name": "Again"})
    assert response.status_code == 409
    assert error_of(response)["code"] == "partner_exists"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"uid": ""},
        {"uid": "has space"},
        {"uid": 7},
        {"uid": "ok", "name": ""},
        {"uid": "ok", "extra": 1},
        {"uid": "acme\n", "name": "Acme"},
    ],
)
def test_bad_partner_is_422(client, auth, body):
    assert client.post("/v1/partners", headers=auth, json=body).status_code == 422


def test_unknown_partner_is_404_everywhere(client, auth):
    assert client.get("/v1/partners/ghost", headers=auth).status_code == 404
    assert client.get("/v1/partners/ghost/endpoints", headers=auth).status_code == 404
    response = client.post(
        "/v1/partners/ghost/endpoints", headers=auth, json={"url": "http://127.0.0.1:9/"}
    )
    assert response.status_code == 404


# ---------------------------------------------------------------------------- creation


def test_endpoint_gets_generated_secret_and_defaults(client, auth, runtime):
    make_partner(client, auth)
    created = make_endpoint(client, auth)
    assert set(created) == ENDPOINT_KEYS | {"secret"}
    assert created["id"].startswith("ep_") and created["partner"] == "acme"
    assert created["state"] == "enabled" and created["event_types"] is None
    assert created["timeout_s"] == runtime.settings.default_timeout_s
    assert (created["ordering"], created["on_dead"]) == ("none", "skip")
    assert created["send_traceparent"] is False  # trace ids stay internal unless asked
    assert (created["signature"], created["public_key"], created["public_keys"]) == (
        "hmac",
        None,
        [],
    )
    secret = created["secret"]
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret[len("whsec_") :], validate=True)) == 32

    read = client.get(f"/v1/partners/acme/endpoints/{created['id']}", headers=auth).get_json()
    assert "secret" not in read and set(read) == ENDPOINT_KEYS
    current = client.get(
        f"/v1/partners/acme/endpoints/{created['id']}/secret", headers=auth
    ).get_json()
    assert set(current) == {"id", "endpoint", "secret", "created_at", "expires_at"}
    assert (current["secret"], current["endpoint"]) == (secret, created["id"])


def test_secret_is_stored_encrypted(client, auth, runtime):
    make_partner(client, auth)
    created = make_endpoint(client, auth)
    with runtime.db.Session() as session:
        stored = session.scalars(select(EndpointSecret.secret_encrypted)).all()
    assert len(stored) == 1
    assert created["secret"] not in stored[0]
    assert created["secret"][len("whsec_") :] not in stored[0]
    assert runtime.secret_box.decrypt(stored[0]) == created["secret"]


def test_given_secret_is_kept_and_malformed_one_refused(client, auth):
    make_partner(client, auth)
    mine = generate_secret()
    assert make_endpoint(client, auth, secret=mine)["secret"] == mine
    for bad in (
        "whsec_short",
        "not-a-secret",
        "whsec_" + base64.b64encode(b"x" * 16).decode(),
        "whsec_%%%%",
        42,
    ):
        response = client.post(
            "/v1/partners/acme/endpoints",
            headers=auth,
            json={"url": "http://127.0.0.1:9/", "secret": bad},
        )
        assert response.status_code == 422, bad
        assert error_of(response)["code"] == "invalid_secret"


def test_all_fields_round_trip(client, auth):
    make_partner(client, auth)
    make_event_type(client, auth, "order.created")
    make_event_type(client, auth, "order.paid")
    created = make_endpoint(
        client,
        auth,
        url="https://127.0.0.1:8443/in",
        event_types=["order.created", "order.paid"],
        description="billing",
        headers={"X-Team": "billing", "Authorization": "Bearer s3cr3t"},
        public_headers=["x-team"],
        timeout_s=30,
        rate_limit_per_s=5,
    )
    assert created["event_types"] == ["order.created", "order.paid"]
    # Values are write-only but for the headers their creator listed as public.
    assert created["headers"] == {"X-Team": "billing", "Authorization": None}
    assert created["public_headers"] == ["X-Team"]
    assert (created["timeout_s"], created["rate_limit_per_s"]) == (30, 5)
    assert created["description"] == "billing"


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/x",
        "file:///etc/passwd",
        "javascript:x",
        "http://",
        "not a url",
        "",
        None,
        "http://exa mple.com/",
    ],
)
def test_bad_url_is_422_invalid_url(client, auth, url):
    make_partner(client, auth)
    response = client.post("/v1/partners/acme/endpoints", headers=auth, json={"url": url})
    assert response.status_code == 422
    assert error_of(response)["code"] == "invalid_url"


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "10.1.2.3",
        "169.254.169.254",
        "[::1]",
        "192.168.0.10",
        "localhost",
        "0.0.0.0",  # noqa: S104 - a target to refuse, not a bind address
        "2130706433",
    ],
)
def test_internal_target_is_refused_at_creation(strict_app, auth, host):
    client = strict_app.test_client()
    make_partner(client, auth)
    response = client.post(
        "/v1/partners/acme/endpoints", headers=auth, json={"url": f"https://{host}/hook"}
    )
    assert response.status_code == 422, response.get_json()
    assert error_of(response)["code"] == "blocked_address"
    assert client.get("/v1/partners/acme/endpoints", headers=auth).get_json()["data"] == []


def test_a_host_that_does_not_resolve_yet_is_accepted(strict_app, auth):
    # Nothing can reach it before an attempt resolves it and the guard vets the answer
    # (sender tests: an unresolvable host is a connection error, nothing sent).
    client = strict_app.test_client()
    make_partner(client, auth)
    response = client.post(
        "/v1/partners/acme/endpoints",
        headers=auth,
        json={"url": "https://hooks.acme.invalid/kurir"},
    )
    assert response.status_code == 201, response.get_json()
    assert response.get_json()["url"] == "https://hooks.acme.invalid/kurir"


def test_require_https_refuses_http(strict_app, auth):
    client = strict_app.test_client()
    make_partner(client, auth)
    response = client.post(
        "/v1/partners/acme/endpoints", headers=auth, json={"url": "http://93.184.215.14/hook"}
    )
    assert response.status_code == 422
    assert error_of(response)["code"] == "invalid_url"
    ok = client.post(
        "/v1/partners/acme/endpoints", headers=auth, json={"url": "https://93.184.215.14/hook"}
    )
    assert ok.status_code == 201, ok.get_json()


def test_private_target_allowed_when_configured(client, auth):
    make_partner(client, auth)  # the default test settings allow private targets
    assert make_endpoint(client, auth, url="http://127.0.0.1:1/x")["url"] == "http://127.0.0.1:1/x"


def test_unknown_subscribed_event_type_is_422(client, auth):
    make_partner(client, auth)
    make_event_type(client, auth, "order.created")
    response = client.post(
        "/v1/partners/acme/endpoints",
        headers=auth,
        json={"url": "http://127.0.0.1:9/", "event_types": ["order.created", "order.nope"]},
    )
    assert response.status_code == 422
    err = error_of(response)
    assert err["code"] == "unknown_event_type" and err["details"]["unknown"] == ["order.nope"]
    for bad in ([], "order.created", [1]):
        response = client.post(
            "/v1/partners/acme/endpoints",
            headers=auth,
            json={"url": "http://127.0.0.1:9/", "event_types": bad},
        )
        assert response.status_code == 422


@pytest.mark.parametrize(
    "name",
    [
        "webhook-id",
        "Webhook-Signature",
        "webhook-anything",
        "Content-Type",
        "content-length",
        "Host",
        "Transfer-Encoding",
        "User-Agent",
        "traceparent",
        "TraceState",
    ],
)
def test_reserved_header_is_422(client, auth, name):
    make_partner(client, auth)
    response = client.post(
        "/v1/partners/acme/endpoints",
        headers=auth,
        json={"url": "http://127.0.0.1:9/", "headers": {name: "x"}},
    )
    assert response.status_code == 422
    assert error_of(response)["code"] == "reserved_header"


@pytest.mark.parametrize(
    "headers",
    [
        {"X-A": "one\r\nX-Evil: 1"},
        {"X-A": "one\ntwo"},
        {"X-A": "a\rb"},
        {"Bad Name": "x"},
        {"X-A\r\n": "x"},
        {"X-A\n": "x"},
        {"": "x"},
        {"X-A": "\u20ac"},
        {"X-A": "a\x01b"},
        {"X-A": "a\x7fb"},
        {"X-A": 5},
        {"X-A": "x" * 5000},
        ["X-A"],
    ],
)
def test_header_injection_and_bad_headers_are_422(client, auth, headers):
    make_partner(client, auth)
    response = client.post(
        "/v1/partners/acme/endpoints",
        headers=auth,
        json={"url": "http://127.0.0.1:9/", "headers": headers},
    )
    assert response.status_code == 422


def test_latin1_and_tabs_in_header_values_are_fine_beyond_is_422(client, auth):
    # Beyond Latin-1 a value cannot be sent at all: accepted, every delivery would fail.
    make_partner(client, auth)
    ok = client.post(
        "/v1/partners/acme/endpoints",
        headers=auth,
        json={"url": "http://127.0.0.1:9/", "headers": {"X-A": "caf\u00e9\tbar"}},
    )
    assert ok.status_code == 201, ok.get_json()
    path = f"/v1/partners/acme/endpoints/{ok.get_json()['id']}"
    euro = client.patch(path, headers=auth, json={"headers": {"X-Cur": "\u20ac"}})
    assert euro.status_code == 422
    assert error_of(euro)["code"] == "invalid_header"
    assert error_of(euro)["details"] == {"header": "X-Cur"}


@pytest.mark.parametrize(
    ("timeout", "ok"),
    [(1, True), (30, True), (0, False), (31, False), ("5", False), (2.5, False), (True, False)],
)
def test_timeout_bounds(client, auth, timeout, ok):
    make_partner(client, auth)
    response = client.post(
        "/v1/partners/acme/endpoints",
        headers=auth,
        json={"url": "http://127.0.0.1:9/", "timeout_s": timeout},
    )
    assert response.status_code == (201 if ok else 422)


def test_unknown_field_is_422(client, auth):
    make_partner(client, auth)
    response = client.post(
        "/v1/partners/acme/endpoints",
        headers=auth,
        json={"url": "http://127.0.0.1:9/", "retries": 3},
    )
    assert response.status_code == 422
    assert error_of(response)["code"] == "unknown_field"


# ---------------------------------------------------------------------------- changes


def test_patch_changes_only_given_fields_and_validates(client, auth):
    make_partner(client, auth)
    make_event_type(client, auth, "order.created")
    ep = make_endpoint(
        client, auth, description="one", headers={"X-A": "1"}, public_headers=["X-A"]
    )
    path = f"/v1/partners/acme/endpoints/{ep['id']}"
    response = client.patch(
        path, headers=auth, json={"timeout_s": 5, "event_types": ["order.created"]}
    )
    assert response.status_code == 200
    body = response.get_json()
    assert body["timeout_s"] == 5 and body["event_types"] == ["order.created"]
    assert body["description"] == "one" and body["headers"] == {"X-A": "1"}
    assert "secret" not in body
    assert (
        client.patch(path, headers=auth, json={"event_types": None}).get_json()["event_types"]
        is None
    )
    for bad in (
        {"headers": {"Host": "x"}},
        {"url": "gopher://x"},
        {"timeout_s": 99},
        {"secret": generate_secret()},
        {"state": "disabled"},
    ):
        assert client.patch(path, headers=auth, json=bad).status_code == 422, bad
    assert client.get(path, headers=auth).get_json()["timeout_s"] == 5


def test_patch_url_gets_the_ssrf_verdict_too(strict_app, auth):
    client = strict_app.test_client()
    make_partner(client, auth)
    created = client.post(
        "/v1/partners/acme/endpoints", headers=auth, json={"url": "https://93.184.215.14/hook"}
    ).get_json()
    response = client.patch(
        f"/v1/partners/acme/endpoints/{created['id']}",
        headers=auth,
        json={"url": "https://169.254.169.254/latest/meta-data"},
    )
    assert response.status_code == 422
    assert error_of(response)["code"] == "blocked_address"


def test_delete_hides_endpoint_but_keeps_row(client, auth, runtime):
    make_partner(client, auth)
    ep = make_endpoint(client, auth)
    path = f"/v1/partners/acme/endpoints/{ep['id']}"
    deleted = client.delete(path, headers=auth)
    assert deleted.status_code == 204 and "Content-Type" not in deleted.headers
    assert client.get(path, headers=auth).status_code == 404
    assert client.delete(path, headers=auth).status_code == 404
    assert client.get("/v1/partners/acme/endpoints", headers=auth).get_json()["data"] == []
    with runtime.db.Session() as session:
        row = session.get(Endpoint, ep["id"])
        assert row.deleted_at is not None and row.state == "disabled"


def test_disable_then_enable(client, auth):
    make_partner(client, auth)
    ep = make_endpoint(client, auth)
    base = f"/v1/partners/acme/endpoints/{ep['id']}"
    disabled = client.post(f"{base}/disable", headers=auth).get_json()
    assert disabled["state"] == "disabled" and disabled["disabled_reason"] == "manual"
    assert disabled["disabled_at"].endswith("Z")
    reasoned = client.post(f"{base}/disable", headers=auth, json={"reason": "maintenance"})
    assert reasoned.get_json()["disabled_reason"] == "maintenance"
    listed = client.get("/v1/partners/acme/endpoints?state=disabled", headers=auth).get_json()
    assert [e["id"] for e in listed["data"]] == [ep["id"]]
    enabled = client.post(f"{base}/enable", headers=auth).get_json()
    assert enabled["state"] == "enabled"
    assert enabled["disabled_reason"] is None and enabled["disabled_at"] is None
    assert client.post(f"{base}/disable", headers=auth, json={"why": 1}).status_code == 422


def test_rotate_keeps_old_secret_valid_for_the_overlap(client, auth, runtime):
    make_partner(client, auth)
    ep = make_endpoint(client, auth)
    base = f"/v1/partners/acme/endpoints/{ep['id']}"
    rotated = client.post(f"{base}/secret/rotate", headers=auth)
    assert rotated.status_code == 200
    new = rotated.get_json()["secret"]
    assert new != ep["secret"] and new.startswith("whsec_")
    current = client.get(f"{base}/secret", headers=auth).get_json()
    assert current["secret"] == new and current["endpoint"] == ep["id"]
    assert current["id"].startswith("whs_") and current["expires_at"] is None
    assert parse_time(current["created_at"]) <= utcnow()
    updated = client.get(base, headers=auth).get_json()["updated_at"]
    assert parse_time(updated) >= parse_time(current["created_at"])  # the rotation shows
    overlap = runtime.settings.secret_rotation_overlap_seconds
    with runtime.db.Session() as session:
        endpoint = session.get(Endpoint, ep["id"])
        now = utcnow()
        assert active_secrets(endpoint, runtime.secret_box, now) == [new, ep["secret"]]
        later = now + timedelta(seconds=overlap + 5)
        assert active_secrets(endpoint, runtime.secret_box, later) == [new]
    mine = generate_secret()
    again = client.post(f"{base}/secret/rotate", headers=auth, json={"secret": mine})
    assert again.get_json()["secret"] == mine
    bad = client.post(f"{base}/secret/rotate", headers=auth, json={"secret": "whsec_x"})
    assert bad.status_code == 422


def test_reading_a_secret_needs_a_write_scope(client, auth, runtime):
    from app.accounts import create_api_key

    make_partner(client, auth)
    ep = make_endpoint(client, auth)
    with runtime.db.begin() as session:
        _, token = create_api_key(session, "reader", ["read"])
    reader = {"Authorization": f"Bearer {token}"}
    base = f"/v1/partners/acme/endpoints/{ep['id']}"
    assert client.get(base, headers=reader).status_code == 200
    assert client.get(f"{base}/secret", headers=reader).status_code == 403


def test_secrets_are_never_logged(client, auth, caplog):
    caplog.set_level(logging.DEBUG)
    make_partner(client, auth)
    mine = generate_secret()
    ep = make_endpoint(client, auth, secret=mine)
    base = f"/v1/partners/acme/endpoints/{ep['id']}"
    rotated = client.post(f"{base}/secret/rotate", headers=auth).get_json()["secret"]
    client.get(f"{base}/secret", headers=auth)
    client.post(
        "/v1/partners/acme/endpoints",
        headers=auth,
        json={"url": "http://127.0.0.1:9/", "secret": mine + "broken"},
    )
    text = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert mine not in text and rotated not in text


# ---------------------------------------------------------------------------- credentials


def _token(runtime: Runtime, name: str, *scopes: str) -> dict[str, str]:
    with runtime.db.begin() as session:
        _, token = create_api_key(session, name, scopes)
    return {"Authorization": f"Bearer {token}"}


def test_header_values_are_write_only_and_never_stored_with_attempts(client, auth, runtime):
    contract_and_partner(client, auth)
    reader = _token(runtime, "reader", "read")
    with Receiver() as receiver, WorkerThread(runtime):
        created = make_endpoint(
            client,
            auth,
            url=f"{receiver.url}/hook",
            headers={"Authorization": "Bearer s3cr3t-value", "X-Tenant": "acme-eu"},
            public_headers=["X-Tenant"],
        )
        path = f"/v1/partners/acme/endpoints/{created['id']}"
        for answer in (
            client.get(path, headers=reader),
            client.get("/v1/partners/acme/endpoints", headers=reader),
            client.patch(path, headers=auth, json={"description": "eu"}),
        ):
            assert answer.status_code == 200
            assert "s3cr3t-value" not in answer.text
        shown = client.get(path, headers=reader).get_json()
        assert shown["headers"] == {"Authorization": None, "X-Tenant": "acme-eu"}
        # A reader's copy sent back (null) keeps the stored value; the partner still gets it.
        changed = client.patch(
            path,
            headers=auth,
            json={
                "headers": {**shown["headers"], "X-Region": "eu"},
                "public_headers": ["X-Tenant", "X-Region"],
            },
        )
        assert changed.status_code == 200, changed.get_json()
        event = client.post("/v1/partners/acme/events", headers=auth, json=order()).get_json()
        wait_for(lambda: receiver.on("/hook"), message="the webhook")
        sent = receiver.on("/hook")[0].headers
        assert (sent["authorization"], sent["x-tenant"], sent["x-region"]) == (
            "Bearer s3cr3t-value",
            "acme-eu",
            "eu",
        )
        wait_for(lambda: _attempts(runtime), message="the attempt record")
    (attempt,) = _attempts(runtime)
    assert attempt.request_headers["Authorization"] == "[redacted]"
    assert attempt.request_headers["X-Tenant"] == "acme-eu"
    detail = client.get(f"/v1/events/{event['id']}", headers=reader)
    assert "s3cr3t-value" not in detail.text


def _attempts(runtime: Runtime) -> list[Attempt]:
    with runtime.db.begin() as session:
        rows = list(session.scalars(select(Attempt)))
        session.expunge_all()
        return rows


@pytest.mark.parametrize(
    "url", ["https://user:pass@hooks.example.com/in", "https://token@hooks.example.com/in"]
)
def test_a_password_in_the_url_is_refused_at_create_and_change(client, auth, url):
    contract_and_partner(client, auth)
    response = client.post("/v1/partners/acme/endpoints", headers=auth, json={"url": url})
    assert response.status_code == 422
    error = response.get_json()["error"]
    assert error["code"] == "invalid_url" and error["details"]["reason"] == "userinfo"
    assert "header" in error["message"]
    ep = make_endpoint(client, auth, url="https://hooks.example.com/in")
    changed = client.patch(
        f"/v1/partners/acme/endpoints/{ep['id']}", headers=auth, json={"url": url}
    )
    assert changed.status_code == 422
