"""Withdrawing access for real: a revoked API key takes its portal links and sessions with it,
an admin (API, UI, CLI) can end every portal session of a partner, and operator UI sessions
are rows that signing out, disabling the operator or a new password end — in every API
process at once, because each of them reads the row on every request.

"Another API process" is a second app with its own Runtime (own engine, own key cache) over
the same database: it shares nothing with the first but the stores, as a process would.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from app.accounts import create_api_key, create_operator
from app.cli import cli
from app.models import ApiKey, AuditRecord, OperatorSession, PortalLink, PortalSession
from app.runtime import Runtime
from app.web import create_app
from tests.support.publish import make_partner

_TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')
EMAIL, PASSWORD = "ops@example.com", "correct horse battery"


def _path(url: str) -> str:
    return "/" + url.split("/", 3)[3]


def _link(client: Any, headers: dict[str, str], uid: str = "acme") -> str:
    made = client.post(f"/v1/partners/{uid}/portal-links", headers=headers)
    assert made.status_code == 201, made.get_json()
    return _path(made.get_json()["url"])


def _enter(app: Any, link: str) -> Any:
    browser = app.test_client()
    assert browser.post(link).status_code == 302
    assert browser.get("/portal/").status_code == 200
    return browser


def _env(settings: Any) -> dict[str, str]:
    return {
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": settings.redis_url,
        "KURIR_DATA_DIR": str(settings.data_dir),
        "KURIR_SECRET_KEY": settings.secret_key,
    }


@pytest.fixture
def other_process(settings: Any, runtime: Runtime) -> Any:
    """A second API process over the same database."""
    second = Runtime(settings, database=runtime.db)
    yield create_app(runtime=second)
    second.close()


@pytest.fixture
def partners(client: Any, auth: dict[str, str]) -> None:
    make_partner(client, auth, "acme")
    make_partner(client, auth, "globex")


def _partner_key(client: Any, auth: dict[str, str], uid: str = "acme") -> tuple[str, dict]:
    made = client.post(f"/v1/partners/{uid}/keys", headers=auth, json={"name": f"{uid}-ci"})
    assert made.status_code == 201
    body = made.get_json()
    return body["id"], {"Authorization": f"Bearer {body['key']}"}


# ------------------------------------------------------------------------------ key revocation


def test_revoking_a_partner_key_ends_its_portal_sessions_and_links_in_every_process(
    client, auth, partners, other_process, runtime
):
    key_id, partner_auth = _partner_key(client, auth)
    opened = _link(client, partner_auth)
    unused = _link(client, partner_auth)
    # The stolen key's session, used through the other process; the admin's own link's
    # session must survive the key's revocation.
    stolen = _enter(other_process, opened)
    admins = _enter(other_process, _link(client, auth))
    assert client.delete(f"/v1/keys/{key_id}", headers=auth).status_code == 200
    # At once, with no clock moved: the other process refuses the session and the link.
    ended = stolen.get("/portal/")
    assert ended.status_code == 401 and 'data-reason="revoked"' in ended.text
    assert "ended this session" in ended.text
    refused = other_process.test_client().post(unused)
    assert refused.status_code == 410 and 'data-code="link_revoked"' in refused.text
    assert admins.get("/portal/").status_code == 200
    with runtime.db.begin() as session:
        record = session.scalars(
            select(AuditRecord).where(AuditRecord.action == "key.revoked")
        ).one()
        assert record.details["portal_sessions_ended"] == 1
        assert record.details["portal_links_revoked"] == 1
        # Each session carries the key that minted its link.
        admin_key = session.scalar(select(ApiKey.id).where(ApiKey.name == "test-admin"))
        rows = {row.key_id: row for row in session.scalars(select(PortalSession))}
        assert set(rows) == {key_id, admin_key}
        assert rows[key_id].ended_at is not None and rows[key_id].end_reason == "revoked"
        assert rows[admin_key].ended_at is None


def test_a_key_revoked_behind_the_services_back_still_closes_its_portal_doors(
    client, auth, partners, runtime
):
    """Revocation is also checked where the doors are: a link or session whose minting key
    is revoked is refused even if nothing marked the link or the session (a key revoked
    while one of its links was being opened, or straight in the database)."""
    key_id, partner_auth = _partner_key(client, auth)
    opened = _link(client, partner_auth)
    unused = _link(client, partner_auth)
    browser = _enter(client.application, opened)
    with runtime.db.begin() as session:
        key = session.get_one(ApiKey, key_id)
        key.revoked_at = key.created_at
    assert browser.get("/portal/").status_code == 401
    refused = client.application.test_client().post(unused)
    assert refused.status_code == 410 and "withdrawn" in refused.text
    with runtime.db.begin() as session:  # only the first link was ever spent
        assert (
            len(session.scalars(select(PortalLink).where(PortalLink.used_at.is_not(None))).all())
            == 1
        )


# ------------------------------------------------------------------------------ partner-wide


def test_an_admin_ends_every_portal_session_and_unused_link_of_a_partner(
    client, auth, partners, other_process, runtime
):
    _, partner_auth = _partner_key(client, auth)
    sessions = [
        _enter(client.application, _link(client, headers)) for headers in (auth, partner_auth)
    ]
    unused = _link(client, auth)
    spent_and_ended = _enter(client.application, _link(client, auth))
    token = _TOKEN.search(spent_and_ended.get("/portal/").text).group(1)
    spent_and_ended.post("/portal/logout", data={"csrf_token": token})
    neighbour = _enter(client.application, _link(client, auth, "globex"))
    # Partner credentials do not know the route exists; a non-admin key may not use it.
    assert (
        client.delete("/v1/partners/acme/portal-sessions", headers=partner_auth).status_code == 404
    )
    with runtime.db.begin() as session:
        _, writer = create_api_key(session, "writer", ["endpoints:write"])
    assert (
        client.delete(
            "/v1/partners/acme/portal-sessions", headers={"Authorization": f"Bearer {writer}"}
        ).status_code
        == 403
    )
    answer = client.delete("/v1/partners/acme/portal-sessions", headers=auth)
    assert answer.status_code == 200 and answer.get_json() == {"ended": 2, "revoked": 1}
    for browser in sessions:
        assert browser.get("/portal/").status_code == 401
    assert other_process.test_client().post(unused).status_code == 410
    assert neighbour.get("/portal/").status_code == 200
    again = client.delete("/v1/partners/acme/portal-sessions", headers=auth)
    assert again.get_json() == {"ended": 0, "revoked": 0}
    assert client.delete("/v1/partners/ghost/portal-sessions", headers=auth).status_code == 404
    with runtime.db.begin() as session:
        records = session.scalars(
            select(AuditRecord)
            .where(AuditRecord.action == "portal.revoked")
            .order_by(AuditRecord.id)
        ).all()
        assert [(r.actor, r.details["ended"], r.details["revoked"]) for r in records] == [
            ("key:test-admin", 2, 1),
            ("key:test-admin", 0, 0),
        ]


def test_the_partner_page_ends_portal_access_with_a_confirmed_csrf_protected_button(
    client, auth, partners, runtime
):
    with runtime.db.begin() as session:
        create_operator(session, EMAIL, PASSWORD)
    ui = client.application.test_client()
    login = ui.get("/ui/login")
    assert (
        ui.post(
            "/ui/login",
            data={
                "email": EMAIL,
                "password": PASSWORD,
                "csrf_token": _TOKEN.search(login.text).group(1),
            },
        ).status_code
        == 302
    )
    inside = _enter(client.application, _link(client, auth))
    page = ui.get("/ui/partners/acme")
    assert 'data-testid="revoke-portal"' in page.text and "data-confirm=" in page.text
    forged = ui.post("/ui/partners/acme/portal-sessions/revoke", data={})
    assert forged.status_code == 400
    assert inside.get("/portal/").status_code == 200
    done = ui.post(
        "/ui/partners/acme/portal-sessions/revoke",
        data={"csrf_token": _TOKEN.search(page.text).group(1)},
    )
    assert done.status_code == 302 and done.headers["Location"] == "/ui/partners/acme"
    assert "1 session(s) ended" in ui.get("/ui/partners/acme").text
    assert inside.get("/portal/").status_code == 401
    with runtime.db.begin() as session:
        record = session.scalars(
            select(AuditRecord).where(AuditRecord.action == "portal.revoked")
        ).one()
        assert record.actor == f"operator:{EMAIL}" and record.details["ended"] == 1


def test_kurir_portal_revoke_ends_a_partners_portal_access(
    client, auth, partners, runtime, settings
):
    inside = _enter(client.application, _link(client, auth))
    _link(client, auth)
    runner = CliRunner()
    done = runner.invoke(cli, ["portal", "revoke", "acme"], env=_env(settings))
    assert done.exit_code == 0, done.output
    assert "1 portal session(s) ended, 1 unused link(s) revoked" in done.stdout
    assert inside.get("/portal/").status_code == 401
    missing = runner.invoke(cli, ["portal", "revoke", "ghost"], env=_env(settings))
    assert missing.exit_code == 1 and "ghost" in missing.stderr


# ------------------------------------------------------------------------------ operator UI


@pytest.fixture
def operator(runtime: Runtime) -> None:
    with runtime.db.begin() as session:
        create_operator(session, EMAIL, PASSWORD)


def _ui_sign_in(app: Any, password: str = PASSWORD) -> Any:
    browser = app.test_client()
    form = browser.get("/ui/login")
    signed_in = browser.post(
        "/ui/login",
        data={
            "email": EMAIL,
            "password": password,
            "csrf_token": _TOKEN.search(form.text).group(1),
        },
    )
    assert signed_in.status_code == 302, signed_in.text
    assert browser.get("/ui/").status_code == 200
    return browser


def _cookie(browser: Any, name: str) -> str:
    return next(c for c in browser._cookies.values() if c.key == name).value


def test_signing_out_of_the_ui_ends_the_session_row_so_a_copied_cookie_is_refused(
    app, operator, other_process, runtime
):
    browser = _ui_sign_in(app)
    copied = _cookie(browser, "kurir_session")
    thief = other_process.test_client()
    thief.set_cookie("kurir_session", copied, path="/ui")
    assert thief.get("/ui/").status_code == 200
    token = _TOKEN.search(browser.get("/ui/").text).group(1)
    assert browser.post("/ui/logout", data={"csrf_token": token}).status_code == 302
    assert thief.get("/ui/").status_code == 302  # back to the login page
    with runtime.db.begin() as session:
        row = session.scalars(select(OperatorSession)).one()
        assert row.ended_at is not None and row.end_reason == "signed_out"


def test_a_new_password_or_disabling_ends_every_ui_session_of_the_operator(
    app, operator, other_process, runtime, settings
):
    first, second = _ui_sign_in(app), _ui_sign_in(other_process)
    runner = CliRunner()
    changed = runner.invoke(
        cli,
        ["operators", "set-password", EMAIL, "--password-stdin"],
        input="a brand new passphrase\n",
        env=_env(settings),
    )
    assert changed.exit_code == 0, changed.output
    assert "2 UI session(s) ended" in changed.stdout
    assert first.get("/ui/").status_code == 302 and second.get("/ui/").status_code == 302
    again = _ui_sign_in(other_process, "a brand new passphrase")
    disabled = runner.invoke(cli, ["operators", "disable", EMAIL], env=_env(settings))
    assert disabled.exit_code == 0 and "1 UI session(s) ended" in disabled.stdout
    assert again.get("/ui/").status_code == 302
    refused = app.test_client()
    form = refused.get("/ui/login")
    assert (
        refused.post(
            "/ui/login",
            data={
                "email": EMAIL,
                "password": "a brand new passphrase",
                "csrf_token": _TOKEN.search(form.text).group(1),
            },
        ).status_code
        == 401
    )
    assert runner.invoke(cli, ["operators", "enable", EMAIL], env=_env(settings)).exit_code == 0
    _ui_sign_in(app, "a brand new passphrase")
    with runtime.db.begin() as session:
        reasons = sorted(r for r in session.scalars(select(OperatorSession.end_reason)) if r)
        assert reasons == ["disabled", "password_changed", "password_changed"]
        actions = session.scalars(select(AuditRecord.action).order_by(AuditRecord.id)).all()
        assert actions[-3:] == [
            "operator.password_changed",
            "operator.disabled",
            "operator.enabled",
        ]
    weak = runner.invoke(
        cli,
        ["operators", "set-password", EMAIL, "--password-stdin"],
        input="short\n",
        env=_env(settings),
    )
    assert weak.exit_code == 1 and "at least 8" in weak.stderr
