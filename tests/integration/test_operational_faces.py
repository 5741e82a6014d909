"""Operational events in the faces: operator endpoints made in /ui, and a partner's opt-in
toggled in the UI and in the portal (the same service, the same audit row)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app import operational
from app.accounts import create_operator
from app.models import AuditRecord, Endpoint, Partner
from app.processes.scheduler import sync_operator_endpoints
from tests.integration.test_portal import csrf, sign_in
from tests.integration.test_ui import EMAIL, PASSWORD, token


@pytest.fixture
def ui(client, runtime):
    with runtime.db.begin() as session:
        create_operator(session, EMAIL, PASSWORD)
    response = client.post(
        "/ui/login", data={"email": EMAIL, "password": PASSWORD, "csrf_token": token(client)}
    )
    assert response.status_code == 302
    return client


def _partner(runtime, uid: str) -> Partner:
    with runtime.db.begin() as session:
        return session.scalars(select(Partner).where(Partner.uid == uid)).one()


def test_an_operator_adds_an_operator_endpoint_in_the_ui(ui, runtime):
    page = ui.get("/ui/operator-endpoints")
    assert page.status_code == 200 and "No operator endpoint yet" in page.text
    assert 'data-testid="operator-endpoints-link"' in ui.get("/ui/endpoints").text
    made = ui.post(
        "/ui/operator-endpoints",
        data={
            "csrf_token": token(ui, "/ui/operator-endpoints"),
            "url": "http://127.0.0.1:9/ops",
            "event_types": ["endpoint.disabled", "delivery.exhausted"],
        },
    )
    assert made.status_code == 302 and made.headers["Location"].endswith("/secret")
    with runtime.db.begin() as session:
        endpoint = session.scalars(select(Endpoint)).one()
        assert endpoint.partner.uid == "kurir-operators"
        assert endpoint.event_types == ["endpoint.disabled", "delivery.exhausted"]
        actions = session.scalars(select(AuditRecord.action)).all()
    assert actions == ["endpoint.created"]
    listed = ui.get("/ui/operator-endpoints").text
    assert 'data-testid="operator-endpoints"' in listed and "http://127.0.0.1:9/ops" in listed
    refused = ui.post(
        "/ui/operator-endpoints",
        data={"csrf_token": token(ui, "/ui/operator-endpoints"), "url": "ftp://nope"},
    )
    assert refused.status_code == 422 and "flash-error" in refused.text


def test_the_ui_partner_page_toggles_the_opt_in(ui, runtime, client, auth):
    assert client.post("/v1/partners", headers=auth, json={"uid": "acme"}).status_code == 201
    page = ui.get("/ui/partners/acme")
    assert 'data-testid="operational-on"' in page.text
    turned = ui.post(
        "/ui/partners/acme/operational-events",
        data={"csrf_token": token(ui, "/ui/partners/acme"), "on": "1"},
    )
    assert turned.status_code == 302
    assert _partner(runtime, "acme").operational_events is True
    assert 'data-testid="operational-off"' in ui.get("/ui/partners/acme").text
    with runtime.db.begin() as session:
        record = session.scalars(
            select(AuditRecord).where(AuditRecord.action == "partner.updated")
        ).one()
    assert record.actor == f"operator:{EMAIL}" and record.details["operational_events"] is True
    ui.post(
        "/ui/partners/acme/operational-events",
        data={"csrf_token": token(ui, "/ui/partners/acme"), "on": "0"},
    )
    assert _partner(runtime, "acme").operational_events is False


def test_a_partner_turns_operational_events_on_in_the_portal(client, auth, runtime):
    assert client.post("/v1/partners", headers=auth, json={"uid": "acme"}).status_code == 201
    sign_in(client, auth, "acme")
    home = client.get("/portal/")
    assert 'data-testid="operational-on"' in home.text
    turned = client.post("/portal/operational-events", data={"csrf_token": csrf(client), "on": "1"})
    assert turned.status_code == 302
    assert _partner(runtime, "acme").operational_events is True
    assert 'data-testid="operational-off"' in client.get("/portal/").text
    with runtime.db.begin() as session:
        record = session.scalars(
            select(AuditRecord).where(AuditRecord.action == "partner.updated")
        ).one()
    assert record.actor == "portal:acme"


def test_the_portal_catalog_shows_the_operational_types(client, auth, runtime):
    sync_operator_endpoints(runtime)  # the scheduler registers them at start
    assert client.post("/v1/partners", headers=auth, json={"uid": "acme"}).status_code == 201
    sign_in(client, auth, "acme")
    page = client.get("/portal/catalog").text
    for name in operational.NAMES:
        assert f'id="{name}"' in page
    assert "disabled_by" in page  # the schema and the example are shown
