"""GET /openapi.json describes every /v1 route, and what the code answers matches it.

A scenario drives every operation of the publish API (and reads of the others) through a
client that validates each live response — status and body — against the document, and each
accepted request body against its documented request schema.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from jsonschema import Draft202012Validator, FormatChecker
from sqlalchemy import select

from app.accounts import create_api_key
from app.clock import utcnow
from app.config import Settings
from app.models import Attempt, Delivery, Endpoint
from app.signing import generate_secret
from app.web import create_app
from app.web.openapi import document
from sender import health
from tests.support.publish import ORDER_SCHEMA, order

IGNORED_METHODS = {"HEAD", "OPTIONS"}
_RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")

formats = FormatChecker(formats=())


@formats.checks("date-time")
def _is_rfc3339(value: object) -> bool:
    return not isinstance(value, str) or bool(_RFC3339.match(value))


def _validator(doc: dict[str, Any], schema: dict[str, Any]) -> Draft202012Validator:
    # `#/components/...` refs resolve against a root that carries the document's components.
    return Draft202012Validator({**schema, "components": doc["components"]}, format_checker=formats)


def _flask_template(rule: str) -> str:
    return re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule)


def _matcher(template: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[a-z_]+\})", template)
    pattern = "".join(
        ("(.+)" if part == "{resource_id}" else "([^/]+)")
        if part.startswith("{")
        else re.escape(part)
        for part in parts
    )
    return re.compile(f"^{pattern}$")


class CheckedClient:
    """A test client whose every answer must be one the document describes."""

    def __init__(self, client: Any, doc: dict[str, Any]) -> None:
        self.client = client
        self.doc = doc
        # Literal segments win over parameters (`/dead-letters/resend` vs `/{letter_id}`).
        self.templates = sorted(doc["paths"], key=lambda t: (t.count("{"), -len(t)))
        self.seen: set[tuple[str, str, str]] = set()

    def _operation(self, method: str, path: str) -> tuple[str, dict[str, Any]]:
        bare = path.split("?", 1)[0]
        for template in self.templates:
            operation = self.doc["paths"][template].get(method.lower())
            if operation is not None and _matcher(template).match(bare):
                return template, operation
        raise AssertionError(f"{method} {bare} is not in the OpenAPI document")

    def open(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.client.open(path, method=method, **kwargs)
        template, operation = self._operation(method, path)
        status = str(response.status_code)
        documented = operation["responses"]
        assert status in documented, (
            f"{method} {template} answered {status}, documented: {sorted(documented)}; "
            f"{response.get_data(as_text=True)[:300]}"
        )
        content = documented[status].get("content")
        if content is None:
            assert response.get_data() == b"", f"{method} {template} {status} has a body"
        else:
            body = response.get_json()
            errors = sorted(
                _validator(self.doc, content["application/json"]["schema"]).iter_errors(body),
                key=str,
            )
            assert not errors, f"{method} {template} {status}: " + "; ".join(
                f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]
            )
        if 200 <= response.status_code < 300 and "json" in kwargs and "requestBody" in operation:
            request_schema = operation["requestBody"]["content"]["application/json"]["schema"]
            errors = list(_validator(self.doc, request_schema).iter_errors(kwargs["json"]))
            assert not errors, f"accepted {method} {template} body breaks its schema: {errors}"
        self.seen.add((method.lower(), template, status))
        return response

    def get(self, path: str, **kw: Any) -> Any:
        return self.open("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> Any:
        return self.open("POST", path, **kw)

    def patch(self, path: str, **kw: Any) -> Any:
        return self.open("PATCH", path, **kw)

    def delete(self, path: str, **kw: Any) -> Any:
        return self.open("DELETE", path, **kw)


# ---------------------------------------------------------------------------- the document


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return document()


def test_document_is_served_without_a_key(tmp_path):
    app = create_app(Settings(data_dir=tmp_path))
    response = app.test_client().get("/openapi.json")
    assert response.status_code == 200
    served = response.get_json()
    assert served["openapi"].startswith("3.1") and served == json.loads(json.dumps(document()))


def test_every_flask_v1_rule_is_documented(tmp_path, doc):
    app = create_app(Settings(data_dir=tmp_path))
    missing = []
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith("/v1"):
            continue
        template = _flask_template(rule.rule)
        for method in sorted(set(rule.methods or ()) - IGNORED_METHODS):
            if method.lower() not in doc["paths"].get(template, {}):
                missing.append(f"{method} {template}")
    assert not missing, f"undocumented routes: {missing}"


def test_document_is_well_formed(doc):
    for name, body in doc["components"]["schemas"].items():
        Draft202012Validator.check_schema(body)
        assert name
    text = json.dumps(doc)
    for target in set(re.findall(r'"#/components/schemas/([A-Za-z]+)"', text)):
        assert target in doc["components"]["schemas"], target
    for template, methods in doc["paths"].items():
        declared_in_path = set(re.findall(r"\{([a-z_]+)\}", template))
        for method, operation in methods.items():
            params = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert params == declared_in_path, f"{method} {template}: {params}"
            assert operation["responses"], f"{method} {template} has no responses"
            for response in operation["responses"].values():
                for media in response.get("content", {}).values():
                    Draft202012Validator.check_schema(media["schema"])


# ---------------------------------------------------------------------------- live answers


def test_live_answers_match_the_document(client, auth, doc, runtime):
    api = CheckedClient(client, doc)
    raw = {**auth, "Content-Type": "application/json"}
    assert api.get("/v1/me", headers=auth).status_code == 200
    assert api.get("/v1/me").status_code == 401

    # event types
    et = {"name": "order.created", "version": 1, "schema": ORDER_SCHEMA, "description": "placed"}
    assert api.post("/v1/event-types", headers=auth, json=et).status_code == 201
    assert api.post("/v1/event-types", headers=auth, json=et).status_code == 200
    assert (
        api.post(
            "/v1/event-types", headers=auth, json={**et, "schema": {"type": "object"}}
        ).status_code
        == 409
    )
    assert (
        api.post(
            "/v1/event-types", headers=auth, json={**et, "version": 2, "schema": {"type": 1}}
        ).status_code
        == 422
    )
    assert api.post("/v1/event-types", headers=raw, data=b"{").status_code == 400
    assert api.post("/v1/event-types", headers=auth, data=b"x").status_code == 415
    api.post(
        "/v1/event-types",
        headers=auth,
        json={"name": "order.old", "version": 1, "schema": {"type": "object"}},
    )
    assert api.get("/v1/event-types?limit=1", headers=auth).status_code == 200
    assert api.get("/v1/event-types?limit=999", headers=auth).status_code == 400
    assert api.get("/v1/event-types/order.created/1", headers=auth).status_code == 200
    assert api.get("/v1/event-types/order.created/9", headers=auth).status_code == 404
    assert api.post("/v1/event-types/order.old/1/deprecate", headers=auth).status_code == 200
    assert (
        api.post(
            "/v1/event-types/order.old/1/deprecate",
            headers=auth,
            json={"sunset_at": "2027-01-01T00:00:00Z"},
        ).status_code
        == 200
    )
    assert api.get("/v1/event-types/order.old/versions", headers=auth).status_code == 200
    assert api.get("/v1/event-types/nope/versions", headers=auth).status_code == 404
    assert api.post("/v1/event-types/nope/1/deprecate", headers=auth).status_code == 404

    # partners
    assert (
        api.post("/v1/partners", headers=auth, json={"uid": "acme", "name": "Acme"}).status_code
        == 201
    )
    assert api.post("/v1/partners", headers=auth, json={"uid": "acme"}).status_code == 409
    assert api.post("/v1/partners", headers=auth, json={"uid": "a b"}).status_code == 422
    assert api.get("/v1/partners", headers=auth).status_code == 200
    assert api.get("/v1/partners/acme", headers=auth).status_code == 200
    assert api.get("/v1/partners/ghost", headers=auth).status_code == 404
    opt_in = {"operational_events": True}
    assert api.patch("/v1/partners/acme", headers=auth, json=opt_in).status_code == 200
    assert api.patch("/v1/partners/acme", headers=auth, json={"x": 1}).status_code == 422
    assert api.patch("/v1/partners/ghost", headers=auth, json=opt_in).status_code == 404
    assert (
        api.post("/v1/partners", headers=auth, json={"uid": "kurir-operators"}).status_code == 422
    )

    # endpoints
    base = "/v1/partners/acme/endpoints"
    created = api.post(
        base,
        headers=auth,
        json={
            "url": "http://127.0.0.1:9/hook",
            "event_types": ["order.created"],
            "description": "d",
            "headers": {"X-Team": "a"},
            "timeout_s": 10,
            "rate_limit_per_s": 3,
            "secret": generate_secret(),
        },
    )
    assert created.status_code == 201
    ep = created.get_json()["id"]
    plain = api.post(base, headers=auth, json={"url": "http://127.0.0.1:9/two"}).get_json()
    parked = api.post(base, headers=auth, json={"url": "http://127.0.0.1:9/three"}).get_json()
    assert (
        api.post(
            base, headers=auth, json={"url": "http://127.0.0.1:9/", "headers": {"Host": "x"}}
        ).status_code
        == 422
    )
    assert (
        api.post(
            "/v1/partners/ghost/endpoints", headers=auth, json={"url": "http://127.0.0.1:9/"}
        ).status_code
        == 404
    )
    assert api.get(base, headers=auth).status_code == 200
    assert api.get(f"{base}?state=enabled&limit=1", headers=auth).status_code == 200
    assert api.get(f"{base}/{ep}", headers=auth).status_code == 200
    assert api.get(f"{base}/ep_nope", headers=auth).status_code == 404
    assert (
        api.patch(
            f"{base}/{ep}",
            headers=auth,
            json={"timeout_s": 5, "description": None, "rate_limit_per_s": None},
        ).status_code
        == 200
    )
    assert api.patch(f"{base}/{ep}", headers=auth, json={"timeout_s": 0}).status_code == 422
    assert api.post(f"{base}/{ep}/disable", headers=auth).status_code == 200
    assert (
        api.post(f"{base}/{ep}/disable", headers=auth, json={"reason": "maintenance"}).status_code
        == 200
    )
    assert api.post(f"{base}/{ep}/recover", headers=auth, json={}).status_code == 422
    assert api.post(f"{base}/{ep}/recover", headers=auth, json={"since": "x"}).status_code == 422
    assert (
        api.post(
            f"{base}/{ep}/recover", headers=auth, json={"since": "2020-01-01T00:00:00Z"}
        ).status_code
        == 409  # disabled
    )
    assert api.post(f"{base}/{ep}/enable", headers=auth).status_code == 200
    recovering = api.post(
        f"{base}/{ep}/recover", headers=auth, json={"since": "2020-01-01T00:00:00Z"}
    )
    assert recovering.status_code == 202
    job_id = recovering.get_json()["operation"]["id"]
    assert api.get(f"/v1/operations/{job_id}", headers=auth).status_code == 200
    assert api.get("/v1/operations/bop_nope", headers=auth).status_code == 404
    assert api.post(f"{base}/{ep}/secret/rotate", headers=auth).status_code == 200
    assert (
        api.post(
            f"{base}/{ep}/secret/rotate", headers=auth, json={"secret": generate_secret()}
        ).status_code
        == 200
    )
    assert (
        api.post(f"{base}/{ep}/secret/rotate", headers=auth, json={"secret": "nope"}).status_code
        == 422
    )
    assert api.get(f"{base}/{ep}/secret", headers=auth).status_code == 200
    assert (
        api.patch(
            f"{base}/{ep}", headers=auth, json={"ordering": "key", "on_dead": "block"}
        ).status_code
        == 200
    )
    assert api.patch(f"{base}/{ep}", headers=auth, json={"ordering": "fifo"}).status_code == 422
    assert api.get(f"{base}/{ep}/blocked-keys?limit=5", headers=auth).status_code == 200
    assert api.get(f"{base}/{ep}/blocked-keys?cursor=%25%25", headers=auth).status_code == 400
    assert api.get(f"{base}/ep_nope/blocked-keys", headers=auth).status_code == 404
    tried = api.post(
        f"{base}/{ep}/filter-test",
        headers=auth,
        json={"filter": "data.amount > `1`", "event": {"type": "x", "data": {"amount": 2}}},
    )
    assert tried.status_code == 200 and tried.get_json()["matched"] == 1
    assert (
        api.post(f"{base}/{ep}/filter-test", headers=auth, json={"filter": "a.["}).status_code
        == 422
    )
    assert api.post(f"{base}/ep_nope/filter-test", headers=auth).status_code == 404
    assert api.post(f"{base}/{ep}/filter-test", headers=raw, data=b"{").status_code == 400
    assert api.post(f"{base}/{ep}/filter-test", headers=auth, data=b"x").status_code == 415
    tested = api.post(f"{base}/{ep}/test", headers=auth)
    assert tested.status_code == 202 and tested.get_json()["state"] == "pending"
    assert api.post(f"{base}/ep_nope/test", headers=auth).status_code == 404
    assert api.post(f"{base}/{ep}/probe", headers=auth).status_code == 409  # enabled
    assert api.post(f"{base}/ep_nope/probe", headers=auth).status_code == 404
    with runtime.db.begin() as session:  # as the engine disables it after failures
        health.disable(session, ep, "failing", utcnow(), probe=True)
    assert api.post(f"{base}/{ep}/probe", headers=auth).status_code == 202
    assert api.post(f"{base}/{ep}/enable", headers=auth).status_code == 200
    # ownership verification: a new challenge, a wrong answer, the right one
    waiting = api.post(base, headers=auth, json={"url": "http://127.0.0.1:9/v", "verify": True})
    assert waiting.status_code == 201 and waiting.get_json()["verification"] is not None
    vep = waiting.get_json()["id"]
    assert api.post(f"{base}/{vep}/verify/resend", headers=auth).status_code == 202
    wrong = api.post(f"{base}/{vep}/verify", headers=auth, json={"challenge": "nope"})
    assert wrong.status_code == 422
    with runtime.db.begin() as session:
        sealed = session.get_one(Endpoint, vep).challenge_encrypted
    challenge = runtime.secret_box.decrypt(sealed)
    verified = api.post(f"{base}/{vep}/verify", headers=auth, json={"challenge": challenge})
    assert verified.status_code == 200 and verified.get_json()["state"] == "enabled"
    assert api.post(f"{base}/{vep}/verify/resend", headers=auth).status_code == 409
    assert (
        api.get(
            f"/v1/deliveries?endpoint={ep}&state=pending&type=kurir.test"
            f"&status_code=none&since=2020-01-01T00:00:00Z",
            headers=auth,
        ).status_code
        == 200
    )
    assert api.get("/v1/deliveries?state=lost", headers=auth).status_code == 400
    assert api.get("/v1/deliveries?partner=ghost", headers=auth).status_code == 404

    # partner keys and portal links
    partner_key = api.post(
        "/v1/partners/acme/keys",
        headers=auth,
        json={"name": "acme self-service", "scopes": ["read"]},
    )
    assert partner_key.status_code == 201 and partner_key.get_json()["key"]
    assert (
        api.post(
            "/v1/partners/acme/keys", headers=auth, json={"name": "x", "scopes": ["events:write"]}
        ).status_code
        == 422
    )
    assert api.post("/v1/partners/ghost/keys", headers=auth, json={"name": "x"}).status_code == 404
    assert api.post("/v1/partners/acme/portal-links", headers=auth).status_code == 201
    assert (
        api.post(
            "/v1/partners/acme/portal-links", headers=auth, json={"expires_in_s": 3600}
        ).status_code
        == 201
    )
    assert (
        api.post(
            "/v1/partners/acme/portal-links", headers=auth, json={"expires_in_s": 5}
        ).status_code
        == 422
    )
    assert api.post("/v1/partners/ghost/portal-links", headers=auth).status_code == 404
    revoked = api.delete("/v1/partners/acme/portal-sessions", headers=auth)
    assert revoked.get_json() == {"ended": 0, "revoked": 2}
    assert api.delete("/v1/partners/ghost/portal-sessions", headers=auth).status_code == 404
    assert api.post(f"{base}/{parked['id']}/disable", headers=auth).status_code == 200
    assert api.delete(f"{base}/{plain['id']}", headers=auth).status_code == 204
    assert api.delete(f"{base}/{plain['id']}", headers=auth).status_code == 404

    # events
    events = "/v1/partners/acme/events"
    full = order(
        resource={"type": "order", "id": "o-1", "version": 3},
        correlation_id="c-1",
        occurred_at="2026-12-02T10:00:00Z",
    )
    published = api.post(events, headers={**auth, "Idempotency-Key": "k1"}, json=full)
    assert published.status_code == 202
    replay = api.post(events, headers={**auth, "Idempotency-Key": "k1"}, json=full)
    assert replay.status_code == 202 and replay.headers["Idempotent-Replayed"] == "true"
    assert (
        api.post(
            events, headers={**auth, "Idempotency-Key": "k1"}, json=order(amount=1)
        ).status_code
        == 422
    )
    assert (
        api.post(events, headers={**auth, "Idempotency-Key": ""}, json=order()).status_code == 400
    )
    assert (
        api.post(
            events, headers=auth, json=order(resource={"type": "order", "id": "x"})
        ).status_code
        == 202
    )
    assert (
        api.post(
            events, headers=auth, json={"type": "order.old", "version": 1, "data": {}}
        ).status_code
        == 202
    )
    assert api.post(events, headers=auth, json={**order(), "data": {}}).status_code == 422
    assert (
        api.post(events, headers=auth, json={"type": "x", "version": 1, "data": {}}).status_code
        == 422
    )
    assert api.post("/v1/partners/ghost/events", headers=auth, json=order()).status_code == 404
    assert api.post(events, headers=raw, data=b"[").status_code == 400
    assert api.post(events, headers=auth, data=b"{}").status_code == 415
    big = b"x" * (runtime.settings.max_payload_bytes + 1)
    assert api.post(events, headers=raw, data=big).status_code == 413
    assert api.get(events, headers=auth).status_code == 200
    assert (
        api.get(
            f"{events}?type=order.created&delivery_success=false&limit=1"
            f"&since=2020-01-01T00:00:00Z&until=2100-01-01T00:00:00Z",
            headers=auth,
        ).status_code
        == 200
    )
    assert api.get(f"{events}?since=soon", headers=auth).status_code == 400
    assert api.get("/v1/partners/ghost/events", headers=auth).status_code == 404
    event_id = published.get_json()["id"]
    with runtime.db.begin() as session:
        delivery = session.scalars(
            select(Delivery).where(Delivery.event_id == event_id, Delivery.state == "pending")
        ).first()
        session.add(
            Attempt(
                delivery_id=delivery.id,
                n=1,
                started_at=utcnow(),
                duration_ms=3,
                url="http://127.0.0.1:9/hook",
                request_headers={},
                response_status=503,
                response_body=b"busy",
                error=None,
            )
        )
    detail = api.get(f"/v1/events/{event_id}", headers=auth)
    assert detail.status_code == 200
    assert any(d["attempts"] for d in detail.get_json()["deliveries"])
    assert api.get("/v1/events/evt_nope", headers=auth).status_code == 404

    # feed and pull endpoints
    feed = "/v1/partners/acme/feed"
    pull = api.post(base, headers=auth, json={"mode": "pull", "description": "poller"})
    assert pull.status_code == 201
    assert api.post(events, headers=auth, json=order("o-pulled")).status_code == 202
    page = api.get(f"{feed}?limit=2", headers=auth)
    assert page.status_code == 200 and page.get_json()["data"]
    cursor = page.get_json()["next_cursor"]
    assert (
        api.get(f"{feed}?after={cursor}&endpoint={pull.get_json()['id']}", headers=auth).status_code
        == 200
    )
    assert api.get(f"{feed}?after=nope", headers=auth).status_code == 400
    assert api.get("/v1/partners/ghost/feed", headers=auth).status_code == 404
    pull_base = f"{base}/{pull.get_json()['id']}"
    assert api.get(pull_base, headers=auth).get_json()["lag"]["events"] >= 1
    assert api.post(f"{pull_base}/ack", headers=auth, json={"cursor": cursor}).status_code == 200
    assert api.post(f"{pull_base}/ack", headers=auth, json={}).status_code == 422
    assert api.post(f"{pull_base}/ack", headers=auth, data=b"x").status_code == 415
    assert (
        api.post(f"{base}/{parked['id']}/ack", headers=auth, json={"cursor": cursor}).status_code
        == 409
    )

    # the other families, read side: the shapes their owners documented
    letters = api.get("/v1/dead-letters", headers=auth)
    assert letters.status_code == 200 and letters.get_json()["data"]
    letter = letters.get_json()["data"][0]["id"]
    assert api.get(f"/v1/dead-letters/{letter}", headers=auth).status_code == 200
    assert api.get("/v1/sources", headers=auth).status_code == 200
    assert api.get("/v1/inbound-events", headers=auth).status_code == 200
    assert api.get("/v1/inbound-handlers", headers=auth).status_code == 200

    # keys and the audit trail
    with runtime.db.begin() as session:
        spare, _ = create_api_key(session, "spare", ["read"])
        spare_id = spare.id
    listed = api.get("/v1/keys?limit=5", headers=auth)
    assert listed.status_code == 200 and spare_id in {k["id"] for k in listed.get_json()["data"]}
    assert api.get(f"/v1/keys/{spare_id}", headers=auth).status_code == 200
    assert api.get("/v1/keys/key_nope", headers=auth).status_code == 404
    assert api.delete(f"/v1/keys/{spare_id}", headers=auth).status_code == 200
    assert api.delete(f"/v1/keys/{spare_id}", headers=auth).status_code == 409
    trail = api.get(f"/v1/audit?subject={ep}", headers=auth)
    assert trail.status_code == 200 and trail.get_json()["data"]

    # every operation of the publish API was seen succeeding
    mine = {"keys", "event-types", "partners", "endpoints", "events"}
    expected = {
        (method, template)
        for template, methods in doc["paths"].items()
        for method, operation in methods.items()
        if set(operation["tags"]) & mine
    }
    succeeded = {(m, t) for m, t, status in api.seen if status.startswith("2")}
    assert expected <= succeeded, sorted(expected - succeeded)
