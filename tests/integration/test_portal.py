"""The partner portal through Flask's test client: magic links, sessions, CSRF, every page and
every action, each audited as `portal:<uid>` and kept to its own partner."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from rq import Queue
from sqlalchemy import select

from app.accounts import create_api_key
from app.clock import utcnow
from app.models import AuditRecord, Delivery, Endpoint, Event, PortalLink, PortalSession
from app.queues import DEFAULT, KurirJob
from app.services import portal as portal_service
from app.web.portal import guide
from sender import health
from tests.support.dlq_factories import make_dead_letter
from tests.support.dlq_factories import make_event as make_dl_event
from tests.support.factories import Receiver, WorkerThread, wait_for
from tests.support.publish import (
    blocked_endpoint,
    make_endpoint,
    make_event_type,
    make_partner,
    old_event,
    order,
)

_TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


def link_for(client, auth, uid: str = "acme", **body) -> dict:
    response = client.post(f"/v1/partners/{uid}/portal-links", headers=auth, json=body or None)
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def path_of(url: str) -> str:
    return "/" + url.split("/", 3)[3]


def sign_in(client, auth, uid: str = "acme"):
    """Open a fresh magic link in `client`, as a partner's browser would."""
    link = link_for(client, auth, uid)
    page = client.get(path_of(link["url"]))
    assert page.status_code == 200 and "data-autosubmit" in page.text
    entered = client.post(path_of(link["url"]))
    assert entered.status_code == 302 and entered.headers["Location"] == "/portal/"
    return client


def csrf(client, path: str = "/portal/") -> str:
    match = _TOKEN.search(client.get(path).text)
    assert match, "no CSRF token on the page"
    return match.group(1)


@pytest.fixture
def acme(client, auth):
    make_event_type(client, auth, "order.created", description="An order was placed.")
    make_event_type(
        client,
        auth,
        "order.created",
        version=2,
        schema={
            "type": "object",
            "required": ["order_id"],
            "properties": {
                "order_id": {"type": "string", "examples": ["ord_42"]},
                "total": {"type": "integer", "minimum": 0},
            },
        },
        downgrade="{order_id: order_id, amount: total}",
    )  # so v1 can be pinned
    make_event_type(client, auth, "order.shipped")
    make_partner(client, auth, "acme")
    make_partner(client, auth, "globex")
    return make_endpoint(client, auth, "acme", url="http://127.0.0.1:9/acme")


@pytest.fixture
def portal(app, auth, acme):
    """A second browser: the partner's, signed in to acme's portal."""
    return sign_in(app.test_client(), auth)


# ------------------------------------------------------------------------------ links


def test_a_link_opens_one_session_once_and_is_stored_hashed(client, auth, acme, runtime, app):
    link = link_for(client, auth)
    assert link["url"].startswith("http://localhost/portal/login/")
    expires = link["expires_at"]
    token = link["url"].rsplit("/", 1)[1]
    with runtime.db.begin() as session:
        row = session.scalars(select(PortalLink)).one()
        assert token not in row.token_hash and len(row.token_hash) == 64
        assert row.created_by == "key:test-admin"
    assert (row.expires_at - row.created_at) == timedelta(seconds=900)
    assert expires
    browser = app.test_client()
    # Fetching the link does not spend it (a scanner may fetch it before the partner).
    assert browser.get(path_of(link["url"])).status_code == 200
    assert browser.post(path_of(link["url"])).status_code == 302
    home = browser.get("/portal/")
    assert home.status_code == 200 and "Acme" in home.text
    cookie = next(c for c in browser._cookies.values() if c.key == "kurir_portal")
    assert cookie.path == "/portal"
    # Used once: a second use, in any browser, is a clear page, not a 500.
    again = app.test_client().post(path_of(link["url"]))
    assert again.status_code == 410 and "already used" in again.text
    assert 'data-code="link_used"' in again.text
    bogus = app.test_client().post("/portal/login/not-a-token")
    assert bogus.status_code == 404 and "not valid" in bogus.text


def test_two_concurrent_clicks_on_one_link_open_exactly_one_session(
    client, auth, acme, runtime, live_server, monkeypatch
):
    """Two real requests race on a live server. On PostgreSQL each is held after it has read
    the link and found it unused, until the other has read it too: only the conditional
    UPDATE can then keep the second from opening a session. (SQLite's transactions begin
    IMMEDIATE: the second cannot read before the first commits, so nothing is held there.)"""
    import threading

    import requests

    link = link_for(client, auth)
    both_read = threading.Barrier(2)
    real_update = portal_service.update
    hold = not runtime.db.is_sqlite

    def update_after_both_read(*args, **kwargs):
        if hold and args and args[0] is PortalLink:
            both_read.wait(timeout=30)  # broken (a 500) if the race was not constructed
        return real_update(*args, **kwargs)

    monkeypatch.setattr(portal_service, "update", update_after_both_read)
    answers: list[requests.Response] = []

    def click() -> None:
        answers.append(
            requests.post(live_server.url + path_of(link["url"]), allow_redirects=False, timeout=60)
        )

    clicks = [threading.Thread(target=click) for _ in range(2)]
    for thread in clicks:
        thread.start()
    for thread in clicks:
        thread.join(60)
    assert sorted(a.status_code for a in answers) == [302, 410]
    assert "already used" in next(a for a in answers if a.status_code == 410).text
    with runtime.db.begin() as session:
        assert len(session.scalars(select(PortalSession)).all()) == 1


def test_an_expired_link_is_refused_plainly(client, auth, acme, runtime, app):
    link = link_for(client, auth, expires_in_s=60)
    with runtime.db.begin() as session:
        row = session.scalars(select(PortalLink)).one()
        row.expires_at = utcnow() - timedelta(seconds=1)
    refused = app.test_client().post(path_of(link["url"]))
    assert refused.status_code == 410 and "expired" in refused.text


def test_link_lifetime_is_bounded_and_only_for_a_visible_partner(client, auth, acme, runtime):
    for bad in (59, 86401, "600", True):
        answer = client.post(
            "/v1/partners/acme/portal-links", headers=auth, json={"expires_in_s": bad}
        )
        assert answer.status_code == 422, bad
    assert client.post("/v1/partners/ghost/portal-links", headers=auth).status_code == 404
    day = link_for(client, auth, expires_in_s=86400)
    assert day["partner"] == "acme"
    # Minting needs endpoints:write: a read-only key, bound to acme or not, makes no link.
    with runtime.db.begin() as session:
        _, reader = create_api_key(session, "reader", ["read"])
    acme_reader = client.post(
        "/v1/partners/acme/keys", headers=auth, json={"name": "acme-reader", "scopes": ["read"]}
    ).get_json()
    for key in (reader, acme_reader["key"]):
        refused = client.post(
            "/v1/partners/acme/portal-links", headers={"Authorization": f"Bearer {key}"}
        )
        assert refused.status_code == 403, refused.get_json()
    with runtime.db.begin() as session:
        assert len(session.scalars(select(PortalLink)).all()) == 1


def test_a_partner_keys_links_live_at_most_an_hour(client, auth, acme, runtime, make_rt):
    made = client.post("/v1/partners/acme/keys", headers=auth, json={"name": "acme-ci"})
    partner_auth = {"Authorization": f"Bearer {made.get_json()['key']}"}
    over = client.post(
        "/v1/partners/acme/portal-links",
        headers=partner_auth,
        json={"expires_in_s": portal_service.PARTNER_KEY_LINK_TTL_MAX_S + 1},
    )
    assert over.status_code == 422
    assert over.get_json()["error"]["details"] == {"field": "expires_in_s", "max": 3600}
    hour = link_for(client, partner_auth, expires_in_s=3600)
    assert hour["partner"] == "acme"
    # A configured default longer than an hour is cut to the hour for a partner key only.
    from app.web import create_app

    long_default = create_app(runtime=make_rt(portal_link_ttl_seconds=86400)).test_client()
    default = long_default.post("/v1/partners/acme/portal-links", headers=partner_auth)
    admins = long_default.post("/v1/partners/acme/portal-links", headers=auth)
    with runtime.db.begin() as session:
        lifetimes = {
            row.id: (row.expires_at - row.created_at, row.key_id)
            for row in session.scalars(select(PortalLink))
        }
    key_id = made.get_json()["id"]
    assert lifetimes[hour["id"]] == (timedelta(hours=1), key_id)
    assert lifetimes[default.get_json()["id"]] == (timedelta(hours=1), key_id)
    admin_lifetime, admin_key = lifetimes[admins.get_json()["id"]]
    assert admin_lifetime == timedelta(days=1) and admin_key not in (None, key_id)


def test_a_public_url_setting_names_the_links_host(client, auth, acme, app, runtime):
    from app.web import create_app

    configured = create_app(
        runtime=type(runtime)(
            runtime.settings.with_overrides(public_url="https://hooks.example.com"),
            database=runtime.db,
        )
    )
    link = configured.test_client().post("/v1/partners/acme/portal-links", headers=auth)
    assert link.get_json()["url"].startswith("https://hooks.example.com/portal/login/")


def test_without_a_public_url_links_are_made_on_loopback_only(client, auth, acme, runtime):
    """The link's host would come from the request's Host: off loopback that is refused,
    plainly, until KURIR_PUBLIC_URL names the address partners use."""
    for host in ("http://localhost", "http://127.0.0.1:8080", "http://[::1]:8080"):
        made = client.post("/v1/partners/acme/portal-links", headers=auth, base_url=host)
        assert made.status_code == 201, host
        assert made.get_json()["url"].startswith(host + "/portal/login/")
    for host in (
        "http://kurir.internal.example",
        "https://127.evil.example",
        "http://10.0.0.5:8080",
    ):
        refused = client.post("/v1/partners/acme/portal-links", headers=auth, base_url=host)
        assert refused.status_code == 503, host
        error = refused.get_json()["error"]
        assert error["code"] == "public_url_required" and "KURIR_PUBLIC_URL" in error["message"]
    with runtime.db.begin() as session:  # nothing was stored for the refused ones
        assert len(session.scalars(select(PortalLink)).all()) == 3


def test_a_link_posted_from_another_sites_page_is_refused_and_stays_unused(
    client, auth, acme, app, runtime
):
    """Login CSRF: another site's form posting a link of its own would sign the visitor in
    as that partner. Browsers say where a POST comes from; only the link's own page may
    spend it. A client that is no browser (no such header) is not refused."""
    link = path_of(link_for(client, auth)["url"])
    page = app.test_client().get(link)
    assert page.headers["Referrer-Policy"] == "same-origin"  # so its POST has a real Origin
    forged = [
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "https://attacker.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site", "Origin": "http://localhost"},
    ]
    for headers in forged:
        refused = app.test_client().post(link, headers=headers)
        assert refused.status_code == 403, headers
        assert 'data-code="cross_site"' in refused.text
        assert "kurir_portal" not in refused.headers.get("Set-Cookie", "")
    with runtime.db.begin() as session:
        assert session.scalars(select(PortalLink)).one().used_at is None
    own_page = app.test_client().post(
        link, headers={"Sec-Fetch-Site": "same-origin", "Origin": "http://localhost"}
    )
    assert own_page.status_code == 302
    old_browser = app.test_client().post(
        path_of(link_for(client, auth)["url"]), headers={"Origin": "http://localhost"}
    )
    assert old_browser.status_code == 302
    no_browser = app.test_client().post(path_of(link_for(client, auth)["url"]))
    assert no_browser.status_code == 302


def test_a_nul_in_a_portal_form_is_a_400_not_a_server_error(portal, acme, runtime):
    token = csrf(portal, "/portal/endpoints/new")
    answer = portal.post(
        "/portal/endpoints/new",
        data={
            "csrf_token": token,
            "url": "http://127.0.0.1:9/nul",
            "description": "a\x00b",
            "all_types": "1",
            "timeout_s": "15",
        },
    )
    assert answer.status_code == 400 and "NUL character" in answer.text
    with runtime.db.begin() as session:
        assert (
            session.scalars(select(Endpoint).where(Endpoint.url.endswith("/nul"))).first() is None
        )


def test_a_links_token_never_reaches_the_error_log(
    client, auth, acme, app, runtime, monkeypatch, caplog
):
    """Both ways an unexpected error is logged name the path: the portal's own error page,
    and Flask's line for what escapes every handler (here a failing after_request)."""
    from app.web import create_app

    link = path_of(link_for(client, auth)["url"])
    token = link.rsplit("/", 1)[1]

    def broken(*args, **kwargs):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(portal_service, "enter", broken)
    with caplog.at_level("ERROR"):
        assert app.test_client().post(link).status_code == 500
    monkeypatch.undo()
    failing = create_app(runtime=runtime)
    failures = [RuntimeError("a cookie that cannot be saved")]

    @failing.after_request
    def fail_once(response):
        if failures:
            raise failures.pop()
        return response

    with caplog.at_level("ERROR"):
        assert failing.test_client().get(link).status_code == 500
    logged = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(logged) == 2
    for record in logged:
        line = record.getMessage()
        assert "/portal/login/[redacted]" in line and token not in line, line
    # And the API's handler, for errors outside the faces, redacts the same way.
    handler = app.error_handler_spec[None][None][Exception]
    with app.test_request_context(link, method="POST"), caplog.at_level("ERROR"):
        handler(RuntimeError("boom"))
    assert token not in caplog.records[-1].getMessage()
    assert "/portal/login/[redacted]" in caplog.records[-1].getMessage()


# ------------------------------------------------------------------------------ sessions


def test_signing_out_ends_the_session_everywhere(portal, runtime, app):
    token = csrf(portal)
    cookie = next(c for c in portal._cookies.values() if c.key == "kurir_portal").value
    out = portal.post("/portal/logout", data={"csrf_token": token})
    assert out.status_code == 200 and "signed out" in out.text
    after = portal.get("/portal/")
    assert after.status_code == 401 and "not signed in" in after.text
    # A copy of the old cookie, kept by someone else, opens nothing either.
    replay = app.test_client()
    replay.set_cookie("kurir_portal", cookie, path="/portal")
    refused = replay.get("/portal/")
    assert refused.status_code == 401 and 'data-reason="signed_out"' in refused.text
    with runtime.db.begin() as session:
        row = session.scalars(select(PortalSession)).one()
        assert row.ended_at is not None
        actions = list(
            session.scalars(
                select(AuditRecord.action)
                .order_by(AuditRecord.id)
                .where(AuditRecord.actor == "portal:acme")
            )
        )
        assert actions == ["portal.signed_in", "portal.signed_out"]


def test_a_session_ends_after_an_idle_hour_and_after_twelve_hours(portal, runtime):
    assert portal.get("/portal/").status_code == 200
    with runtime.db.begin() as session:
        row = session.scalars(select(PortalSession)).one()
        row.last_seen_at = utcnow() - portal_service.SESSION_IDLE
    idle = portal.get("/portal/")
    assert idle.status_code == 401 and "without activity" in idle.text
    with runtime.db.begin() as session:
        row = session.scalars(select(PortalSession)).one()
        row.last_seen_at = utcnow()
        row.expires_at = utcnow() - timedelta(seconds=1)
    assert portal.get("/portal/").status_code == 401  # the cookie was dropped too


def test_a_post_without_the_csrf_token_changes_nothing(portal, acme, runtime):
    forged = portal.post(f"/portal/endpoints/{acme['id']}/secret/rotate", data={})
    assert forged.status_code == 400 and "expired" in forged.text
    wrong = portal.post(
        f"/portal/endpoints/{acme['id']}/delete",
        data={"csrf_token": "guess", "confirm": acme["url"]},
    )
    assert wrong.status_code == 400
    with runtime.db.begin() as session:
        endpoint = session.get_one(Endpoint, acme["id"])
        assert endpoint.deleted_at is None and len(endpoint.secrets) == 1


def test_security_headers_refuse_framing_unless_ancestors_are_configured(
    portal, runtime, auth, client
):
    page = portal.get("/portal/")
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    assert page.headers["X-Frame-Options"] == "DENY"
    assert page.headers["Referrer-Policy"] == "no-referrer"
    from app.web import create_app

    framed = create_app(
        runtime=type(runtime)(
            runtime.settings.with_overrides(
                portal_frame_ancestors="https://dash.example.com", cookie_secure=True
            ),
            database=runtime.db,
        )
    )
    browser = framed.test_client()
    link = link_for(client, auth)
    entered = browser.post(path_of(link["url"]), base_url="https://localhost")
    cookie = entered.headers["Set-Cookie"]
    assert "SameSite=None" in cookie and "Secure" in cookie and "Partitioned" in cookie
    page = browser.get("/portal/", base_url="https://localhost")
    assert page.status_code == 200
    assert "frame-ancestors https://dash.example.com" in page.headers["Content-Security-Policy"]
    assert "X-Frame-Options" not in page.headers


# ------------------------------------------------------------------------------ endpoints


def test_create_edit_enable_and_delete_an_endpoint(portal, acme, runtime):
    assert acme["url"] in portal.get("/portal/").text
    form = portal.get("/portal/endpoints/new")
    assert form.status_code == 200 and "order.shipped" in form.text and "v2, v1" in form.text
    token = csrf(portal, "/portal/endpoints/new")
    blocked = portal.post(
        "/portal/endpoints/new",
        data={
            "csrf_token": token,
            "url": "ftp://example.com/x",
            "all_types": "1",
            "timeout_s": "15",
            "header-0-name": "",
            "header-0-value": "",
        },
    )
    assert blocked.status_code == 422 and 'data-testid="error-url"' in blocked.text
    assert "ftp://example.com/x" in blocked.text  # what was typed is kept
    none_chosen = portal.post(
        "/portal/endpoints/new",
        data={
            "csrf_token": token,
            "url": "http://127.0.0.1:9/new",
            "all_types": "0",
            "timeout_s": "15",
        },
    )
    assert none_chosen.status_code == 422 and "choose at least one" in none_chosen.text
    created = portal.post(
        "/portal/endpoints/new",
        data={
            "csrf_token": token,
            "url": "http://127.0.0.1:9/new",
            "description": "prod",
            "all_types": "0",
            "event_types": ["order.created"],
            "timeout_s": "10",
            "rate_limit_per_s": "5",
            "header-0-name": "Authorization",
            "header-0-value": "Bearer partner-own-token",
            "header-1-name": "X-Team",
            "header-1-value": "payments",
            "header-1-public": "1",
        },
    )
    assert created.status_code == 302, created.text
    endpoint_id = created.headers["Location"].rsplit("/", 1)[1]
    page = portal.get(f"/portal/endpoints/{endpoint_id}")
    assert "Endpoint created" in page.text and "partner-own-token" not in page.text
    assert "X-Team: payments" in page.text
    edit = portal.get(f"/portal/endpoints/{endpoint_id}/edit")
    assert "partner-own-token" not in edit.text and "write-only" in edit.text
    saved = portal.post(
        f"/portal/endpoints/{endpoint_id}/edit",
        data={
            "csrf_token": token,
            "url": "http://127.0.0.1:9/moved",
            "all_types": "1",
            "timeout_s": "12",
            "rate_limit_per_s": "",
            "header-0-name": "Authorization",
            "header-0-value": "",
            "header-0-stored": "1",
            "header-1-name": "X-Team",
            "header-1-value": "payments",
            "header-1-public": "1",
            "header-1-stored": "1",
            "header-1-remove": "1",
        },
    )
    assert saved.status_code == 302, saved.text
    with runtime.db.begin() as session:
        endpoint = session.get_one(Endpoint, endpoint_id)
        assert endpoint.url == "http://127.0.0.1:9/moved" and endpoint.event_types is None
        # A blank write-only value kept what was stored; the removed header is gone.
        assert endpoint.headers == {"Authorization": "Bearer partner-own-token"}
        assert endpoint.rate_limit_per_s is None and endpoint.timeout_s == 12
        endpoint.state, endpoint.disabled_reason = "disabled", "failing: 8 consecutive"
    disabled = portal.get(f"/portal/endpoints/{endpoint_id}")
    assert "This endpoint is disabled" in disabled.text
    assert "failing: 8 consecutive" in disabled.text
    assert (
        portal.post(
            f"/portal/endpoints/{endpoint_id}/enable", data={"csrf_token": token}
        ).status_code
        == 302
    )
    confirm = portal.get(f"/portal/endpoints/{endpoint_id}/delete")
    assert "cannot be undone" in confirm.text
    unconfirmed = portal.post(
        f"/portal/endpoints/{endpoint_id}/delete", data={"csrf_token": token, "confirm": "yes"}
    )
    assert unconfirmed.status_code == 302
    deleted = portal.post(
        f"/portal/endpoints/{endpoint_id}/delete",
        data={"csrf_token": token, "confirm": "http://127.0.0.1:9/moved"},
    )
    assert deleted.status_code == 302
    with runtime.db.begin() as session:
        assert session.get_one(Endpoint, endpoint_id).deleted_at is not None
        trail = list(
            session.scalars(
                select(AuditRecord.action)
                .where(AuditRecord.subject_id == endpoint_id, AuditRecord.actor == "portal:acme")
                .order_by(AuditRecord.id)
            )
        )
        assert trail == [
            "endpoint.created",
            "endpoint.updated",
            "endpoint.enabled",
            "endpoint.deleted",
        ]
        sessions = {
            d.get("session")
            for d in session.scalars(
                select(AuditRecord.details).where(AuditRecord.subject_id == endpoint_id)
            )
        }
        assert len(sessions) == 1 and next(iter(sessions)).startswith("ps_")


def test_a_partner_pins_a_version_from_the_portal_and_unpins_it(portal, acme, runtime):
    """The endpoint form has a selector per type: pinned, the endpoint keeps receiving v1 of
    order.created after v2 exists; a pin to a version that does not exist is put on the field."""
    endpoint_id = acme["id"]
    edit = portal.get(f"/portal/endpoints/{endpoint_id}/edit")
    assert 'name="pin-order.created"' in edit.text and "as published (newest)" in edit.text
    token = csrf(portal, f"/portal/endpoints/{endpoint_id}/edit")
    fields = {"csrf_token": token, "url": acme["url"], "all_types": "1", "timeout_s": "15"}
    pinned = portal.post(
        f"/portal/endpoints/{endpoint_id}/edit",
        data={**fields, "pin-order.created": "1", "pin-order.shipped": ""},
    )
    assert pinned.status_code == 302, pinned.text
    with runtime.db.begin() as session:
        assert session.get_one(Endpoint, endpoint_id).versions == {"order.created": 1}
    again = portal.get(f"/portal/endpoints/{endpoint_id}/edit").text
    assert re.search(r'<option value="1"\s+selected>v1', again), "the pin is shown as chosen"
    missing = portal.post(
        f"/portal/endpoints/{endpoint_id}/edit", data={**fields, "pin-order.created": "7"}
    )
    assert missing.status_code == 422 and 'data-testid="error-versions"' in missing.text
    unpinned = portal.post(
        f"/portal/endpoints/{endpoint_id}/edit", data={**fields, "pin-order.created": ""}
    )
    assert unpinned.status_code == 302
    with runtime.db.begin() as session:
        assert not session.get_one(Endpoint, endpoint_id).versions
        actions = list(
            session.scalars(
                select(AuditRecord.action).where(
                    AuditRecord.subject_id == endpoint_id, AuditRecord.actor == "portal:acme"
                )
            )
        )
        assert actions.count("endpoint.updated") == 2


def test_a_partner_creates_a_pull_endpoint_and_its_page_says_how_to_read_the_feed(
    portal, client, auth, runtime
):
    """Chosen at creation: no URL, nothing pushed; the page shows the feed and ack calls to
    copy and what is not acknowledged yet, and offers no test event or signing secret."""
    form = portal.get("/portal/endpoints/new").text
    assert 'name="mode" value="pull"' in form
    token = csrf(portal, "/portal/endpoints/new")
    created = portal.post(
        "/portal/endpoints/new",
        data={"csrf_token": token, "mode": "pull", "url": "", "all_types": "1", "timeout_s": "15"},
    )
    assert created.status_code == 302, created.text
    endpoint_id = created.headers["Location"].rsplit("/", 1)[1]
    with runtime.db.begin() as session:
        endpoint = session.get_one(Endpoint, endpoint_id)
        assert endpoint.mode == "pull" and not endpoint.url
    published = client.post("/v1/partners/acme/events", headers=auth, json=order())
    assert published.status_code == 202, published.get_json()
    assert published.get_json()["deliveries"] == [
        d for d in published.get_json()["deliveries"] if d["endpoint"] != endpoint_id
    ]
    page = portal.get(f"/portal/endpoints/{endpoint_id}").text
    assert 'data-testid="pull"' in page
    assert f"/v1/partners/acme/feed?endpoint={endpoint_id}" in page
    assert f"/v1/partners/acme/endpoints/{endpoint_id}/ack" in page
    assert re.search(r'data-testid="lag">1 event\b', page), page
    assert "Send a test event" not in page and "Signing secret" not in page
    push_needs_url = portal.post(
        "/portal/endpoints/new",
        data={"csrf_token": token, "mode": "push", "url": "", "all_types": "1", "timeout_s": "15"},
    )
    assert push_needs_url.status_code == 422 and 'data-testid="error-url"' in push_needs_url.text


def test_reveal_and_rotate_the_secret_say_until_when_the_old_one_signs(portal, acme, runtime):
    url = f"/portal/endpoints/{acme['id']}/secret"
    hidden = portal.get(url)
    assert "whsec_" in hidden.text and 'data-testid="secret"' not in hidden.text
    token = csrf(portal, url)
    shown = portal.post(f"{url}/reveal", data={"csrf_token": token})
    first = re.search(r'data-testid="secret">(whsec_[^<]+)<', shown.text).group(1)
    rotated = portal.post(f"{url}/rotate", data={"csrf_token": token})
    assert rotated.status_code == 302
    after = portal.get(url)
    assert 'data-testid="overlap"' in after.text and "keeps signing until" in after.text
    second = re.search(
        r'data-testid="secret">(whsec_[^<]+)<',
        portal.post(f"{url}/reveal", data={"csrf_token": token}).text,
    ).group(1)
    assert first != second
    with runtime.db.begin() as session:
        actions = list(
            session.scalars(
                select(AuditRecord.action)
                .where(AuditRecord.subject_id == acme["id"], AuditRecord.actor == "portal:acme")
                .order_by(AuditRecord.id)
            )
        )
        assert actions == [
            "endpoint.secret_revealed",
            "endpoint.secret_rotated",
            "endpoint.secret_revealed",
        ]


def test_another_partners_endpoint_is_not_found_by_url_guessing(portal, client, auth, runtime):
    other = make_endpoint(
        client, auth, "globex", url="http://127.0.0.1:9/globex", description="theirs"
    )
    parked = make_endpoint(client, auth, "globex", url="http://127.0.0.1:9/globex-off")
    with runtime.db.begin() as session:
        # Disabled by the health monitor, which globex itself could undo: a wrongly allowed
        # enable would show. And a dead delivery a wrongly allowed resend would re-arm.
        assert health.disable(
            session, parked["id"], "failing: 8 consecutive failed attempts", utcnow()
        )
        globex = session.get_one(Endpoint, other["id"]).partner
        dead = make_dead_letter(
            session, session.get_one(Endpoint, other["id"]), make_dl_event(session, globex)
        ).delivery_id
    token = csrf(portal)
    for path in (
        f"/portal/endpoints/{other['id']}",
        f"/portal/endpoints/{other['id']}/edit",
        f"/portal/endpoints/{other['id']}/secret",
        f"/portal/endpoints/{other['id']}/delete",
        f"/portal/deliveries/{dead}",
        f"/portal/verify?endpoint={other['id']}",
    ):
        page = portal.get(path)
        assert page.status_code == 404, path
        assert "globex" not in page.text and other["url"] not in page.text
    # A list filtered by it keeps its form and says the endpoint does not exist, as for any
    # id that names nothing.
    listed = portal.get(f"/portal/deliveries?endpoint={other['id']}")
    assert listed.status_code == 200 and "does not exist" in listed.text
    assert "globex" not in listed.text and other["url"] not in listed.text
    posts = {
        f"/portal/endpoints/{other['id']}/secret/reveal": {},
        f"/portal/endpoints/{other['id']}/secret/rotate": {},
        f"/portal/endpoints/{other['id']}/test": {},
        f"/portal/endpoints/{other['id']}/edit": {
            "url": "http://127.0.0.1:9/hijacked",
            "description": "ours now",
            "all_types": "1",
            "timeout_s": "15",
        },
        f"/portal/endpoints/{other['id']}/delete": {"confirm": other["url"]},
        f"/portal/endpoints/{parked['id']}/enable": {},
        f"/portal/endpoints/{parked['id']}/resend-parked": {},
        f"/portal/deliveries/{dead}/resend": {},
    }
    for path, form in posts.items():
        refused = portal.post(
            path,
            data={"csrf_token": token, **form},
            headers={"Referer": "http://localhost/portal/"},
        )
        assert refused.status_code == 404, path
        assert "whsec_" not in refused.text and "globex" not in refused.text
    with runtime.db.begin() as session:
        endpoint = session.get_one(Endpoint, other["id"])
        assert (endpoint.url, endpoint.description) == (other["url"], "theirs")
        assert endpoint.deleted_at is None and len(endpoint.secrets) == 1
        assert session.get_one(Endpoint, parked["id"]).state == "disabled"
        (delivery,) = session.scalars(select(Delivery)).all()  # no test event either
        assert (delivery.id, delivery.state, delivery.run) == (dead, "dead", 1)
        assert session.scalars(
            select(AuditRecord.action).where(AuditRecord.actor == "portal:acme")
        ).all() == ["portal.signed_in"]


# ------------------------------------------------------------------------------ deliveries


def test_a_test_event_arrives_signed_and_its_attempt_is_shown(portal, client, auth, runtime):
    with Receiver() as receiver:
        endpoint = make_endpoint(
            client, auth, "acme", url=receiver.url + "/hook", event_types=["order.shipped"]
        )
        token = csrf(portal)
        sent = portal.post(f"/portal/endpoints/{endpoint['id']}/test", data={"csrf_token": token})
        assert sent.status_code == 302
        page_url = sent.headers["Location"]
        assert "On its way" in portal.get(page_url).text
        with WorkerThread(runtime):
            wait_for(lambda: receiver.on("/hook"), timeout_s=15, message="the test event")
            wait_for(
                lambda: "test-outcome" in portal.get(page_url).text,
                timeout_s=15,
                message="the attempt on the page",
            )
    page = portal.get(page_url).text
    assert "answered 200" in page and 'data-testid="attempt-duration"' in page
    (received,) = receiver.on("/hook")
    body = received.json
    assert body["type"] == "kurir.test" and body["data"]["endpoint"] == endpoint["id"]
    assert body["data"]["sent_by"] == "portal:acme" and body["partner"] == "acme"
    from standardwebhooks import Webhook

    secret = client.get(
        f"/v1/partners/acme/endpoints/{endpoint['id']}/secret", headers=auth
    ).get_json()["secret"]
    Webhook(secret).verify(received.body, received.headers)
    with runtime.db.begin() as session:
        audit = session.scalars(
            select(AuditRecord).where(AuditRecord.action == "endpoint.test_sent")
        ).one()
        assert audit.actor == "portal:acme" and audit.details["event"] == body["id"]
        # Only the chosen endpoint got it, whatever the others subscribe to.
        assert len(list(session.scalars(select(Delivery)))) == 1


def test_publishers_cannot_publish_or_register_kurirs_own_types(client, auth, acme):
    refused = client.post(
        "/v1/partners/acme/events",
        headers=auth,
        json={"type": "kurir.test", "version": 1, "data": {}},
    )
    assert refused.status_code == 422
    assert refused.get_json()["error"]["code"] == "reserved_event_type"
    register = client.post(
        "/v1/event-types",
        headers=auth,
        json={"name": "kurir.anything", "version": 1, "schema": {"type": "object"}},
    )
    assert register.status_code == 422
    subscribe = client.post(
        "/v1/partners/acme/endpoints",
        headers=auth,
        json={"url": "http://127.0.0.1:9/x", "event_types": ["kurir.test"]},
    )
    assert subscribe.status_code == 422
    assert subscribe.get_json()["error"]["code"] == "reserved_event_type"


def test_deliveries_list_filters_and_resends_a_dead_one(portal, client, auth, runtime, acme):
    from tests.support.dlq_factories import make_dead_letter
    from tests.support.dlq_factories import make_event as make_dl_event

    with runtime.db.begin() as session:
        endpoint = session.get_one(Endpoint, acme["id"])
        partner = endpoint.partner
        dead = make_dead_letter(
            session, endpoint, make_dl_event(session, partner, type="order.created"), attempts=2
        )
        dead_delivery = dead.delivery_id
    published = client.post("/v1/partners/acme/events", headers=auth, json=order()).get_json()
    listing = portal.get("/portal/deliveries")
    assert dead_delivery in listing.text and published["deliveries"][0]["id"] in listing.text
    only_dead = portal.get("/portal/deliveries?state=dead").text
    assert dead_delivery in only_dead and published["deliveries"][0]["id"] not in only_dead
    bad = portal.get("/portal/deliveries?status_code=abc&since=yesterday")
    assert bad.status_code == 200 and 'data-testid="error-status_code"' in bad.text
    detail = portal.get(f"/portal/deliveries/{dead_delivery}").text
    assert 'data-testid="attempt"' in detail and "Resend now" in detail
    token = csrf(portal)
    resent = portal.post(f"/portal/deliveries/{dead_delivery}/resend", data={"csrf_token": token})
    assert resent.status_code == 302
    with runtime.db.begin() as session:
        assert session.get_one(Delivery, dead_delivery).state == "pending"
        audit = session.scalars(
            select(AuditRecord).where(AuditRecord.action == "delivery.retried")
        ).one()
        assert audit.actor == "portal:acme"
        assert session.get_one(type(dead), dead.id).audit[-1].actor == "portal:acme"


def test_catalog_shows_every_version_with_an_example_and_the_guide_has_the_secret_prefix(
    portal, client, auth, acme
):
    catalog = portal.get("/portal/catalog").text
    assert "order.created" in catalog and "order.shipped" in catalog
    assert "kurir.test" not in catalog
    assert "An order was placed." in catalog and "Version 2" in catalog
    assert "ord_42" in catalog  # the schema's own example, inside the envelope
    guide_page = portal.get("/portal/verify").text
    secret = client.get(
        f"/v1/partners/acme/endpoints/{acme['id']}/secret", headers=auth
    ).get_json()["secret"]
    assert f"{secret[:10]}…" in guide_page and secret not in guide_page
    for snippet in ("python", "node", "go"):
        assert f'data-testid="snippet-{snippet}"' in guide_page
    for header in guide.HEADERS:
        assert header.name in guide_page


def test_empty_portal_says_what_to_do(client, auth, app):
    make_partner(client, auth, "initech")
    browser = sign_in(app.test_client(), auth, "initech")
    home = browser.get("/portal/").text
    assert 'data-testid="no-endpoints"' in home and "Add your first endpoint" in home
    assert "No deliveries match" in browser.get("/portal/deliveries").text


def test_event_rows_exist_for_test_events_only_as_kurir_test(portal, client, auth, runtime, acme):
    token = csrf(portal)
    portal.post(f"/portal/endpoints/{acme['id']}/test", data={"csrf_token": token})
    with runtime.db.begin() as session:
        (event,) = session.scalars(select(Event))
        assert event.type == "kurir.test" and event.version == 1


def test_ended_links_and_sessions_are_purged_after_a_day(portal, client, auth, runtime):
    from app.processes.scheduler import periodic_jobs

    link_for(client, auth)  # unused, still valid: kept
    with runtime.db.begin() as session:
        assert len(session.scalars(select(PortalLink)).all()) == 2
        used = session.scalars(select(PortalLink).where(PortalLink.used_at.is_not(None))).one()
        used.expires_at = utcnow() - portal_service.KEEP_ENDED - timedelta(minutes=1)
        row = session.scalars(select(PortalSession)).one()
        row.expires_at = used.expires_at
    jobs = {job.name: job.run for job in periodic_jobs(runtime)}
    assert jobs["purge-portal-links"](runtime) == 2
    with runtime.db.begin() as session:
        assert len(session.scalars(select(PortalLink)).all()) == 1
        assert session.scalars(select(PortalSession)).first() is None
        # The story stays in the audit trail.
        assert session.scalars(
            select(AuditRecord).where(AuditRecord.action == "portal.signed_in")
        ).one()
    assert portal.get("/portal/").status_code == 401


# ------------------------------------------------------------------------------ ordering, feed


def acme_key(client, auth) -> dict[str, str]:
    """A key of acme's own: what it disables, acme's portal may enable again."""
    made = client.post(
        "/v1/partners/acme/keys",
        headers=auth,
        json={"name": "acme-robot", "scopes": ["endpoints:write"]},
    )
    assert made.status_code == 201, made.get_json()
    return {"Authorization": f"Bearer {made.get_json()['key']}"}


def test_the_portal_shows_blocked_keys_of_its_own_endpoints_only(portal, client, auth, runtime):
    held = blocked_endpoint(client, auth, keys=("stock:acme",), disabled_by=acme_key(client, auth))
    foreign = blocked_endpoint(client, auth, "globex", keys=("stock:globex",))
    # Turning ordering off does not release what was numbered: the page still shows it.
    client.patch(
        f"/v1/partners/acme/endpoints/{held['id']}", headers=auth, json={"ordering": "none"}
    )
    page = portal.get(f"/portal/endpoints/{held['id']}").text
    assert 'data-testid="blocked-keys"' in page and "stock:acme" in page
    assert "stock:globex" not in page
    other = portal.get(f"/portal/endpoints/{foreign['id']}")
    assert other.status_code == 404 and "stock:globex" not in other.text
    # Once enabled, the held event is resent from the page and the key goes on.
    portal.post(f"/portal/endpoints/{held['id']}/enable", data={"csrf_token": csrf(portal)})
    with runtime.db.begin() as session:
        head = session.scalars(
            select(Delivery.id).where(
                Delivery.endpoint_id == held["id"], Delivery.ordering_seq == 1
            )
        ).one()
    assert f"/portal/deliveries/{head}/resend" in portal.get(f"/portal/endpoints/{held['id']}").text
    portal.post(f"/portal/deliveries/{head}/resend", data={"csrf_token": csrf(portal)})
    # The second parked event is the key's head now (it was parked too).
    page = portal.get(f"/portal/endpoints/{held['id']}").text
    assert f"/portal/deliveries/{head}/resend" not in page and "#2 " in page


def test_re_enabling_a_blocking_endpoint_from_the_portal_resends_what_was_held_back(
    portal, client, auth, runtime, redis_client
):
    held = blocked_endpoint(
        client, auth, keys=("stock:1", "stock:2"), disabled_by=acme_key(client, auth)
    )
    url = f"/portal/endpoints/{held['id']}"
    page = portal.get(url).text
    assert 'data-testid="parked-hold-keys"' in page
    assert "Enable and resend the 4 held back" in page
    response = portal.post(f"{url}/resend-parked", data={"csrf_token": csrf(portal, url)})
    assert response.status_code == 302
    (job,) = Queue(DEFAULT, connection=redis_client, job_class=KurirJob).get_jobs()
    job.perform()
    with runtime.db.begin() as session:
        assert session.get_one(Endpoint, held["id"]).state == "enabled"
        states = session.scalars(
            select(Delivery.state).where(Delivery.endpoint_id == held["id"])
        ).all()
        assert sorted(states) == ["pending"] * 4
        trail = session.execute(
            select(AuditRecord.action, AuditRecord.actor)
            .where(AuditRecord.subject_id == held["id"])
            .order_by(AuditRecord.id)
        ).all()
        assert trail[-2:] == [
            ("endpoint.enabled", "portal:acme"),
            ("endpoint.parked_resent", "portal:acme"),
        ]
    page = portal.get(url).text
    assert 'data-testid="parked"' not in page and 'data-testid="blocked-keys"' not in page


def test_an_enabled_endpoint_still_offers_what_it_held_back(portal, client, auth):
    held = blocked_endpoint(client, auth, keys=("stock:1",), disabled_by=acme_key(client, auth))
    url = f"/portal/endpoints/{held['id']}"
    portal.post(f"{url}/enable", data={"csrf_token": csrf(portal, url)})
    page = portal.get(url).text
    assert 'data-testid="resend-parked"' in page and 'data-testid="parked-hold-keys"' in page
    # Another partner's endpoint cannot be resent from here.
    foreign = blocked_endpoint(client, auth, "globex", keys=("stock:9",))
    refused = portal.post(
        f"/portal/endpoints/{foreign['id']}/resend-parked", data={"csrf_token": csrf(portal, url)}
    )
    assert refused.status_code == 404  # another partner's endpoint does not exist here
    assert (
        client.get(f"/v1/partners/globex/endpoints/{foreign['id']}", headers=auth).get_json()[
            "state"
        ]
        == "disabled"
    )


def test_a_partner_moves_its_pull_endpoint_past_an_expired_backlog(portal, client, auth, runtime):
    pull = make_endpoint(client, auth, url=None, mode="pull")
    old_event(runtime, "acme", "o-old", timedelta(days=runtime.settings.retain_events_days + 1))
    assert (
        client.get(f"/v1/partners/acme/feed?endpoint={pull['id']}", headers=auth).status_code == 410
    )
    url = f"/portal/endpoints/{pull['id']}"
    assert 'data-testid="backlog-expired"' in portal.get(url).text
    skipped = portal.post(
        f"{url}/skip-expired", data={"csrf_token": csrf(portal, url)}, follow_redirects=True
    ).text
    assert "Skipped 1 event(s)" in skipped and 'data-testid="backlog-expired"' not in skipped
    with runtime.db.begin() as session:
        assert session.scalars(
            select(AuditRecord.actor).where(AuditRecord.action == "endpoint.backlog_skipped")
        ).all() == ["portal:acme"]
