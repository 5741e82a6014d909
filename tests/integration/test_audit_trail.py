"""Every state change is audited with its actor, whichever face made it (one service layer)."""

from __future__ import annotations

import re

from sqlalchemy import select

from app.accounts import create_operator
from app.models import AuditRecord, OperationalEvent
from tests.support.publish import contract_and_partner, make_endpoint

EMAIL, PASSWORD = "ops@example.com", "correct horse battery"


def _trail(runtime, subject_id: str) -> list[tuple[str, str]]:
    with runtime.db.begin() as session:
        return [
            tuple(r)
            for r in session.execute(
                select(AuditRecord.action, AuditRecord.actor)
                .where(AuditRecord.subject_id == subject_id)
                .order_by(AuditRecord.id)
            )
        ]


def test_api_changes_are_audited_as_the_key(client, auth, runtime):
    contract_and_partner(client, auth)
    ep = make_endpoint(client, auth)["id"]
    base = f"/v1/partners/acme/endpoints/{ep}"
    assert client.patch(base, headers=auth, json={"timeout_s": 5}).status_code == 200
    assert client.post(f"{base}/disable", headers=auth, json={"reason": "x"}).status_code == 200
    assert client.post(f"{base}/enable", headers=auth).status_code == 200
    assert client.post(f"{base}/secret/rotate", headers=auth).status_code == 200
    assert client.delete(base, headers=auth).status_code == 204
    actor = "key:test-admin"
    assert _trail(runtime, ep) == [
        ("endpoint.created", actor),
        ("endpoint.updated", actor),
        ("endpoint.disabled", actor),
        ("endpoint.enabled", actor),
        ("endpoint.secret_rotated", actor),
        ("endpoint.deleted", actor),
    ]
    # The same operational events as when an operator does it: an enable remembers when the
    # endpoint had been disabled, so the letters parked meanwhile can be found again.
    with runtime.db.begin() as session:
        kinds = session.execute(
            select(OperationalEvent.kind, OperationalEvent.data)
            .where(OperationalEvent.subject_id == ep)
            .order_by(OperationalEvent.id)
        ).all()
    # A rotation is in the endpoint's history too: when the receiver must have the new secret.
    assert [k for k, _ in kinds] == [
        "endpoint.disabled",
        "endpoint.enabled",
        "endpoint.secret_rotated",
    ]
    assert kinds[1][1]["was_disabled_at"] and kinds[1][1]["actor"] == actor
    listed = client.get(f"/v1/audit?subject={ep}", headers=auth).get_json()["data"]
    assert [r["action"] for r in listed][0] == "endpoint.deleted"  # newest first


def test_the_ui_and_the_api_write_the_same_audit_rows(client, auth, runtime):
    contract_and_partner(client, auth)
    ep = make_endpoint(client, auth)["id"]
    with runtime.db.begin() as session:
        create_operator(session, EMAIL, PASSWORD)
    token_re = re.compile(r'name="csrf_token" value="([^"]+)"')
    login_page = client.get("/ui/login").text
    client.post(
        "/ui/login",
        data={
            "email": EMAIL,
            "password": PASSWORD,
            "csrf_token": token_re.search(login_page).group(1),
        },
    )
    page = f"/ui/endpoints/{ep}"
    csrf = token_re.search(client.get(page).text).group(1)
    client.post(f"{page}/disable", data={"csrf_token": csrf, "reason": "maintenance"})
    client.post(f"{page}/enable", data={"csrf_token": csrf})
    client.post(f"{page}/rotate-secret", data={"csrf_token": csrf})
    actor = f"operator:{EMAIL}"
    assert _trail(runtime, ep)[1:] == [
        ("endpoint.disabled", actor),
        ("endpoint.enabled", actor),
        ("endpoint.secret_rotated", actor),
    ]


def test_partners_and_contracts_are_audited_too(client, auth, runtime):
    contract_and_partner(client, auth)
    with runtime.db.begin() as session:
        actions = session.scalars(select(AuditRecord.action).order_by(AuditRecord.id)).all()
    assert actions == ["event_type.registered", "partner.created"]
