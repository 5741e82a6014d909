"""Versioned contracts per endpoint: pins, downgrades, renditions, deprecation and sunset."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from sqlalchemy import func, select
from standardwebhooks.webhooks import Webhook

from app.accounts import create_operator
from app.clock import isoformat, utcnow
from app.models import Delivery, Event, EventVersion, OperationalEvent
from app.services import event_types
from tests.support.factories import Receiver, WorkerThread, wait_for
from tests.support.publish import make_endpoint, make_partner

V1 = {
    "type": "object",
    "required": ["amount"],
    "properties": {"amount": {"type": "integer"}},
    "additionalProperties": False,
}
V2 = {
    "type": "object",
    "required": ["amount", "currency"],
    "properties": {"amount": {"type": "integer"}, "currency": {"type": "string"}},
    "additionalProperties": False,
}
V3 = {
    "type": "object",
    "required": ["amount_minor", "currency"],
    "properties": {
        "amount_minor": {"type": "integer"},
        "currency": {"type": "string"},
        "fx": {"type": "number"},
    },
}
SCHEMAS = {1: V1, 2: V2, 3: V3}
DATA_V3 = {"amount_minor": 1250, "currency": "EUR", "fx": 1.08}


def register(client: Any, auth: dict[str, str], version: int, **extra: Any) -> Any:
    return client.post(
        "/v1/event-types",
        headers=auth,
        json={"name": "payment.succeeded", "version": version, "schema": SCHEMAS[version], **extra},
    )


@pytest.fixture
def contracts(client, auth):
    assert register(client, auth, 1).status_code == 201
    assert (
        register(
            client,
            auth,
            2,
            downgrade="{amount: amount}",
            examples=[{"amount": 5, "currency": "EUR"}],
        ).status_code
        == 201
    )
    assert (
        register(
            client,
            auth,
            3,
            downgrade="{amount: amount_minor, currency: currency}",
            examples=[DATA_V3],
        ).status_code
        == 201
    )
    make_partner(client, auth, "acme")


def publish(client: Any, auth: dict[str, str], **extra: Any) -> Any:
    return client.post(
        "/v1/partners/acme/events",
        headers=auth,
        json={"type": "payment.succeeded", "version": 3, "data": DATA_V3, **extra},
    )


def _stored(runtime) -> dict[str, int]:
    with runtime.db.begin() as session:
        return {
            name: int(session.scalar(select(func.count()).select_from(model)))
            for name, model in (
                ("events", Event),
                ("deliveries", Delivery),
                ("versions", EventVersion),
            )
        }


# ---------------------------------------------------------------------------- registration


def test_a_downgrade_is_checked_against_the_examples_at_registration(client, auth):
    assert register(client, auth, 1).status_code == 201
    wrong = register(
        client, auth, 2, downgrade="{amount: currency}", examples=[{"amount": 5, "currency": "EUR"}]
    )
    assert wrong.status_code == 422
    error = wrong.get_json()["error"]
    assert error["code"] == "invalid_downgrade"
    assert error["details"]["example"] == 0 and error["details"]["version"] == 1
    assert error["details"]["errors"][0]["path"] == "/amount"
    bad_example = register(client, auth, 2, examples=[{"amount": "five"}])
    assert bad_example.get_json()["error"]["code"] == "invalid_example"
    syntax = register(client, auth, 2, downgrade="{amount: ")
    assert syntax.get_json()["error"]["code"] == "invalid_downgrade"
    orphan = client.post(
        "/v1/event-types",
        headers=auth,
        json={"name": "other", "version": 2, "schema": V2, "downgrade": "{amount: amount}"},
    )
    assert orphan.get_json()["error"]["details"]["missing_version"] == 1
    ok = register(
        client, auth, 2, downgrade="{amount: amount}", examples=[{"amount": 5, "currency": "EUR"}]
    )
    assert ok.status_code == 201 and ok.get_json()["downgrade"] == "{amount: amount}"
    # The transform is as immutable as the schema.
    assert (
        register(
            client, auth, 2, downgrade="{amount: `1`}", examples=[{"amount": 5, "currency": "EUR"}]
        ).status_code
        == 409
    )


def test_a_pin_must_name_a_registered_version(client, auth, contracts):
    response = client.post(
        "/v1/partners/acme/endpoints",
        headers=auth,
        json={"url": "http://127.0.0.1:9/", "versions": {"payment.succeeded": 7}},
    )
    assert response.status_code == 422
    assert response.get_json()["error"]["details"]["unknown"] == [
        {"type": "payment.succeeded", "version": 7}
    ]
    ep = make_endpoint(client, auth, versions={"payment.succeeded": 1})
    assert ep["versions"] == {"payment.succeeded": 1}
    changed = client.patch(
        f"/v1/partners/acme/endpoints/{ep['id']}", headers=auth, json={"versions": None}
    )
    assert changed.get_json()["versions"] == {}


# ---------------------------------------------------------------------------- delivery


def test_each_endpoint_receives_the_version_it_pinned(client, auth, runtime, contracts):
    with Receiver() as receiver, WorkerThread(runtime):
        secrets = {}
        for path, pins in (
            ("/v1", {"payment.succeeded": 1}),
            ("/v2", {"payment.succeeded": 2}),
            ("/latest", None),
        ):
            ep = make_endpoint(client, auth, url=f"{receiver.url}{path}", versions=pins)
            secrets[path] = ep["secret"]
        response = publish(client, auth)
        assert response.status_code == 202, response.get_json()
        versions = {d["endpoint"]: d["version"] for d in response.get_json()["deliveries"]}
        assert sorted(versions.values()) == [1, 2, 3]
        wait_for(lambda: all(receiver.on(p) for p in secrets), message="three webhooks")
    expected = {
        "/v1": ({"amount": 1250}, 1),
        "/v2": ({"amount": 1250, "currency": "EUR"}, 2),
        "/latest": (DATA_V3, 3),
    }
    for path, (data, version) in expected.items():
        (got,) = receiver.on(path)
        Webhook(secrets[path]).verify(got.body, got.headers)  # signed over its own body
        body = got.json
        assert (body["version"], body["data"]) == (version, data)
        assert body["id"] == response.get_json()["id"]
        Draft202012Validator(SCHEMAS[version]).validate(body["data"])
    assert _stored(runtime)["versions"] == 2  # once per version, not per endpoint


def test_a_rendition_wins_over_the_transform(client, auth, runtime, contracts):
    with Receiver() as receiver, WorkerThread(runtime):
        make_endpoint(client, auth, url=f"{receiver.url}/v2", versions={"payment.succeeded": 2})
        make_endpoint(client, auth, url=f"{receiver.url}/v1", versions={"payment.succeeded": 1})
        by_hand = {"amount": 1300, "currency": "EUR"}
        assert publish(client, auth, renditions={"2": by_hand}).status_code == 202
        wait_for(lambda: receiver.on("/v2") and receiver.on("/v1"), message="two webhooks")
    assert receiver.on("/v2")[0].json["data"] == by_hand
    assert receiver.on("/v1")[0].json["data"] == {"amount": 1300}  # made from the rendition


def test_a_pin_no_chain_of_downgrades_can_serve_is_refused_when_it_is_set(client, auth, runtime):
    """A partner's pin must not make the publisher's publishes of the newest version fail:
    v2 declares no downgrade, so nothing makes v1 from v3."""
    register(client, auth, 1)
    register(client, auth, 2)  # no downgrade to 1
    register(client, auth, 3, downgrade="{amount: amount_minor, currency: currency}")
    make_partner(client, auth, "acme")
    refused = client.post(
        "/v1/partners/acme/endpoints",
        headers=auth,
        json={"url": "http://127.0.0.1:9/", "versions": {"payment.succeeded": 1}},
    )
    assert refused.status_code == 422
    error = refused.get_json()["error"]
    assert (error["code"], error["details"]["type"]) == ("version_unavailable", "payment.succeeded")
    assert error["details"]["unavailable"] == [
        {"type": "payment.succeeded", "version": 1, "newest": 3}
    ]
    ep = make_endpoint(client, auth, versions={"payment.succeeded": 2})  # one downgrade away
    changed = client.patch(
        f"/v1/partners/acme/endpoints/{ep['id']}",
        headers=auth,
        json={"versions": {"payment.succeeded": 1}},
    )
    assert changed.get_json()["error"]["code"] == "version_unavailable"
    assert client.get(f"/v1/partners/acme/endpoints/{ep['id']}", headers=auth).get_json()[
        "versions"
    ] == {"payment.succeeded": 2}
    assert publish(client, auth).status_code == 202


def test_a_version_that_cannot_be_made_refuses_the_publish_and_stores_nothing(
    client, auth, runtime
):
    """What a pin cannot foresee: a newer version registered later without a downgrade."""
    register(client, auth, 1)
    register(client, auth, 2, downgrade="{amount: amount}")
    make_partner(client, auth, "acme")
    ep = make_endpoint(client, auth, versions={"payment.succeeded": 1})
    register(client, auth, 3)  # no downgrade to 2: v1 is cut off from v3
    response = publish(client, auth)
    assert response.status_code == 422
    error = response.get_json()["error"]
    assert error["code"] == "version_unavailable"
    assert error["details"]["endpoints"] == [{"endpoint": ep["id"], "version": 1}]
    assert _stored(runtime) == {"events": 0, "deliveries": 0, "versions": 0}
    # A rendition fills the gap; a pin newer than the version published never does by itself.
    assert publish(client, auth, renditions={"1": {"amount": 1}}).status_code == 202
    make_endpoint(client, auth, versions={"payment.succeeded": 3})
    newer = client.post(
        "/v1/partners/acme/events",
        headers=auth,
        json={
            "type": "payment.succeeded",
            "version": 2,
            "data": {"amount": 1, "currency": "EUR"},
            "renditions": {"1": {"amount": 1}},
        },
    )
    assert newer.get_json()["error"]["code"] == "version_unavailable"


def test_a_transform_making_invalid_data_for_this_event_is_422_naming_the_version(
    client, auth, runtime, contracts
):
    make_endpoint(client, auth, versions={"payment.succeeded": 2})
    # Data that breaks the published version is refused before any version is made...
    response = publish(client, auth, data={"amount_minor": 5, "currency": 42})
    assert response.get_json()["error"]["code"] == "schema_validation_failed"
    # ...and data the published version accepts but an older one does not names that one.
    loose = {**V3, "properties": {**V3["properties"], "currency": {}}}
    client.post("/v1/event-types", headers=auth, json={"name": "loose", "version": 1, "schema": V2})
    client.post(
        "/v1/event-types",
        headers=auth,
        json={
            "name": "loose",
            "version": 2,
            "schema": loose,
            "downgrade": "{amount: amount_minor, currency: currency}",
        },
    )
    make_endpoint(client, auth, versions={"loose": 1})
    bad = client.post(
        "/v1/partners/acme/events",
        headers=auth,
        json={"type": "loose", "version": 2, "data": {"amount_minor": 5, "currency": 42}},
    )
    assert bad.status_code == 422
    error = bad.get_json()["error"]
    assert error["code"] == "version_invalid" and error["details"]["version"] == 1
    assert error["details"]["source"] == "downgrade"


def test_a_resend_keeps_the_version_the_delivery_was_made_for(client, auth, runtime, contracts):
    with Receiver(reply=lambda r, n: (500 if n == 1 else 200, {}, b"")) as receiver:
        ep = make_endpoint(
            client, auth, url=f"{receiver.url}/v1", versions={"payment.succeeded": 1}
        )
        client.post(f"/v1/partners/acme/endpoints/{ep['id']}/disable", headers=auth)
        published = publish(client, auth).get_json()
        (delivery,) = published["deliveries"]
        assert (delivery["state"], delivery["version"]) == ("dead", 1)
        # The pin moves on; the parked delivery still carries what it was made for.
        client.patch(
            f"/v1/partners/acme/endpoints/{ep['id']}",
            headers=auth,
            json={"versions": {"payment.succeeded": 2}},
        )
        client.post(f"/v1/partners/acme/endpoints/{ep['id']}/enable", headers=auth)
        letter = client.get(f"/v1/dead-letters?endpoint={ep['id']}", headers=auth).get_json()[
            "data"
        ][0]
        with WorkerThread(runtime):
            resent = client.post(f"/v1/dead-letters/{letter['id']}/resend", headers=auth)
            assert resent.status_code == 200
            wait_for(lambda: receiver.on("/v1"), message="the resent webhook")
    assert receiver.on("/v1")[0].json["version"] == 1
    assert receiver.on("/v1")[0].json["data"] == {"amount": 1250}
    shown = client.get(f"/v1/deliveries/{delivery['id']}", headers=auth).get_json()
    assert shown["version"] == 1


# ---------------------------------------------------------------------------- deprecation


def test_deprecation_with_a_sunset_warns_names_the_endpoints_and_reports_adoption(
    client, auth, runtime, contracts
):
    pinned = make_endpoint(client, auth, versions={"payment.succeeded": 1})
    make_endpoint(client, auth)
    sunset = isoformat(utcnow() + timedelta(days=30))
    response = client.post(
        "/v1/event-types/payment.succeeded/1/deprecate", headers=auth, json={"sunset_at": sunset}
    )
    assert response.status_code == 200 and response.get_json()["sunset_at"] == sunset
    answer = publish(client, auth)
    assert answer.status_code == 202
    (warning,) = answer.get_json()["warnings"]
    assert (warning["code"], warning["version"], warning["sunset_at"]) == (
        "deprecated_event_type",
        1,
        sunset,
    )
    assert warning["endpoints"] == [pinned["id"]] and pinned["id"] in warning["message"]
    report = client.get("/v1/event-types/payment.succeeded/versions", headers=auth).get_json()
    by_version = {row["version"]: row for row in report["data"]}
    assert by_version[1]["endpoints_pinned"] == [pinned["id"]]
    assert by_version[1]["deliveries_7d"] == 1 and by_version[3]["deliveries_7d"] == 1
    assert by_version[1]["sunset_at"] == sunset and by_version[2]["endpoints_pinned"] == []


def test_a_passed_sunset_is_recorded_once_per_endpoint_still_pinned(
    client, auth, runtime, contracts
):
    pinned = make_endpoint(client, auth, versions={"payment.succeeded": 1})
    client.post(
        "/v1/event-types/payment.succeeded/1/deprecate",
        headers=auth,
        json={"sunset_at": isoformat(utcnow() + timedelta(days=1))},
    )
    later = utcnow() + timedelta(days=2)
    with runtime.db.begin() as session:
        assert event_types.report_sunsets(session, now=utcnow()) == 0  # not yet
        assert event_types.report_sunsets(session, now=later) == 1
        assert event_types.report_sunsets(session, now=later) == 0  # once
        recorded = session.scalars(
            select(OperationalEvent).where(OperationalEvent.kind == "event_type.sunset_passed")
        ).all()
    assert [(r.subject_id, r.data["version"]) for r in recorded] == [(pinned["id"], 1)]
    # It keeps receiving the version: a sunset never breaks a partner silently.
    assert publish(client, auth).get_json()["deliveries"][0]["version"] == 1


def test_payload_versions_are_stored_once_with_their_source(client, auth, runtime, contracts):
    for _ in range(3):
        make_endpoint(client, auth, versions={"payment.succeeded": 1})
    event_id = publish(client, auth, renditions={"2": {"amount": 9, "currency": "EUR"}}).get_json()[
        "id"
    ]
    with runtime.db.begin() as session:
        rows = session.execute(
            select(EventVersion.version, EventVersion.source, EventVersion.payload)
            .where(EventVersion.event_id == event_id)
            .order_by(EventVersion.version)
        ).all()
    assert [(v, s) for v, s, _ in rows] == [(1, "downgrade"), (2, "rendition")]
    assert json.loads(rows[0][2])["data"] == {"amount": 9}


def test_operators_see_versions_pins_downgrades_and_sunsets(client, auth, runtime, contracts):
    pinned = make_endpoint(client, auth, versions={"payment.succeeded": 2})
    client.post(
        "/v1/event-types/payment.succeeded/1/deprecate",
        headers=auth,
        json={"sunset_at": "2027-06-01T00:00:00Z"},
    )
    with runtime.db.begin() as session:
        create_operator(session, "ops@example.com", "correct horse battery")
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/ui/login").text)
    client.post(
        "/ui/login",
        data={
            "email": "ops@example.com",
            "password": "correct horse battery",
            "csrf_token": token.group(1),
        },
    )
    page = client.get("/ui/contracts").text
    assert 'data-testid="contract-payment.succeeded"' in page
    assert "{amount: amount_minor, currency: currency}" in page
    assert pinned["id"] in page and "deprecated" in page and "sunset" in page
    endpoint_page = client.get(f"/ui/endpoints/{pinned['id']}").text
    assert "payment.succeeded v2" in endpoint_page


def test_a_partner_key_sees_only_its_own_adoption(client, auth, contracts):
    make_partner(client, auth, "globex")
    mine = make_endpoint(client, auth, versions={"payment.succeeded": 1})
    theirs = client.post(
        "/v1/partners/globex/endpoints",
        headers=auth,
        json={"url": "http://127.0.0.1:9/g", "versions": {"payment.succeeded": 1}},
    ).get_json()
    key = client.post(
        "/v1/partners/acme/keys", headers=auth, json={"name": "acme-robot"}
    ).get_json()["key"]
    report = client.get(
        "/v1/event-types/payment.succeeded/versions", headers={"Authorization": f"Bearer {key}"}
    )
    assert report.status_code == 200
    pinned = {row["version"]: row["endpoints_pinned"] for row in report.get_json()["data"]}
    assert pinned[1] == [mine["id"]] and theirs["id"] not in report.text
