"""Publishing: validation, fan-out, after-commit."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
from rq import Queue
from sqlalchemy import select

from app.clock import parse_time, utcnow
from app.intake.publish import publish_in_transaction
from app.models import DeadLetter, DeadLetterAudit, Delivery, Event
from app.ports import free_port
from app.queues import DELIVER_BATCH, DELIVERIES
from app.runtime import Runtime
from app.web import create_app
from sender.dispatch import job_specs
from tests.support.publish import (
    contract_and_partner,
    counts,
    error_of,
    make_endpoint,
    make_event_type,
    make_partner,
    order,
)

# Run once more through PgBouncer in transaction mode (tests/conftest.py).
pytestmark = pytest.mark.pgbouncer


@pytest.fixture
def acme(client, auth):
    return contract_and_partner(client, auth)


def _queued_ids(redis_client) -> list[str]:
    queue = Queue(DELIVERIES, connection=redis_client)
    ids: list[str] = []
    for job in queue.jobs:
        ids.extend(job.args[0])
    return ids


def test_publish_answers_202_with_deliveries(client, auth, acme, runtime):
    ep = make_endpoint(client, auth)
    response = client.post("/v1/partners/acme/events", headers=auth, json=order())
    assert response.status_code == 202, response.get_json()
    body = response.get_json()
    assert set(body) == {"id", "type", "version", "deliveries", "warnings"}
    assert body["id"].startswith("evt_") and len(body["id"]) == 30
    assert (body["type"], body["version"], body["warnings"]) == ("order.created", 1, [])
    [delivery] = body["deliveries"]
    assert delivery["endpoint"] == ep["id"] and delivery["state"] == "pending"
    assert delivery["id"].startswith("dlv_")
    with runtime.db.Session() as session:
        row = session.get(Delivery, delivery["id"])
        assert row.state == "pending" and row.event_id == body["id"]
        assert abs(row.next_attempt_at - utcnow()) < timedelta(seconds=30)


def test_event_ids_sort_in_publish_order(client, auth, acme):
    ids = [
        client.post("/v1/partners/acme/events", headers=auth, json=order(f"o-{i}")).get_json()["id"]
        for i in range(5)
    ]
    assert ids == sorted(ids) and len(set(ids)) == 5


def test_payload_is_the_exact_spec_body(client, auth, acme, runtime):
    make_endpoint(client, auth)
    body = order(
        resource={"type": "order", "id": "o-1", "version": 7},
        correlation_id="corr-1",
        occurred_at="2026-12-02T10:00:00+01:00",
    )
    event_id = client.post("/v1/partners/acme/events", headers=auth, json=body).get_json()["id"]
    with runtime.db.Session() as session:
        event = session.get(Event, event_id)
    payload = json.loads(event.payload)
    assert list(payload) == [
        "id",
        "type",
        "version",
        "occurred_at",
        "partner",
        "resource",
        "correlation_id",
        "data",
    ]
    assert payload == {
        "id": event_id,
        "type": "order.created",
        "version": 1,
        "occurred_at": "2026-12-02T09:00:00Z",
        "partner": "acme",
        "resource": {"type": "order", "id": "o-1", "version": 7},
        "correlation_id": "corr-1",
        "data": {"order_id": "o-1", "amount": 100},
    }
    assert (event.resource_type, event.resource_id, event.resource_version) == ("order", "o-1", 7)
    assert event.correlation_id == "corr-1"


def test_defaults_occurred_at_now_and_null_resource(client, auth, acme, runtime):
    event_id = client.post("/v1/partners/acme/events", headers=auth, json=order()).get_json()["id"]
    with runtime.db.Session() as session:
        payload = json.loads(session.get(Event, event_id).payload)
    assert payload["resource"] is None and payload["correlation_id"] is None
    assert abs(parse_time(payload["occurred_at"]) - utcnow()) < timedelta(seconds=30)


def test_resource_version_is_optional(client, auth, acme):
    response = client.post(
        "/v1/partners/acme/events",
        headers=auth,
        json=order(resource={"type": "order", "id": "o-1"}),
    )
    assert response.status_code == 202


@pytest.mark.parametrize(
    "resource",
    [
        {"type": "order"},
        {"id": "o-1"},
        "order",
        {"type": "order", "id": "o", "version": -1},
        {"type": "order", "id": "o", "extra": 1},
    ],
)
def test_malformed_resource_is_422(client, auth, acme, resource):
    response = client.post("/v1/partners/acme/events", headers=auth, json=order(resource=resource))
    assert response.status_code == 422


def test_unicode_and_control_characters_survive_both_databases(client, auth, runtime):
    make_event_type(client, auth, "note.added", schema={"type": "object"})
    make_partner(client, auth, "acme")
    data = {"text": "café ✓ \u0000 nul \n new line", "emoji": "🚀"}
    event_id = client.post(
        "/v1/partners/acme/events",
        headers=auth,
        json={"type": "note.added", "version": 1, "data": data},
    ).get_json()["id"]
    with runtime.db.Session() as session:
        event = session.get(Event, event_id)
    assert json.loads(event.payload)["data"] == data
    assert "café" in event.payload  # kept readable for the dead-letter text search


def test_data_violating_schema_is_422_with_every_error(client, auth, acme, runtime):
    make_endpoint(client, auth)
    before = counts(runtime.db)
    response = client.post(
        "/v1/partners/acme/events",
        headers=auth,
        json={
            "type": "order.created",
            "version": 1,
            "data": {"amount": -5, "currency": "GBP", "colour": "red"},
        },
    )
    assert response.status_code == 422
    err = error_of(response)
    assert err["code"] == "schema_validation_failed"
    by_path = {(e["path"], e["keyword"]) for e in err["details"]}
    assert by_path == {
        ("/", "required"),
        ("/", "additionalProperties"),
        ("/amount", "minimum"),
        ("/currency", "enum"),
    }
    assert all(e["message"] for e in err["details"])
    assert counts(runtime.db) == before


@pytest.mark.parametrize(("type_", "version"), [("order.unknown", 1), ("order.created", 2)])
def test_unknown_type_or_version_is_422(client, auth, acme, type_, version):
    response = client.post(
        "/v1/partners/acme/events",
        headers=auth,
        json={"type": type_, "version": version, "data": {}},
    )
    assert response.status_code == 422
    assert error_of(response)["code"] == "unknown_event_type"


@pytest.mark.parametrize(
    "body",
    [
        {"version": 1, "data": {}},
        {"type": "order.created", "data": {"order_id": "o", "amount": 1}},
        {"type": "order.created", "version": "1", "data": {"order_id": "o", "amount": 1}},
        {"type": "order.created", "version": 1},
        {"type": "order.created", "version": 1, "data": [1]},
        {
            "type": "order.created",
            "version": 1,
            "data": {"order_id": "o", "amount": 1},
            "occurred_at": "yesterday",
        },
        {
            "type": "order.created",
            "version": 1,
            "data": {"order_id": "o", "amount": 1},
            "occurred_at": "2026-12-02T10:00:00",
        },  # no offset: which zone is unknown
        {
            "type": "order.created",
            "version": 1,
            "data": {"order_id": "o", "amount": 1},
            "occurred_at": "2026-12-02",
        },
        {
            "type": "order.created",
            "version": 1,
            "data": {"order_id": "o", "amount": 1},
            "correlation_id": 5,
        },
        {
            "type": "order.created",
            "version": 1,
            "data": {"order_id": "o", "amount": 1},
            "priority": "high",
        },
    ],
)
def test_malformed_envelope_is_422(client, auth, acme, body):
    assert client.post("/v1/partners/acme/events", headers=auth, json=body).status_code == 422


def test_deprecated_version_is_accepted_with_a_warning(client, auth, acme):
    client.post("/v1/event-types/order.created/1/deprecate", headers=auth)
    response = client.post("/v1/partners/acme/events", headers=auth, json=order())
    assert response.status_code == 202
    [warning] = response.get_json()["warnings"]
    assert warning["code"] == "deprecated_event_type" and "deprecated" in warning["message"]


def test_deprecation_is_seen_by_a_process_that_cached_the_contract(client, auth, acme):
    assert (
        client.post("/v1/partners/acme/events", headers=auth, json=order()).get_json()["warnings"]
        == []
    )
    client.post("/v1/event-types/order.created/1/deprecate", headers=auth)
    assert (
        client.post("/v1/partners/acme/events", headers=auth, json=order()).get_json()["warnings"]
        != []
    )


def test_fan_out_follows_subscriptions_state_and_deletion(client, auth, acme, runtime):
    make_event_type(client, auth, "order.paid", schema={"type": "object"})
    everything = make_endpoint(client, auth)
    subscribed = make_endpoint(client, auth, event_types=["order.created", "order.paid"])
    other = make_endpoint(client, auth, event_types=["order.paid"])
    disabled = make_endpoint(client, auth)
    deleted = make_endpoint(client, auth)
    client.post(f"/v1/partners/acme/endpoints/{disabled['id']}/disable", headers=auth)
    client.delete(f"/v1/partners/acme/endpoints/{deleted['id']}", headers=auth)
    make_partner(client, auth, "globex")
    make_endpoint(client, auth, "globex")

    body = client.post("/v1/partners/acme/events", headers=auth, json=order()).get_json()
    states = {d["endpoint"]: d["state"] for d in body["deliveries"]}
    assert states == {
        everything["id"]: "pending",
        subscribed["id"]: "pending",
        disabled["id"]: "dead",
    }
    assert other["id"] not in states and deleted["id"] not in states
    with runtime.db.Session() as session:
        rows = session.scalars(select(Delivery).where(Delivery.event_id == body["id"])).all()
        assert {r.endpoint_id: r.state for r in rows} == states
        event = session.get(Event, body["id"])
        [letter] = session.scalars(select(DeadLetter)).all()
        assert letter.endpoint_id == disabled["id"] and letter.reason == "endpoint_disabled"
        assert letter.state == "open" and letter.search_text == event.payload
        assert letter.event_type == "order.created" and letter.partner_id == event.partner_id
        [audit] = session.scalars(select(DeadLetterAudit)).all()
        assert (audit.dead_letter_id, audit.actor, audit.action) == (letter.id, "system", "park")
    pending = sorted(d["id"] for d in body["deliveries"] if d["state"] == "pending")
    assert sorted(_queued_ids(runtime.redis)) == pending


def test_partner_without_endpoints_still_records_the_event(client, auth, acme, runtime):
    response = client.post("/v1/partners/acme/events", headers=auth, json=order())
    assert response.status_code == 202 and response.get_json()["deliveries"] == []
    assert counts(runtime.db)["events"] == 1


def test_job_is_enqueued_only_after_commit_with_a_deterministic_id(
    client, auth, acme, runtime, redis_client
):
    make_endpoint(client, auth)
    with runtime.db.begin() as session:
        result = publish_in_transaction(
            session,
            runtime.redis,
            runtime.settings,
            partner_uid="acme",
            body=order(),
            api_key_id="key_none",
        )
        assert _queued_ids(redis_client) == []  # not before the commit
    assert _queued_ids(redis_client) == result.enqueued
    [job] = Queue(DELIVERIES, connection=redis_client).jobs
    assert job.id == job_specs(result.enqueued)[0].job_id
    assert job.func_name == DELIVER_BATCH


def test_rolled_back_publish_enqueues_and_stores_nothing(client, auth, acme, runtime, redis_client):
    make_endpoint(client, auth)
    before = counts(runtime.db)

    def publish_then_fail() -> None:
        with runtime.db.begin() as session:
            publish_in_transaction(
                session,
                runtime.redis,
                runtime.settings,
                partner_uid="acme",
                body=order(),
                api_key_id="key_none",
            )
            raise RuntimeError("the caller fails after publishing")

    with pytest.raises(RuntimeError):
        publish_then_fail()
    assert counts(runtime.db) == before
    assert _queued_ids(redis_client) == []


def test_event_and_deliveries_commit_together_or_not_at_all(
    client, auth, acme, runtime, monkeypatch
):
    make_endpoint(client, auth)
    make_endpoint(client, auth)
    before = counts(runtime.db)
    from app.intake import plan as plan_module

    real = plan_module.new_id
    # Two deliveries with one id: the second INSERT fails after the event row was written.
    monkeypatch.setattr(
        plan_module,
        "new_id",
        lambda prefix: "dlv_DUPLICATE" if prefix == "dlv" else real(prefix),
    )
    response = client.post(
        "/v1/partners/acme/events", json=order(), headers={**auth, "Idempotency-Key": "k-1"}
    )
    assert response.status_code == 500
    assert counts(runtime.db) == before  # no event, no delivery, no idempotency record


def test_redis_down_still_answers_202_and_logs_a_warning(settings, migrated, auth, client, caplog):
    make_event_type(client, auth)
    make_partner(client, auth, "acme")
    make_endpoint(client, auth)
    down = Runtime(
        settings.with_overrides(redis_url=f"redis://127.0.0.1:{free_port()}/0"),
        database=migrated.db,
    )
    caplog.set_level(logging.WARNING)
    try:
        response = (
            create_app(runtime=down)
            .test_client()
            .post("/v1/partners/acme/events", headers=auth, json=order())
        )
    finally:
        down.close()
    assert response.status_code == 202
    delivery_id = response.get_json()["deliveries"][0]["id"]
    with migrated.db.Session() as session:
        assert session.get(Delivery, delivery_id).state == "pending"  # the sweeper's to send
    assert any(
        r.levelno == logging.WARNING and "redis" in r.getMessage().lower() for r in caplog.records
    )


def test_publishing_needs_events_write_scope(client, auth, acme, runtime):
    from app.accounts import create_api_key

    with runtime.db.begin() as session:
        _, reader = create_api_key(session, "reader", ["read"])
        _, endpoints_only = create_api_key(session, "ops", ["endpoints:write"])
        _, publisher = create_api_key(session, "svc", ["events:write"])
    for token, status in ((reader, 403), (endpoints_only, 403), (publisher, 202)):
        response = client.post(
            "/v1/partners/acme/events", json=order(), headers={"Authorization": f"Bearer {token}"}
        )
        assert response.status_code == status
