"""Operators' side of inbound: /v1/sources, /v1/inbound-events, replay, and the CLI."""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any

import pytest
import requests
from click.testing import CliRunner
from sqlalchemy import select

from app.accounts import create_api_key
from app.cli import cli
from app.inbound import process, receive
from app.models import InboundEvent, InboundSourceSecret
from app.runtime import Runtime
from app.web import create_app
from app.web.auth import clear_cache
from tests.support import inbound as kit

SW = "standard-webhooks"
HERE = __name__
_ran: list[str] = []


def _token(runtime: Runtime, *scopes: str) -> dict[str, str]:
    with runtime.db.begin() as session:
        _, token = create_api_key(session, "svc", list(scopes))
    return {"Authorization": f"Bearer {token}"}


def _store(
    runtime: Runtime,
    name: str,
    event_id: str,
    version: int,
    status: str,
    resource_id: str = "pay_1",
) -> str:
    body, headers = kit.signed_callback(
        SW, event_id=event_id, resource_id=resource_id, version=version, status=status
    )
    return receive.receive(runtime, name, headers, body).inbound_event_id


def test_create_and_read_a_source_over_the_api(runtime, live_server, auth):
    spec = {
        "name": "acme-pay",
        "scheme": "stripe",
        "secrets": [kit.SECRETS["stripe"], kit.OTHER_SECRETS["stripe"]],
        "tolerance_s": 120,
        "mapping": {"resource_version": "/data/object/metadata/rev", "status": None},
        "allow_gaps": False,
        "reconcile_url": "http://127.0.0.1:9/state",
    }
    created = requests.post(f"{live_server.url}/v1/sources", json=spec, headers=auth, timeout=10)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["name"] == "acme-pay" and body["scheme"] == "stripe"
    assert body["tolerance_s"] == 120 and body["allow_gaps"] is False
    assert body["mapping"]["event_id"] == "/id"  # the Stripe preset
    assert body["mapping"]["resource_version"] == "/data/object/metadata/rev"
    assert body["mapping"]["status"] is None
    assert body["receive_path"] == "/inbound/acme-pay"
    assert len(body["secrets"]) == 2 and "secret" not in str(body["secrets"]).lower().replace(
        "secrets", ""
    )
    assert kit.SECRETS["stripe"] not in created.text
    with runtime.db.begin() as session:  # encrypted at rest
        stored = [s.secret_encrypted for s in session.scalars(select(InboundSourceSecret))]
    assert stored and all(kit.SECRETS["stripe"] not in s for s in stored)

    one = requests.get(f"{live_server.url}/v1/sources/acme-pay", headers=auth, timeout=10)
    assert one.status_code == 200 and one.json()["id"] == body["id"]
    listed = requests.get(f"{live_server.url}/v1/sources", headers=auth, timeout=10).json()
    assert [s["name"] for s in listed["data"]] == ["acme-pay"]
    assert listed["next_cursor"] is None
    # The source works at once with either secret.
    for n, secret in enumerate((kit.SECRETS["stripe"], kit.OTHER_SECRETS["stripe"])):
        payload, headers = kit.signed_callback(
            "stripe", secret=secret, event_id=f"evt_{n}", resource_id="pi_1"
        )
        answer = requests.post(
            f"{live_server.url}/inbound/acme-pay", data=payload, headers=dict(headers), timeout=10
        )
        assert answer.status_code == 202


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"scheme": "hmac-md5"}, "invalid_source"),
        ({"name": "Bad Name!"}, "invalid_source"),
        ({"secrets": []}, "invalid_secret"),
        ({"secrets": [" padded "]}, "invalid_secret"),
        ({"mapping": {"event_id": "data.id"}}, "invalid_mapping"),
        ({"mapping": {"colour": "/x"}}, "invalid_mapping"),
        ({"tolerance_s": 0}, "invalid_source"),
        ({"handlers": ["no.such.module:fn"]}, "unknown_handler"),
        ({"handlers": [{"path": "os:system"}]}, "unknown_handler"),
        ({"handlers": 5}, "invalid_handler"),
        ({"reconcile_url": "gopher://x"}, "invalid_reconcile_url"),
        ({"surprise": 1}, "invalid_source"),
    ],
)
def test_invalid_sources_are_422_naming_the_problem(client, auth, change, code):
    spec = {"name": "acme", "scheme": "github", "secret": "s3cret", **change}
    response = client.post("/v1/sources", json=spec, headers=auth)
    assert response.status_code == 422, response.get_json()
    assert response.get_json()["error"]["code"] == code


def test_standard_webhooks_secret_must_decode(client, auth):
    response = client.post(
        "/v1/sources",
        headers=auth,
        json={"name": "acme", "scheme": SW, "secret": "whsec_!!!not-base64"},
    )
    assert response.status_code == 422


def test_duplicate_source_name_is_409(client, auth):
    spec = {"name": "acme", "scheme": "github", "secret": "s3cret"}
    assert client.post("/v1/sources", json=spec, headers=auth).status_code == 201
    again = client.post("/v1/sources", json=spec, headers=auth)
    assert again.status_code == 409 and again.get_json()["error"]["code"] == "source_exists"


def test_scopes_read_may_look_sources_write_may_change(runtime, client):
    reader = _token(runtime, "read")
    writer = _token(runtime, "sources:write")
    other = _token(runtime, "events:write")
    spec = {"name": "acme", "scheme": "github", "secret": "s3cret"}
    assert client.post("/v1/sources", json=spec, headers=reader).status_code == 403
    assert client.post("/v1/sources", json=spec, headers=other).status_code == 403
    assert client.post("/v1/sources", json=spec, headers=writer).status_code == 201
    assert client.get("/v1/sources/acme", headers=reader).status_code == 200
    assert client.get("/v1/sources").status_code == 401


def test_rotating_a_secret_keeps_the_old_one_for_the_overlap(runtime, client, auth):
    kit.create_source(runtime, "gh", "github")
    response = client.post(
        "/v1/sources/gh/secrets", headers=auth, json={"secret": "the-new-one", "rotate": True}
    )
    assert response.status_code == 201
    secrets = response.get_json()["secrets"]
    assert len(secrets) == 2 and all(s["active"] for s in secrets)
    assert secrets[0]["expires_at"] is None and secrets[1]["expires_at"] is not None
    for n, secret in enumerate(("the-new-one", kit.SECRETS["github"])):
        body, headers = kit.signed_callback(
            "github", secret=secret, event_id=f"d{n}", resource_id="7"
        )
        assert client.post("/inbound/gh", data=body, headers=headers).status_code == 202


def test_resource_state_endpoint(runtime, client, auth):
    kit.create_source(runtime, "psp", SW)
    assert client.get("/v1/sources/psp/resources/pay_1", headers=auth).status_code == 404
    process.process_event(_store(runtime, "psp", "e1", 3, "paid"))
    answer = client.get("/v1/sources/psp/resources/pay_1", headers=auth)
    assert answer.status_code == 200
    body = answer.get_json()
    assert {k: body[k] for k in ("status", "version")} == {"status": "paid", "version": 3}
    assert body["occurred_at"].endswith("Z") and body["updated_at"].endswith("Z")
    assert client.get("/v1/sources/nope/resources/pay_1", headers=auth).status_code == 404


def test_inbound_events_are_listed_by_status_source_and_resource(runtime, client, auth):
    kit.create_source(runtime, "psp", SW)
    kit.create_source(runtime, "other", SW)
    new = _store(runtime, "psp", "e2", 2, "paid")
    old = _store(runtime, "psp", "e1", 1, "created")
    elsewhere = _store(runtime, "psp", "e9", 1, "created", resource_id="pay_9")
    foreign = _store(runtime, "other", "e1", 1, "created")
    for event_id in (new, old):
        process.process_event(event_id)

    def ids(query: str) -> list[str]:
        response = client.get(f"/v1/inbound-events{query}", headers=auth)
        assert response.status_code == 200, response.get_json()
        return [e["id"] for e in response.get_json()["data"]]

    assert ids("") == [foreign, elsewhere, old, new]  # newest first
    assert ids("?source=psp") == [elsewhere, old, new]
    assert ids("?source=psp&status=ignored") == [old]
    assert ids("?status=received") == [foreign, elsewhere]
    assert ids("?resource_id=pay_9") == [elsewhere]
    assert client.get("/v1/inbound-events?status=bogus", headers=auth).status_code == 400
    assert client.get("/v1/inbound-events?source=nope", headers=auth).status_code == 404

    first = client.get("/v1/inbound-events?limit=3", headers=auth).get_json()
    assert len(first["data"]) == 3 and first["next_cursor"]
    rest = client.get(
        f"/v1/inbound-events?limit=3&cursor={first['next_cursor']}", headers=auth
    ).get_json()
    assert [e["id"] for e in rest["data"]] == [new] and rest["next_cursor"] is None

    shape = client.get("/v1/inbound-events?source=psp&status=ignored", headers=auth).get_json()[
        "data"
    ][0]
    assert set(shape) == {
        "id",
        "source",
        "event_id",
        "event_type",
        "resource_id",
        "resource_version",
        "occurred_at",
        "status",
        "reason",
        "received_at",
        "created_at",
    }
    assert shape["created_at"] == shape["received_at"]
    assert (shape["source"], shape["event_id"], shape["status"], shape["reason"]) == (
        "psp",
        "e1",
        "ignored",
        "stale_event",
    )
    assert shape["resource_version"] == 1 and shape["event_type"] == "payment.created"


def test_inbound_event_detail_and_replay(runtime, client, auth):
    kit.create_source(runtime, "psp", SW)
    old = _store(runtime, "psp", "e1", 1, "created")
    process.process_event(_store(runtime, "psp", "e2", 2, "paid"))
    process.process_event(old)
    detail = client.get(f"/v1/inbound-events/{old}", headers=auth)
    assert detail.status_code == 200
    body: dict[str, Any] = detail.get_json()
    assert body["status"] == "ignored" and body["reason"] == "stale_event"
    assert body["headers"]["webhook-id"] == "e1"
    with runtime.db.begin() as session:
        assert body["body"].encode() == session.get(InboundEvent, old).raw_body
    assert client.get("/v1/inbound-events/ine_nope", headers=auth).status_code == 404

    reader = _token(runtime, "read")
    assert client.post(f"/v1/inbound-events/{old}/replay", headers=reader).status_code == 403
    replayed = client.post(f"/v1/inbound-events/{old}/replay", headers=auth)
    assert replayed.status_code == 202
    assert replayed.get_json()["status"] == "received"
    assert process.process_event(old) == "ignored"  # and the state did not regress
    state = client.get("/v1/sources/psp/resources/pay_1", headers=auth).get_json()
    assert (state["status"], state["version"]) == ("paid", 2)
    assert client.post("/v1/inbound-events/ine_nope/replay", headers=auth).status_code == 404


def _cli_env(settings: Any) -> dict[str, str]:
    return {
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": settings.redis_url,
        "KURIR_DATA_DIR": str(settings.data_dir),
        "KURIR_SECRET_KEY": settings.secret_key,
        "KURIR_ALLOW_PRIVATE_TARGETS": "1",
    }


def test_cli_sources_create_and_ls(runtime, settings, client):
    env = _cli_env(settings)
    result = CliRunner().invoke(
        cli,
        [
            "sources",
            "create",
            "acme",
            "--scheme",
            "standard-webhooks",
            "--secret",
            kit.SECRETS[SW],
            "--secret",
            kit.OTHER_SECRETS[SW],
            "--tolerance",
            "60",
            "--resource-id",
            "/order/id",
            "--resource-version",
            "/order/rev",
            "--occurred-at",
            "header:X-Occurred-At",
            "--status",
            "none",
            "--event-type",
            "/kind",
            "--event-id",
            "header:webhook-id",
            "--reconcile-url",
            "http://127.0.0.1:9/orders",
            "--no-gaps",
        ],
        env=env,
    )
    assert result.exit_code == 0, result.output
    assert "receive at: POST /inbound/acme" in result.output
    listed = CliRunner().invoke(cli, ["sources", "ls"], env=env)
    assert listed.exit_code == 0
    row = listed.output.splitlines()[1].split()
    assert row[:5] == ["acme", "standard-webhooks", "2", "60", "no"]
    assert row[5] == "http://127.0.0.1:9/orders"
    with runtime.db.begin() as session:
        from app.inbound.sources import effective_mapping, get_source

        source = get_source(session, "acme")
        mapping = effective_mapping(source)
        assert (source.tolerance_s, source.allow_gaps) == (60, False)
    assert (
        mapping.resource_id,
        mapping.resource_version,
        mapping.occurred_at,
        mapping.status,
        mapping.event_type,
        mapping.event_id,
    ) == ("/order/id", "/order/rev", "header:X-Occurred-At", None, "/kind", "header:webhook-id")
    # Callbacks in the custom shape are accepted and read with the custom mapping.
    import json

    body = json.dumps({"kind": "order.paid", "order": {"id": "o-1", "rev": 1}}).encode()
    headers = kit.sign(
        SW, kit.SECRETS[SW], body, [("webhook-id", "w1"), ("X-Occurred-At", "2026-01-01T00:00:00Z")]
    )
    assert client.post("/inbound/acme", data=body, headers=headers).status_code == 202

    bad = CliRunner().invoke(
        cli, ["sources", "create", "acme", "--scheme", "github", "--secret", "x"], env=env
    )
    assert bad.exit_code == 1 and "already exists" in bad.output
    bad = CliRunner().invoke(
        cli,
        ["sources", "create", "b", "--scheme", "github", "--secret", "x", "--event-id", "nope"],
        env=env,
    )
    assert bad.exit_code == 1 and "event_id" in bad.output


def test_cli_add_secret(runtime, settings):
    kit.create_source(runtime, "gh", "github")
    result = CliRunner().invoke(
        cli, ["sources", "add-secret", "gh", "--secret", "new", "--rotate"], env=_cli_env(settings)
    )
    assert result.exit_code == 0, result.output
    with runtime.db.begin() as session:
        rows = list(session.scalars(select(InboundSourceSecret)))
    assert len(rows) == 2 and sum(1 for r in rows if r.expires_at is not None) == 1


def test_unknown_ids_on_inbound_paths_are_plain_not_found(runtime, client, auth):
    # One code for "no such thing" on every path, as on the publish side.
    kit.create_source(runtime, "psp", "standard-webhooks")
    for method, path in [
        ("get", "/v1/sources/nope"),
        ("get", "/v1/sources/nope/resources/x"),
        ("get", "/v1/sources/psp/resources/x"),
        ("get", "/v1/inbound-events/ine_nope"),
        ("post", "/v1/inbound-events/ine_nope/replay"),
        ("post", "/inbound/nope"),
    ]:
        extra = {} if path.startswith("/v1") else {"data": b"{}"}
        answer = getattr(client, method)(path, headers=auth, **extra)
        assert answer.status_code == 404, path
        error = answer.get_json()["error"]
        assert error["code"] == "not_found", (path, error)
        assert error["details"], (path, error)


def test_inbound_events_filter_by_received_time(runtime, client, auth):
    kit.create_source(runtime, "psp", SW)
    first = _store(runtime, "psp", "e1", 1, "paid")
    with runtime.db.begin() as session:
        received = session.get_one(InboundEvent, first).received_at
    later = (received + timedelta(seconds=1)).isoformat().replace("+00:00", "Z")

    def ids(query: str) -> list[str]:
        answer = client.get(f"/v1/inbound-events?{query}", headers=auth)
        assert answer.status_code == 200, answer.get_json()
        return [e["id"] for e in answer.get_json()["data"]]

    assert ids(f"since={later}") == []
    assert ids(f"until={later}") == [first]
    assert ids("since=2000-01-01T00:00:00%2B05:30") == [first]
    for bad in ("since=garbage", "until=2026-13-01"):
        answer = client.get(f"/v1/inbound-events?{bad}", headers=auth)
        assert answer.status_code == 400
        assert answer.get_json()["error"]["code"] == "invalid_parameter"


# ---------------------------------------------------------------------------- handlers


def record_handler(ctx: Any) -> None:
    _ran.append(ctx.event.event_id)


def test_an_api_key_cannot_name_code_for_the_worker_to_run(client, auth, tmp_path, monkeypatch):
    """Handlers are code: over HTTP a source selects registered names only. A module path
    is refused with 422 and never imported (this module would write a file if it were)."""
    planted = tmp_path / "planted"
    planted.mkdir()
    marker = tmp_path / "imported"
    (planted / "kurir_planted_module.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\ndef run(ctx):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(planted))
    for handlers in (
        ["kurir_planted_module:run"],
        [{"path": "kurir_planted_module:run"}],
        ["os:system"],
        [{"event_type": "*", "handler": "os:system"}],
    ):
        response = client.post(
            "/v1/sources",
            headers=auth,
            json={
                "name": "psp",
                "scheme": "standard-webhooks",
                "secret": kit.SECRETS["standard-webhooks"],
                "handlers": handlers,
            },
        )
        assert response.status_code == 422, handlers
        assert response.get_json()["error"]["code"] == "unknown_handler"
    assert not marker.exists()
    assert "kurir_planted_module" not in sys.modules
    assert client.get("/v1/sources", headers=auth).get_json()["data"] == []


def test_a_source_selects_a_handler_the_operator_registered_by_name(
    settings, migrated, redis_client
):
    registered = settings.with_overrides(inbound_handlers=(("record", f"{HERE}:record_handler"),))
    rt = Runtime(registered, database=migrated.db)
    from app import runtime as runtime_mod

    runtime_mod.install(rt)
    try:
        clear_cache()
        client = create_app(runtime=rt).test_client()
        admin = _token(rt, "admin")
        listed = client.get("/v1/inbound-handlers", headers=admin).get_json()["data"]
        assert listed == [{"name": "record", "path": f"{HERE}:record_handler"}]
        created = client.post(
            "/v1/sources",
            headers=admin,
            json={
                "name": "psp",
                "scheme": "standard-webhooks",
                "secret": kit.SECRETS["standard-webhooks"],
                "handlers": [{"event_type": "payment.*", "handler": "record"}],
            },
        )
        assert created.status_code == 201, created.get_json()
        assert created.get_json()["handlers"] == [
            {"event_type": "payment.*", "handler": "record", "side_effect_only": False}
        ]
        _ran.clear()
        body, headers = kit.signed_callback(
            "standard-webhooks", event_id="e-1", resource_id="pay_1", version=1, status="paid"
        )
        receipt = receive.receive(rt, "psp", headers, body)

        assert process.process_event(receipt.inbound_event_id) == "applied"
        assert _ran == ["e-1"]
    finally:
        rt.close()
        runtime_mod.install(None)  # type: ignore[arg-type]
