"""Scoped portal links: a read-only session sees everything and changes nothing; a feature list
hides whole sections. A table names every portal page and the section it belongs to, and every
POST is tried in each kind of session (as tests/integration/test_partner_access.py does for
partner keys)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from sqlalchemy import func, select

from app.errors import Forbidden
from app.models import AuditRecord, Endpoint
from app.services import endpoints as endpoint_service
from app.services import portal as portal_service
from app.services.actor import Actor
from app.web.portal import security
from tests.integration.test_portal import csrf, link_for, path_of
from tests.support.dlq_factories import make_dead_letter
from tests.support.dlq_factories import make_event as make_dl_event
from tests.support.publish import error_of, make_endpoint, make_event_type, make_partner

# Every portal page and the section (a link's feature) it belongs to; None: every session.
TABLE: dict[str, str | None] = {
    "portal.logout": None,
    "portal.home": None,
    "portal.verify": None,
    "portal.endpoint_new": "endpoints",
    "portal.endpoint": "endpoints",
    "portal.endpoint_edit": "endpoints",
    "portal.endpoint_filter_test": "endpoints",
    "portal.endpoint_filter_test_new": "endpoints",
    "portal.endpoint_enable": "endpoints",
    "portal.endpoint_delete": "endpoints",
    "portal.endpoint_resend_parked": "resend",
    "portal.endpoint_skip_expired": "feed",
    "portal.endpoint_secret": "secrets",
    "portal.endpoint_secret_reveal": "secrets",
    "portal.endpoint_secret_rotate": "secrets",
    "portal.endpoint_secret_expire_previous": "secrets",
    "portal.endpoint_test": "test",
    "portal.endpoint_verify": "endpoints",
    "portal.endpoint_resend_challenge": "endpoints",
    "portal.endpoint_probe": "endpoints",
    "portal.endpoint_recover": "resend",
    "portal.operational_events": "endpoints",
    "portal.feed_key_create": "feed",
    "portal.feed_key_revoke": "feed",
    "portal.deliveries": "deliveries",
    "portal.delivery": "deliveries",
    "portal.delivery_resend": "resend",
    "portal.catalog": "catalog",
}
# Spending a link comes before any session: no scope applies to it.
BEFORE_SESSION = {"portal.enter"}
_POST_FORM = re.compile(r'<form[^>]*method="post"[^>]*action="([^"]+)"')


def _routes(app) -> list[tuple[str, str, str]]:
    """(view, method, rule) of every portal route but the link itself."""
    found = []
    for rule in app.url_map.iter_rules():
        if not rule.endpoint.startswith("portal.") or rule.endpoint in BEFORE_SESSION:
            continue
        for method in sorted((rule.methods or set()) & {"GET", "POST"}):
            found.append((rule.endpoint, method, rule.rule))
    return found


@pytest.fixture
def world(client, auth, runtime) -> dict[str, Any]:
    make_event_type(client, auth, "order.created")
    make_partner(client, auth, "acme")
    push = make_endpoint(client, auth, "acme", url="http://127.0.0.1:9/acme")
    pull = make_endpoint(client, auth, "acme", url=None, mode="pull")
    with runtime.db.begin() as session:
        endpoint = session.get_one(Endpoint, push["id"])
        dead = make_dead_letter(
            session, endpoint, make_dl_event(session, endpoint.partner, type="order.created")
        )
    return {"endpoint_id": push["id"], "pull": pull["id"], "delivery_id": dead.delivery_id}


def _url(view: str, rule: str, world: dict[str, Any]) -> str:
    endpoint_id = world["pull"] if view == "portal.endpoint_skip_expired" else world["endpoint_id"]
    return (
        rule.replace("<endpoint_id>", endpoint_id)
        .replace("<delivery_id>", world["delivery_id"])
        .replace("<key_id>", "key_unknown")
    )


def _session(app, client, auth, **scope):
    browser = app.test_client()
    link = link_for(client, auth, "acme", **scope)
    assert browser.post(path_of(link["url"])).status_code == 302
    return browser, link


def _changes_made(runtime) -> int:
    with runtime.db.Session() as session:
        return session.scalar(
            select(func.count())
            .select_from(AuditRecord)
            .where(
                AuditRecord.actor == "portal:acme",
                AuditRecord.action.not_in(("portal.signed_in", "portal.signed_out")),
            )
        )


def test_the_table_names_every_portal_page(app):
    views = {view for view, _, _ in _routes(app)}
    assert views == set(TABLE), f"decide the section of: {sorted(views ^ set(TABLE))}"
    assert security.SECTIONS == TABLE
    assert {f for f in TABLE.values() if f} <= set(portal_service.FEATURES)


def test_a_link_scope_is_checked_answered_and_audited(client, auth, world, runtime):
    for body in (
        {"features": ["endpoints", "billing"]},
        {"features": "endpoints"},
        {"read_only": "yes"},
    ):
        refused = client.post("/v1/partners/acme/portal-links", headers=auth, json=body)
        assert refused.status_code == 422 and error_of(refused)["code"] == "invalid_field"
    link = link_for(client, auth, "acme", read_only=True, features=["deliveries", "catalog"])
    assert (link["read_only"], link["features"]) == (True, ["deliveries", "catalog"])
    full = link_for(client, auth, "acme")
    assert (full["read_only"], full["features"]) == (False, list(portal_service.FEATURES))
    with runtime.db.Session() as session:
        details = session.scalars(
            select(AuditRecord.details).where(AuditRecord.action == "portal_link.created")
        ).all()
    assert {"read_only": True, "features": ["deliveries", "catalog"]}.items() <= details[0].items()


def test_a_read_only_session_sees_everything_and_changes_nothing(app, client, auth, world, runtime):
    browser, _ = _session(app, client, auth, read_only=True)
    token = csrf(browser)
    for view, method, rule in _routes(app):
        if view == "portal.logout":
            continue
        url = _url(view, rule, world)
        if method == "POST":
            answer = browser.post(url, data={"csrf_token": token, "confirm": "x"})
            assert answer.status_code == 403, (view, answer.status_code)
            assert "read-only" in answer.text, view
        elif view in security.FORM_PAGES:
            assert browser.get(url).status_code == 403, view
        else:
            page = browser.get(url, follow_redirects=True)
            assert page.status_code == 200, (view, page.status_code)
            assert 'data-testid="portal-scope"' in page.text and "read-only" in page.text, view
            forms = [a for a in _POST_FORM.findall(page.text) if not a.endswith("/logout")]
            assert forms == [], (view, forms)
    assert _changes_made(runtime) == 0
    with runtime.db.Session() as session:
        signed_in = session.scalars(
            select(AuditRecord.details).where(AuditRecord.action == "portal.signed_in")
        ).one()
    assert signed_in["read_only"] is True
    # Signing out is the one thing it may post.
    assert browser.post("/portal/logout", data={"csrf_token": token}).status_code == 200


def test_a_read_only_actor_is_refused_by_the_services_themselves(world, runtime):
    with runtime.db.begin() as session:
        endpoint = session.get_one(Endpoint, world["endpoint_id"])
        actor = Actor.portal(endpoint.partner_id, "acme", read_only=True)
        with pytest.raises(Forbidden):
            endpoint_service.disable(session, actor, endpoint)


@pytest.mark.parametrize("hidden", portal_service.FEATURES)
def test_a_feature_left_out_is_absent_from_pages_and_routes(
    app, client, auth, world, runtime, hidden
):
    shown = [f for f in portal_service.FEATURES if f != hidden]
    browser, _ = _session(app, client, auth, features=shown)
    token = csrf(browser, "/portal/verify")
    for view, method, rule in _routes(app):
        if view == "portal.logout":
            continue
        url = _url(view, rule, world)
        answer = (
            browser.post(url, data={"csrf_token": token, "confirm": "x"})
            if method == "POST"
            else browser.get(url)
        )
        refused = "not part of this portal session" in answer.text
        if TABLE[view] == hidden:
            assert answer.status_code == 404 and refused, (view, method, answer.status_code)
        else:
            assert answer.status_code != 403 and not refused, (view, method, answer.status_code)
    page = browser.get("/portal/verify").text
    assert 'data-testid="portal-scope"' in page and f"only {', '.join(shown)}" in page


def test_a_session_without_endpoints_starts_at_its_first_section(app, client, auth, world):
    browser, _ = _session(app, client, auth, features=["catalog"])
    home = browser.get("/portal/")
    assert home.status_code == 302 and home.headers["Location"].endswith("/portal/catalog")
    nav = browser.get("/portal/catalog").text
    assert "Event catalog" in nav and ">Endpoints</a>" not in nav and ">Deliveries</a>" not in nav
    assert browser.get(f"/portal/endpoints/{world['endpoint_id']}").status_code == 404
    nothing, _ = _session(app, client, auth, features=[])
    assert nothing.get("/portal/").headers["Location"].endswith("/portal/verify")
