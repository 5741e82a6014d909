"""Ed25519 (`v1a`) endpoints end to end: real deliveries from the real engine to a real
receiver, verified with `cryptography`'s Ed25519 (nothing of Kurir's signer) and the public key
the API gives; a rotation's two signatures; a switch of kind by rotation; the private key kept
encrypted and never shown; the portal's and the operator UI's pages."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest
from alembic import command
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import inspect, select, text
from standardwebhooks.webhooks import Webhook

from app import migrate
from app.accounts import create_operator
from app.db import Database
from app.models import AuditRecord, Delivery, EndpointSecret
from app.signing import sign
from tests.support.factories import Received, Receiver, WorkerThread, wait_for
from tests.support.publish import error_of, make_event_type, make_partner, order

BASE = "/v1/partners/acme/endpoints"
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def _verifies(public_key: str, entry: str, received: Received) -> bool:
    """The receiver's check: the whpk_ key's 32 bytes, the signed `{id}.{timestamp}.{body}`."""
    version, _, encoded = entry.partition(",")
    if version != "v1a":
        return False
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key.removeprefix("whpk_")))
    signed = (
        f"{received.headers['webhook-id']}.{received.headers['webhook-timestamp']}.".encode()
        + received.body
    )
    try:
        key.verify(base64.b64decode(encoded, validate=True), signed)
    except InvalidSignature:
        return False
    return True


def _entries(received: Received) -> list[str]:
    return received.headers["webhook-signature"].split(" ")


def _delivered(runtime: Any, receiver: Receiver, ids: list[str]) -> list[Received]:
    """Run the worker until every delivery in `ids` succeeded; what the receiver got."""

    def done() -> bool:
        with runtime.db.begin() as session:
            states = [session.get_one(Delivery, i).state for i in ids]
        assert "dead" not in states and "retrying" not in states, states
        return all(s == "succeeded" for s in states)

    with WorkerThread(runtime):
        wait_for(done, timeout_s=30, message="the deliveries to succeed")
    return receiver.requests


def _test_event(client: Any, auth: dict[str, str], endpoint_id: str) -> str:
    sent = client.post(f"{BASE}/{endpoint_id}/test", headers=auth)
    assert sent.status_code == 202, sent.get_json()
    return str(sent.get_json()["id"])


@pytest.fixture
def acme(client, auth) -> None:
    make_event_type(client, auth, "order.created")
    make_partner(client, auth, "acme")


def test_deliveries_verify_with_the_public_key_the_api_gives(client, auth, runtime, acme):
    with Receiver() as receiver:
        created = client.post(
            BASE, headers=auth, json={"url": receiver.url + "/h", "signature": "ed25519"}
        )
        assert created.status_code == 201, created.get_json()
        ep = created.get_json()
        assert ep["signature"] == "ed25519" and "secret" not in ep
        public_key = ep["public_key"]
        assert public_key.startswith("whpk_")
        assert len(base64.b64decode(public_key.removeprefix("whpk_"), validate=True)) == 32
        [only] = ep["public_keys"]
        assert (only["public_key"], only["expires_at"]) == (public_key, None)
        read = client.get(f"{BASE}/{ep['id']}", headers=auth).get_json()
        assert read["public_key"] == public_key and read["signature"] == "ed25519"

        published = client.post("/v1/partners/acme/events", headers=auth, json=order())
        assert published.status_code == 202, published.get_json()
        [delivery] = published.get_json()["deliveries"]
        [received] = _delivered(runtime, receiver, [delivery["id"]])
    [entry] = _entries(received)
    assert entry.startswith("v1a,")
    assert _verifies(public_key, entry, received)
    tampered = Received(received.path, received.headers, received.body + b" ", received.at)
    assert not _verifies(public_key, entry, tampered)
    assert json.loads(received.body)["type"] == "order.created"


def test_the_api_refuses_what_an_ed25519_endpoint_cannot_do(client, auth, runtime, acme):
    mine = "whsec_" + base64.b64encode(b"k" * 32).decode()
    refused = client.post(
        BASE,
        headers=auth,
        json={"url": "http://127.0.0.1:9/h", "signature": "ed25519", "secret": mine},
    )
    assert refused.status_code == 422
    assert error_of(refused)["code"] == "secret_not_allowed"
    unknown = client.post(
        BASE, headers=auth, json={"url": "http://127.0.0.1:9/h", "signature": "rsa"}
    )
    assert unknown.status_code == 422 and error_of(unknown)["details"]["field"] == "signature"

    ep = client.post(
        BASE, headers=auth, json={"url": "http://127.0.0.1:9/h", "signature": "ed25519"}
    ).get_json()
    secret = client.get(f"{BASE}/{ep['id']}/secret", headers=auth)
    assert secret.status_code == 409
    assert error_of(secret)["code"] == "no_shared_secret"
    assert error_of(secret)["details"]["public_key"] == ep["public_key"]

    switched = client.patch(f"{BASE}/{ep['id']}", headers=auth, json={"signature": "hmac"})
    assert switched.status_code == 422
    assert error_of(switched)["code"] == "signature_changes_by_rotation"
    same = client.patch(
        f"{BASE}/{ep['id']}", headers=auth, json={"signature": "ed25519", "timeout_s": 5}
    )
    assert same.status_code == 200 and same.get_json()["timeout_s"] == 5

    given = client.post(f"{BASE}/{ep['id']}/secret/rotate", headers=auth, json={"secret": mine})
    assert given.status_code == 422 and error_of(given)["code"] == "secret_not_allowed"
    after = client.get(f"{BASE}/{ep['id']}", headers=auth).get_json()
    assert after["public_keys"] == ep["public_keys"]  # nothing rotated


def test_a_rotation_signs_with_both_keys_each_verifying_with_its_own(client, auth, runtime, acme):
    with Receiver() as receiver:
        ep = client.post(
            BASE, headers=auth, json={"url": receiver.url + "/h", "signature": "ed25519"}
        ).get_json()
        old = ep["public_key"]
        rotated = client.post(f"{BASE}/{ep['id']}/secret/rotate", headers=auth)
        assert rotated.status_code == 200, rotated.get_json()
        answer = rotated.get_json()
        new = answer["public_key"]
        assert new != old and new.startswith("whpk_") and "secret" not in answer
        assert [k["public_key"] for k in answer["public_keys"]] == [new, old]
        assert answer["public_keys"][0]["expires_at"] is None
        assert answer["public_keys"][1]["expires_at"] is not None  # the overlap's end
        [received] = _delivered(runtime, receiver, [_test_event(client, auth, ep["id"])])
    first, second = _entries(received)
    assert _verifies(new, first, received) and _verifies(old, second, received)
    assert not _verifies(old, first, received) and not _verifies(new, second, received)


def test_the_kind_switches_by_a_rotation_with_both_signing_during_the_overlap(
    client, auth, runtime, acme
):
    with Receiver() as receiver:
        ep = client.post(BASE, headers=auth, json={"url": receiver.url + "/h"}).get_json()
        secret = ep["secret"]
        switched = client.post(
            f"{BASE}/{ep['id']}/secret/rotate", headers=auth, json={"signature": "ed25519"}
        ).get_json()
        assert switched["signature"] == "ed25519" and "secret" not in switched
        public_key = switched["public_key"]
        [received] = _delivered(runtime, receiver, [_test_event(client, auth, ep["id"])])
        v1a, v1 = _entries(received)
        assert _verifies(public_key, v1a, received) and v1.startswith("v1,")
        headers = {k: received.headers[k] for k in ("webhook-id", "webhook-timestamp")}
        # A Standard Webhooks library that knows only v1 still verifies (it skips v1a).
        Webhook(secret).verify(
            received.body, {**headers, "webhook-signature": received.headers["webhook-signature"]}
        )

        back = client.post(
            f"{BASE}/{ep['id']}/secret/rotate", headers=auth, json={"signature": "hmac"}
        ).get_json()
        assert back["signature"] == "hmac" and back["secret"].startswith("whsec_")
        assert back["public_key"] is None
    with runtime.db.begin() as session:
        details = [
            r.details
            for r in session.scalars(
                select(AuditRecord).where(
                    AuditRecord.subject_id == ep["id"],
                    AuditRecord.action == "endpoint.secret_rotated",
                )
            )
        ]
    assert [(d["signature"], d.get("was_signature")) for d in details] == [
        ("ed25519", "hmac"),
        ("hmac", "ed25519"),
    ]


def test_the_private_key_is_kept_encrypted_and_shown_nowhere(client, auth, runtime, acme):
    ep = client.post(
        BASE, headers=auth, json={"url": "http://127.0.0.1:9/h", "signature": "ed25519"}
    ).get_json()
    with runtime.db.begin() as session:
        [row] = session.scalars(
            select(EndpointSecret).where(EndpointSecret.endpoint_id == ep["id"])
        )
        stored, public = row.secret_encrypted, row.public_key
        private = runtime.secret_box.decrypt(stored)
        audit = [
            json.dumps(r.details)
            for r in session.scalars(select(AuditRecord).where(AuditRecord.subject_id == ep["id"]))
        ]
    assert private.startswith("whsk_") and public == ep["public_key"]
    seed = private.removeprefix("whsk_")
    assert "whsk_" not in stored and seed not in stored
    token = base64.urlsafe_b64decode(stored)  # a Fernet token: the key inside is ciphertext
    assert private.encode() not in token and base64.b64decode(seed) not in token
    # The public key is the private one's: a signature by the stored key verifies with it.
    signed = sign([private], "evt_x", 1700000000, b"{}")
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public.removeprefix("whpk_")))
    key.verify(base64.b64decode(signed.removeprefix("v1a,")), b"evt_x.1700000000.{}")
    answers = json.dumps(
        [
            client.get(f"{BASE}/{ep['id']}", headers=auth).get_json(),
            client.get(BASE, headers=auth).get_json(),
        ]
    )
    assert seed not in answers and "whsk_" not in answers and seed not in "".join(audit)


# ---------------------------------------------------------------------------- the pages


def _csrf(client: Any, path: str) -> str:
    match = _CSRF.search(client.get(path).text)
    assert match, f"no CSRF token on {path}"
    return match.group(1)


@pytest.fixture
def portal(app, client, auth, acme) -> Any:
    """The partner's browser, signed in to acme's portal."""
    link = client.post("/v1/partners/acme/portal-links", headers=auth).get_json()
    browser = app.test_client()
    path = "/" + link["url"].split("/", 3)[3]
    browser.get(path)
    assert browser.post(path).status_code == 302
    return browser


def test_a_partner_chooses_ed25519_in_the_portal_and_sees_its_public_key(
    portal, client, auth, runtime
):
    form = portal.get("/portal/endpoints/new").text
    assert 'name="signature" value="ed25519"' in form
    created = portal.post(
        "/portal/endpoints/new",
        data={
            "csrf_token": _csrf(portal, "/portal/endpoints/new"),
            "url": "http://127.0.0.1:9/new",
            "signature": "ed25519",
            "all_types": "1",
            "timeout_s": "15",
        },
    )
    assert created.status_code == 302, created.text
    endpoint_id = created.headers["Location"].rsplit("/", 1)[1]
    public_key = client.get(f"{BASE}/{endpoint_id}", headers=auth).get_json()["public_key"]
    assert public_key and public_key.startswith("whpk_")

    page = portal.get(f"/portal/endpoints/{endpoint_id}").text
    assert "Ed25519" in page and public_key in page
    secret_page = portal.get(f"/portal/endpoints/{endpoint_id}/secret").text
    assert f'data-testid="public-key">{public_key}<' in secret_page
    assert "Reveal" not in secret_page and "whsec_" not in secret_page
    guide = portal.get(f"/portal/verify?endpoint={endpoint_id}").text
    assert 'data-testid="public-key-hint"' in guide and guide.count(public_key) >= 4
    assert "v1a" in guide and "crypto/ed25519" in guide
    refused = portal.post(
        f"/portal/endpoints/{endpoint_id}/secret/reveal",
        data={"csrf_token": _csrf(portal, f"/portal/endpoints/{endpoint_id}/secret")},
    )
    assert refused.status_code == 302  # back to the page, with the reason; nothing revealed

    rotated = portal.post(
        f"/portal/endpoints/{endpoint_id}/secret/rotate",
        data={"csrf_token": _csrf(portal, f"/portal/endpoints/{endpoint_id}/secret")},
    )
    assert rotated.status_code == 302
    after = client.get(f"{BASE}/{endpoint_id}", headers=auth).get_json()
    assert after["public_key"] != public_key
    overlap = portal.get(f"/portal/endpoints/{endpoint_id}/secret").text
    assert 'data-testid="overlap"' in overlap and public_key in overlap


def test_a_partner_switches_an_hmac_endpoint_to_ed25519_from_the_portal(portal, client, auth):
    ep = client.post(BASE, headers=auth, json={"url": "http://127.0.0.1:9/h"}).get_json()
    page = f"/portal/endpoints/{ep['id']}/secret"
    assert 'data-testid="switch-signature"' in portal.get(page).text
    switched = portal.post(
        f"{page}/rotate", data={"csrf_token": _csrf(portal, page), "signature": "ed25519"}
    )
    assert switched.status_code == 302
    after = client.get(f"{BASE}/{ep['id']}", headers=auth).get_json()
    assert after["signature"] == "ed25519" and after["public_key"] in portal.get(page).text


def test_the_operator_pages_show_the_kind_and_public_key(client, auth, runtime, acme):
    with runtime.db.begin() as session:
        create_operator(session, "ops@example.com", "correct horse battery staple")
    login = client.post(
        "/ui/login",
        data={
            "email": "ops@example.com",
            "password": "correct horse battery staple",
            "csrf_token": _csrf(client, "/ui/login"),
        },
    )
    assert login.status_code == 302
    ep = client.post(
        BASE, headers=auth, json={"url": "http://127.0.0.1:9/h", "signature": "ed25519"}
    ).get_json()
    hmac_ep = client.post(BASE, headers=auth, json={"url": "http://127.0.0.1:9/i"}).get_json()
    page = client.get(f"/ui/endpoints/{ep['id']}").text
    assert "Ed25519" in page and ep["public_key"] in page
    assert "HMAC" in client.get(f"/ui/endpoints/{hmac_ep['id']}").text
    keys = client.get(f"/ui/endpoints/{ep['id']}/secret")
    assert keys.status_code == 200
    assert ep["public_key"] in keys.text and 'data-testid="secret"' not in keys.text
    with runtime.db.begin() as session:
        revealed = session.scalar(
            select(AuditRecord.id).where(
                AuditRecord.subject_id == ep["id"], AuditRecord.action == "endpoint.secret_revealed"
            )
        )
    assert revealed is None  # a public key is no secret: showing it is not recorded


def test_a_downgrade_is_refused_while_an_endpoint_signs_with_ed25519(tmp_path):
    """The code before the migration would read a whsk_ key as an HMAC secret and fail
    every delivery: the downgrade says so instead, until no live endpoint signs so."""
    url = f"sqlite:///{tmp_path / 'kurir.db'}"
    migrate.upgrade(url, "0013")
    db = Database(url)
    try:
        with db.engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO partners (id, uid, name, created_at, updated_at) "
                    "VALUES ('ptn_1', 'acme', 'Acme', '2026-01-01', '2026-01-01')"
                )
            )
            connection.execute(
                text(
                    "INSERT INTO endpoints (id, partner_id, url, headers, timeout_s, state, "
                    "consecutive_failures, signature, created_at, updated_at) VALUES ('ep_1', "
                    "'ptn_1', 'https://x.example', '{}', 5, 'enabled', 0, 'ed25519', "
                    "'2026-01-01', '2026-01-01')"
                )
            )
        with pytest.raises(RuntimeError, match="sign with Ed25519"):
            command.downgrade(migrate.alembic_config(url), "-1")
        with db.engine.begin() as connection:
            connection.execute(text("UPDATE endpoints SET deleted_at = '2026-01-02'"))
        command.downgrade(migrate.alembic_config(url), "-1")
        columns = {c["name"] for c in inspect(db.engine).get_columns("endpoints")}
        assert "signature" not in columns
    finally:
        db.dispose()
