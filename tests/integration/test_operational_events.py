"""Operational events end to end: recorded where they happen, published through the intake,
delivered by the engine to real receivers on 127.0.0.1, signed as any webhook."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from sqlalchemy import func, select
from standardwebhooks.webhooks import Webhook

from app import event_types, migrate, operational
from app.accounts import create_api_key
from app.clock import isoformat, utcnow
from app.db import Database
from app.intake import operational as op_publish
from app.intake.publish import publish
from app.models import (
    DeadLetter,
    Delivery,
    Endpoint,
    Event,
    EventType,
    OperationalEvent,
    Partner,
)
from app.processes.scheduler import publish_operational_events, sync_operator_endpoints
from app.recovery import jobs as recovery_jobs
from app.registry import endpoints as endpoint_rules
from app.registry.partners import create_partner
from app.runtime import Runtime
from app.services import event_types as event_type_service
from app.services import verification
from app.signing import generate_secret
from sender import health
from sender.dispatch import enqueue_now
from tests.support.factories import (
    Received,
    Receiver,
    WorkerThread,
    make_endpoint,
    make_event_with_deliveries,
    make_partner,
    wait_for,
)

OPS = "/ops"


def _verified(received: Received, secret: str) -> dict[str, Any]:
    """The body, verified by the Standard Webhooks library as any receiver would."""
    return Webhook(secret).verify(  # type: ignore[no-any-return]
        received.body,
        {
            name: received.headers[name]
            for name in ("webhook-id", "webhook-timestamp", "webhook-signature")
        },
    )


def _of_type(receiver: Receiver, path: str, type_: str) -> list[Received]:
    return [r for r in receiver.on(path) if r.json["type"] == type_]


def _operator_rt(make_rt: Callable[..., Runtime], receiver: Receiver, **overrides: Any):
    """A runtime whose KURIR_OPERATOR_WEBHOOK_URL is the receiver's /ops, synced as the
    scheduler does at start."""
    secret = generate_secret()
    rt = make_rt(
        operator_webhook_urls=(receiver.url + OPS,),
        operator_webhook_secret=secret,
        **overrides,
    )
    assert sync_operator_endpoints(rt) == 1
    return rt, secret


def _failing_partner_endpoint(rt: Runtime, receiver: Receiver, uid: str = "acme", **fields: Any):
    with rt.db.begin() as session:
        partner = make_partner(session, uid)
        endpoint = make_endpoint(session, partner, receiver.url + "/h", rt.secret_box, **fields)
        _, deliveries = make_event_with_deliveries(session, partner, [endpoint])
    return partner, endpoint, [d.id for d in deliveries]


def _fail_partner(received: Received, count: int) -> tuple[int, dict[str, str], bytes]:
    return (500, {}, b"down") if received.path == "/h" else (200, {}, b"ok")


def test_an_operator_webhook_receives_a_signed_endpoint_disabled_after_failures(make_rt):
    with Receiver(_fail_partner) as receiver:
        rt, secret = _operator_rt(
            make_rt,
            receiver,
            retry_schedule=(1,) * 10,
            retry_jitter=0.0,
            disable_after_failures=3,
            disable_after_seconds=0,
        )
        _, endpoint, ids = _failing_partner_endpoint(rt, receiver)
        enqueue_now(rt.redis, ids)
        with WorkerThread(rt):
            [received] = wait_for(
                lambda: _of_type(receiver, OPS, "endpoint.disabled"),
                message="endpoint.disabled at the operator webhook",
            )
        payload = _verified(received, secret)
    assert payload["partner"] == "kurir-operators"  # the envelope: who it was sent to
    assert payload["version"] == 1 and payload["id"] == received.headers["webhook-id"]
    data = payload["data"]
    assert data["partner"] == "acme" and data["endpoint"] == endpoint.id
    assert data["url"] == receiver.url + "/h"
    assert data["reason"].startswith("failing") and data["disabled_by"] == "health"
    assert data["consecutive_failures"] == 3 and data["last_status_code"] == 500
    # The delivery in flight is parked by the engine after the disable, or by it: 0 or 1.
    assert data["parked_deliveries"] in (0, 1)
    with rt.db.begin() as session:
        [row] = session.scalars(select(OperationalEvent)).all()
        assert row.published_at is not None and payload["correlation_id"] == row.id


def _contract(received: Received, secret: str) -> dict[str, Any]:
    """The event's data, verified as a receiver would and valid under its catalog schema."""
    payload = _verified(received, secret)
    Draft202012Validator(operational.CATALOG[payload["type"]].schema).validate(payload["data"])
    return payload["data"]  # type: ignore[no-any-return]


def test_a_probe_that_recovers_an_endpoint_sends_endpoint_recovered(make_rt):
    with Receiver(lambda received, count: (200, {}, b"ok")) as receiver:
        rt, secret = _operator_rt(make_rt, receiver)
        with rt.db.begin() as session:
            partner = make_partner(session, "acme")
            endpoint = make_endpoint(session, partner, receiver.url + "/h", rt.secret_box)
            event, _ = make_event_with_deliveries(session, partner, [endpoint])
            endpoint_id, event_id = endpoint.id, event.id
        with rt.db.begin() as session:  # as the engine does after failures: parks what waited
            assert health.disable(session, endpoint_id, "failing", utcnow(), probe=True)
            disabled_at = session.get_one(Endpoint, endpoint_id).disabled_at
        with WorkerThread(rt):
            assert recovery_jobs.probe_due(rt, now=utcnow() + timedelta(minutes=5)) == 1
            [received] = wait_for(
                lambda: _of_type(receiver, OPS, "endpoint.recovered"),
                message="endpoint.recovered at the operator webhook",
            )
            wait_for(lambda: receiver.on("/h")[1:], message="the parked delivery replayed")
        data = _contract(received, secret)
    assert data["partner"] == "acme" and data["endpoint"] == endpoint_id
    assert data["url"] == receiver.url + "/h" and data["reason"] == "probe_succeeded"
    assert data["disabled_at"] == isoformat(disabled_at) and data["replayed"] == 1
    assert data["recovered_at"] >= data["disabled_at"]
    probe, *replayed = receiver.on("/h")
    assert probe.json["type"] == "kurir.endpoint.probe"
    assert [r.headers["webhook-id"] for r in replayed] == [event_id]


def test_an_unanswered_challenge_sends_disabled_and_verification_failed(make_rt):
    with Receiver(lambda received, count: (200, {}, b"ok")) as receiver:
        rt, secret = _operator_rt(make_rt, receiver)
        requested = utcnow() - timedelta(hours=73)
        with rt.db.begin() as session:
            partner = make_partner(session, "acme")
            endpoint = make_endpoint(
                session,
                partner,
                receiver.url + "/h",
                rt.secret_box,
                state="pending_verification",
                verify=True,
                verification_started_at=requested,
            )
            endpoint_id = endpoint.id
        assert verification.tick(rt)["expired"] == 1
        with WorkerThread(rt):
            [failed] = wait_for(
                lambda: _of_type(receiver, OPS, "endpoint.verification_failed"),
                message="endpoint.verification_failed at the operator webhook",
            )
            [disabled] = wait_for(
                lambda: _of_type(receiver, OPS, "endpoint.disabled"),
                message="endpoint.disabled at the operator webhook",
            )
        failed_data, disabled_data = _contract(failed, secret), _contract(disabled, secret)
    assert failed_data["endpoint"] == endpoint_id and failed_data["reason"] == "unverified"
    assert failed_data["requested_at"] == isoformat(requested)
    assert disabled_data["disabled_by"] == "verification"
    assert disabled_data["reason"] == "unverified" and disabled_data["parked_deliveries"] == 0
    assert not receiver.on("/h")  # nothing reached the unverified endpoint


def test_a_dead_delivery_sends_delivery_exhausted(make_rt):
    with Receiver(_fail_partner) as receiver:
        rt, secret = _operator_rt(
            make_rt, receiver, retry_schedule=(1,), retry_jitter=0.0, disable_after_failures=100
        )
        _, endpoint, [delivery_id] = _failing_partner_endpoint(rt, receiver)
        enqueue_now(rt.redis, [delivery_id])
        with WorkerThread(rt):
            [received] = wait_for(
                lambda: _of_type(receiver, OPS, "delivery.exhausted"),
                message="delivery.exhausted at the operator webhook",
            )
        data = _verified(received, secret)["data"]
    with rt.db.begin() as session:
        letter = session.scalars(select(DeadLetter)).one()
        delivery = session.get_one(Delivery, delivery_id)
        event = delivery.event
    assert data == {
        "partner": "acme",
        "endpoint": endpoint.id,
        "url": receiver.url + "/h",
        "event": delivery.event_id,
        "event_type": event.type,
        "version": event.version,
        "delivery": delivery_id,
        "dead_letter": letter.id,
        "reason": "retries_exhausted",
        "attempts": 2,
        "last_status_code": 500,
        "last_error": delivery.last_error,
    }


def test_a_dead_head_of_a_blocking_endpoint_sends_ordering_key_blocked(make_rt):
    with Receiver(_fail_partner) as receiver:
        rt, secret = _operator_rt(
            make_rt, receiver, retry_schedule=(1,), retry_jitter=0.0, disable_after_failures=100
        )
        with rt.db.begin() as session:
            event_types.register(
                session, {"name": "stock.changed", "version": 1, "schema": {"type": "object"}}
            )
            key, _ = create_api_key(session, "publisher", ["admin"])
            partner = create_partner(session, {"uid": "shop"})
            endpoint = endpoint_rules.create_endpoint(
                session,
                partner,
                {"url": receiver.url + "/h", "ordering": "key", "on_dead": "block"},
                rt.settings,
                rt.secret_box,
            ).endpoint
        published = publish(
            rt.db,
            rt.redis,
            rt.settings,
            partner_uid="shop",
            body={
                "type": "stock.changed",
                "version": 1,
                "data": {},
                "resource": {"type": "stock", "id": "sku-1"},
            },
            api_key_id=key.id,
        )
        with WorkerThread(rt):
            [received] = wait_for(
                lambda: _of_type(receiver, OPS, "ordering.key_blocked"),
                message="ordering.key_blocked at the operator webhook",
            )
        data = _verified(received, secret)["data"]
    with rt.db.begin() as session:
        letter = session.scalars(select(DeadLetter)).one()
    assert data["partner"] == "shop" and data["endpoint"] == endpoint.id
    assert data["ordering_key"] == "stock:sku-1" and data["sequence"] == 1
    assert data["event"] == published.body["id"] and data["dead_letter"] == letter.id
    assert data["reason"] == "retries_exhausted"


def test_a_passed_sunset_is_sent_per_pinned_endpoint_on_an_injected_clock(make_rt):
    with Receiver() as receiver:
        rt, secret = _operator_rt(make_rt, receiver)
        sunset = utcnow() + timedelta(days=30)
        with rt.db.begin() as session:
            for version in (1, 2):
                event_types.register(
                    session, {"name": "order.paid", "version": version, "schema": {}}
                )
            partner = make_partner(session, "acme")
            pinned = make_endpoint(
                session, partner, "http://127.0.0.1:9/p", rt.secret_box, versions={"order.paid": 1}
            )
            make_endpoint(session, partner, "http://127.0.0.1:9/u", rt.secret_box)
            event_types.deprecate(session, "order.paid", 1, sunset)
        with rt.db.begin() as session:
            assert event_type_service.report_sunsets(session, now=sunset - timedelta(1)) == 0
        with rt.db.begin() as session:
            assert event_type_service.report_sunsets(session, now=sunset + timedelta(1)) == 1
        with WorkerThread(rt):
            [received] = wait_for(
                lambda: _of_type(receiver, OPS, "event_type.sunset_passed"),
                message="event_type.sunset_passed at the operator webhook",
            )
        data = _verified(received, secret)["data"]
    assert data["partner"] == "acme" and data["endpoint"] == pinned.id
    assert (data["type"], data["version"]) == ("order.paid", 1)
    assert data["sunset_at"].startswith(sunset.strftime("%Y-%m-%dT%H:%M:%S"))


def _partner_with_endpoints(rt: Runtime, receiver: Receiver, uid: str, opted_in: bool):
    """A partner with a failing endpoint, one subscribed to endpoint.disabled by name, and
    one subscribed to everything (each on its own path)."""
    with rt.db.begin() as session:
        partner = make_partner(session, uid)
        partner.operational_events = opted_in
        failing = make_endpoint(session, partner, f"{receiver.url}/{uid}/fail", rt.secret_box)
        named = make_endpoint(
            session,
            partner,
            f"{receiver.url}/{uid}/named",
            rt.secret_box,
            event_types=["endpoint.disabled"],
        )
        make_endpoint(session, partner, f"{receiver.url}/{uid}/all", rt.secret_box)
    return failing.id, named


def test_an_opted_in_partner_gets_events_about_its_own_endpoints_on_subscribed_ones(make_rt):
    with Receiver() as receiver:
        rt = make_rt()
        failing, named = _partner_with_endpoints(rt, receiver, "acme", opted_in=True)
        _, other_named = _partner_with_endpoints(rt, receiver, "beta", opted_in=True)
        with rt.db.begin() as session:
            assert health.disable(session, failing, "failing: test", utcnow())
        with WorkerThread(rt):
            [received] = wait_for(
                lambda: receiver.on("/acme/named"), message="endpoint.disabled at acme's endpoint"
            )
            payload = _verified(received, named.test_secret)
            # Nothing else is on its way: the only operational delivery is that one.
            with rt.db.begin() as session:
                sent = session.scalars(
                    select(Delivery.endpoint_id)
                    .join(Event, Event.id == Delivery.event_id)
                    .where(Event.type == "endpoint.disabled")
                ).all()
    assert sent == [named.id]
    assert payload["type"] == "endpoint.disabled" and payload["partner"] == "acme"
    assert payload["data"]["endpoint"] == failing and payload["data"]["partner"] == "acme"
    assert not receiver.on("/acme/all")  # subscribed to everything: not to Kurir's own
    assert not receiver.on("/beta/named")  # another partner hears nothing of acme's endpoints
    assert other_named.id not in sent


def test_without_the_opt_in_a_partner_gets_nothing(make_rt):
    with Receiver() as receiver:
        rt = make_rt()
        failing, _ = _partner_with_endpoints(rt, receiver, "acme", opted_in=False)
        with rt.db.begin() as session:
            assert health.disable(session, failing, "failing: test", utcnow())
        # Recorded for the UI; with no one to send it to, no job is queued for it.
        assert rt.redis.llen("rq:queue:kurir-default") == 0
        assert op_publish.publish_all(rt) == 0
        with rt.db.begin() as session:
            assert session.scalar(select(func.count()).select_from(Event)) == 0
            row = session.scalars(select(OperationalEvent)).one()
            assert row.kind == "endpoint.disabled" and row.published_at is not None
        # Opted in later: what happened before is not sent after the fact.
        with rt.db.begin() as session:
            session.get_one(Partner, row.partner_id).operational_events = True
        assert publish_operational_events(rt) == 0
        assert receiver.requests == []


def test_an_operator_endpoint_failing_its_operational_deliveries_makes_no_more_events(make_rt):
    """Loop guard: the operator webhook is down, so the operational delivery fails until the
    operator endpoint is disabled; neither its disabling nor the dead delivery is sent."""
    with Receiver(lambda r, c: (503, {}, b"down")) as receiver:
        rt, _ = _operator_rt(
            make_rt,
            receiver,
            retry_schedule=(1,) * 5,
            retry_jitter=0.0,
            disable_after_failures=2,
            disable_after_seconds=0,
        )
        with rt.db.begin() as session:
            partner = make_partner(session, "acme")
            endpoint = make_endpoint(session, partner, "http://127.0.0.1:9/x", rt.secret_box)
            assert health.disable(session, endpoint.id, "failing: test", utcnow())
        with WorkerThread(rt):
            wait_for(lambda: _operator_state(rt) == "disabled", message="operator disabled")
            wait_for(lambda: _all_dead(rt), message="the operational delivery parked")
        assert publish_operational_events(rt) == 0
    with rt.db.begin() as session:
        rows = session.scalars(select(OperationalEvent).order_by(OperationalEvent.id)).all()
        events = session.scalars(select(Event.type)).all()
    # Recorded for the UI, but only the first was published: one event, two attempts.
    assert [(r.kind, r.data["partner"]) for r in rows] == [
        ("endpoint.disabled", "acme"),
        ("endpoint.disabled", "kurir-operators"),
    ]
    assert events == ["endpoint.disabled"]
    assert len(receiver.on(OPS)) == 2


def test_an_operational_delivery_that_runs_out_of_retries_makes_no_delivery_exhausted(make_rt):
    with Receiver(lambda r, c: (500, {}, b"down")) as receiver:
        rt, _ = _operator_rt(
            make_rt, receiver, retry_schedule=(1,), retry_jitter=0.0, disable_after_failures=100
        )
        with rt.db.begin() as session:
            partner = make_partner(session, "acme")
            endpoint = make_endpoint(session, partner, "http://127.0.0.1:9/x", rt.secret_box)
            assert health.disable(session, endpoint.id, "failing: test", utcnow())
        with WorkerThread(rt):
            wait_for(lambda: _all_dead(rt), message="the operational delivery parked")
        assert publish_operational_events(rt) == 0
    with rt.db.begin() as session:
        letter = session.scalars(select(DeadLetter)).one()
        kinds = session.scalars(select(OperationalEvent.kind)).all()
    assert letter.reason == "retries_exhausted" and letter.event_type == "endpoint.disabled"
    assert kinds == ["endpoint.disabled"]  # no delivery.exhausted about it
    assert len(receiver.on(OPS)) == 2


def _operator_state(rt: Runtime) -> str | None:
    with rt.db.begin() as session:
        partner = operational.operator_partner(session)
        return session.scalar(select(Endpoint.state).where(Endpoint.partner_id == partner.id))


def _all_dead(rt: Runtime) -> bool:
    with rt.db.begin() as session:
        states = session.scalars(select(Delivery.state)).all()
    return bool(states) and set(states) == {"dead"}


# ------------------------------------------------------------------ destinations, catalog


def test_the_operator_endpoints_follow_the_setting(make_rt):
    secret = generate_secret()
    rt = make_rt(
        operator_webhook_urls=("http://127.0.0.1:9/a", "http://127.0.0.1:9/b"),
        operator_webhook_secret=secret,
    )
    assert sync_operator_endpoints(rt) == 2
    assert sync_operator_endpoints(rt) == 0  # in step already
    with rt.db.begin() as session:
        partner = operational.operator_partner(session)
        hand_made = make_endpoint(session, partner, "http://127.0.0.1:9/hand", rt.secret_box)
    fewer = make_rt(operator_webhook_urls=("http://127.0.0.1:9/b",))
    assert sync_operator_endpoints(fewer) == 1
    with rt.db.begin() as session:
        live = session.scalars(
            select(Endpoint).where(Endpoint.deleted_at.is_(None)).order_by(Endpoint.url)
        ).all()
        assert [e.url for e in live] == ["http://127.0.0.1:9/b", hand_made.url]
        _, shown = endpoint_rules.read_secret(live[0], rt.secret_box)
    assert shown == secret


def test_the_reserved_partner_and_operational_types_are_refused_to_publishers(client, auth):
    made = client.post("/v1/partners", headers=auth, json={"uid": "kurir-operators"})
    assert made.status_code == 422
    assert made.get_json()["error"]["code"] == "reserved_partner"
    registered = client.post(
        "/v1/event-types",
        headers=auth,
        json={"name": "endpoint.disabled", "version": 2, "schema": {}},
    )
    assert registered.status_code == 422
    assert registered.get_json()["error"]["code"] == "reserved_event_type"
    assert client.post("/v1/partners", headers=auth, json={"uid": "acme"}).status_code == 201
    published = client.post(
        "/v1/partners/acme/events",
        headers=auth,
        json={"type": "delivery.exhausted", "version": 1, "data": {}},
    )
    assert published.status_code == 422
    assert published.get_json()["error"]["code"] == "reserved_event_type"


def test_the_types_are_in_the_catalog_with_schemas_and_examples(client, auth, runtime):
    assert sync_operator_endpoints(runtime) == 0  # registers the types; no URL configured
    listed = client.get("/v1/event-types?limit=100", headers=auth).get_json()["data"]
    by_name = {row["name"]: row for row in listed}
    assert set(by_name) == set(operational.NAMES)
    for name, spec in operational.CATALOG.items():
        row = client.get(f"/v1/event-types/{name}/1", headers=auth).get_json()
        assert row["schema"] == spec.schema and row["description"] == spec.description
        assert spec.examples and row["examples"] == spec.examples
    # A partner's endpoint may subscribe to them (they are not Kurir's private `kurir.*`).
    assert client.post("/v1/partners", headers=auth, json={"uid": "acme"}).status_code == 201
    subscribed = client.post(
        "/v1/partners/acme/endpoints",
        headers=auth,
        json={"url": "https://hooks.example.com/k", "event_types": ["endpoint.disabled"]},
    )
    assert subscribed.status_code == 201, subscribed.get_json()


@pytest.mark.parametrize("value", [True, False])
def test_a_partner_opts_in_over_the_api_and_its_own_key_may_change_only_that(
    client, auth, runtime, value
):
    assert client.post("/v1/partners", headers=auth, json={"uid": "acme"}).status_code == 201
    assert client.get("/v1/partners/acme", headers=auth).get_json()["operational_events"] is False
    changed = client.patch(
        "/v1/partners/acme", headers=auth, json={"operational_events": value, "name": "Acme"}
    )
    assert changed.status_code == 200
    assert changed.get_json()["operational_events"] is value
    assert changed.get_json()["name"] == "Acme"
    key = client.post(
        "/v1/partners/acme/keys", headers=auth, json={"name": "own", "scopes": ["endpoints:write"]}
    ).get_json()["key"]
    own = {"Authorization": f"Bearer {key}"}
    toggled = client.patch("/v1/partners/acme", headers=own, json={"operational_events": True})
    assert toggled.status_code == 200 and toggled.get_json()["operational_events"] is True
    renamed = client.patch("/v1/partners/acme", headers=own, json={"name": "Mine"})
    assert renamed.status_code == 403
    bad = client.patch("/v1/partners/acme", headers=auth, json={"operational_events": "yes"})
    assert bad.status_code == 422 and bad.get_json()["error"]["code"] == "invalid_field"


def test_migrating_a_fresh_database_registers_the_types(tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    migrate.upgrade(url)
    db = Database(url, pool_size=1)
    try:
        with db.begin() as session:
            rows = session.scalars(select(EventType).where(EventType.name.in_(operational.NAMES)))
            found = {row.name: (row.version, row.schema, row.examples) for row in rows}
    finally:
        db.dispose()
    assert found == {
        name: (1, spec.schema, spec.examples) for name, spec in operational.CATALOG.items()
    }


def test_a_disable_by_hand_is_sent_to_the_operator_endpoints_too(client, auth, runtime):
    with runtime.db.begin() as session:
        operator = operational.ensure_operator_partner(session)
        make_endpoint(session, operator, "http://127.0.0.1:9/ops", runtime.secret_box)
    assert client.post("/v1/partners", headers=auth, json={"uid": "acme"}).status_code == 201
    endpoint = client.post(
        "/v1/partners/acme/endpoints", headers=auth, json={"url": "http://127.0.0.1:9/h"}
    ).get_json()
    disabled = client.post(
        f"/v1/partners/acme/endpoints/{endpoint['id']}/disable",
        headers=auth,
        json={"reason": "maintenance"},
    )
    assert disabled.status_code == 200
    assert publish_operational_events(runtime) == 1
    with runtime.db.begin() as session:
        event = session.scalars(select(Event)).one()
        assert session.get_one(Partner, event.partner_id).uid == "kurir-operators"
        assert [d.state for d in event.deliveries] == ["pending"]
    assert event.type == "endpoint.disabled"
    assert event.data["endpoint"] == endpoint["id"] and event.data["partner"] == "acme"
    assert (event.data["reason"], event.data["disabled_by"]) == ("maintenance", "operator")


def test_an_opted_in_partner_reads_them_in_its_feed_only_on_a_pull_endpoint_that_names_them(
    client, auth, runtime
):
    with runtime.db.begin() as session:
        partner = make_partner(session, "acme")
        partner.operational_events = True
        failing = make_endpoint(session, partner, "http://127.0.0.1:9/h", runtime.secret_box)
        named = make_endpoint(
            session, partner, "", runtime.secret_box, mode="pull", event_types=["endpoint.disabled"]
        )
        everything = make_endpoint(session, partner, "", runtime.secret_box, mode="pull")
        assert health.disable(session, failing.id, "failing: test", utcnow())
    assert publish_operational_events(runtime) == 1

    def feed_types(endpoint_id: str) -> list[str]:
        page = client.get(f"/v1/partners/acme/feed?endpoint={endpoint_id}", headers=auth)
        assert page.status_code == 200, page.get_json()
        return [item["type"] for item in page.get_json()["data"]]

    assert feed_types(named.id) == ["endpoint.disabled"]
    assert feed_types(everything.id) == []
    lags = {
        e.id: client.get(f"/v1/partners/acme/endpoints/{e.id}", headers=auth).get_json()["lag"]
        for e in (named, everything)
    }
    assert (lags[named.id]["events"], lags[everything.id]["events"]) == (1, 0)


def test_a_partner_endpoint_that_only_receives_operational_events_is_guarded_too(runtime):
    with runtime.db.begin() as session:
        operator = operational.ensure_operator_partner(session)
        make_endpoint(session, operator, "http://127.0.0.1:9/ops", runtime.secret_box)
        partner = make_partner(session, "acme")
        partner.operational_events = True
        watcher = make_endpoint(
            session,
            partner,
            "http://127.0.0.1:9/w",
            runtime.secret_box,
            event_types=["endpoint.disabled", "delivery.exhausted"],
        )
        assert health.disable(session, watcher.id, "failing: test", utcnow())
    assert publish_operational_events(runtime) == 0
    with runtime.db.begin() as session:
        row = session.scalars(select(OperationalEvent)).one()
        assert row.published_at is not None  # shown in the UI, never published
        assert session.scalar(select(func.count()).select_from(Event)) == 0
