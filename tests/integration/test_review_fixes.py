"""The holes a code review found, each closed and held shut: handlers named over HTTP,
credentials shown to readers, keys that could not be revoked, the master key, and bound values
in logs."""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from app.accounts import create_api_key
from app.cli import cli
from app.crypto import SecretBox, _legacy
from app.inbound import process, receive
from app.models import ApiKey, Attempt, AuditRecord, EndpointSecret, InboundEvent
from app.runtime import Runtime
from app.services import keys
from app.web import create_app
from app.web.auth import clear_cache
from tests.support import inbound as kit
from tests.support.factories import Receiver, WorkerThread, wait_for
from tests.support.publish import contract_and_partner, make_endpoint, order

HERE = __name__
_ran: list[str] = []


def record_handler(ctx: Any) -> None:
    _ran.append(ctx.event.event_id)


def _token(runtime: Runtime, name: str, *scopes: str) -> dict[str, str]:
    with runtime.db.begin() as session:
        _, token = create_api_key(session, name, scopes)
    return {"Authorization": f"Bearer {token}"}


def _env(settings: Any) -> dict[str, str]:
    return {"DATABASE_URL": settings.database_url, "REDIS_URL": settings.redis_url,
            "KURIR_DATA_DIR": str(settings.data_dir), "KURIR_SECRET_KEY": settings.secret_key}


# ---------------------------------------------------------------------------- handlers


def test_an_api_key_cannot_name_code_for_the_worker_to_run(client, auth, tmp_path,
                                                           monkeypatch):
    """Handlers are code: over HTTP a source selects registered names only. A module path
    is refused with 422 and never imported (this module would write a file if it were)."""
    planted = tmp_path / "planted"
    planted.mkdir()
    marker = tmp_path / "imported"
    (planted / "kurir_planted_module.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\ndef run(ctx):\n    pass\n")
    monkeypatch.syspath_prepend(str(planted))
    for handlers in (["kurir_planted_module:run"], [{"path": "kurir_planted_module:run"}],
                     ["os:system"], [{"event_type": "*", "handler": "os:system"}]):
        response = client.post("/v1/sources", headers=auth, json={
            "name": "psp", "scheme": "standard-webhooks",
            "secret": kit.SECRETS["standard-webhooks"], "handlers": handlers})
        assert response.status_code == 422, handlers
        assert response.get_json()["error"]["code"] == "unknown_handler"
    assert not marker.exists()
    assert "kurir_planted_module" not in sys.modules
    assert client.get("/v1/sources", headers=auth).get_json()["data"] == []


def test_a_source_selects_a_handler_the_operator_registered_by_name(settings, migrated,
                                                                    redis_client):
    registered = settings.with_overrides(
        inbound_handlers=(("record", f"{HERE}:record_handler"),))
    rt = Runtime(registered, database=migrated.db)
    from app import runtime as runtime_mod

    runtime_mod.install(rt)
    try:
        clear_cache()
        client = create_app(runtime=rt).test_client()
        admin = _token(rt, "admin", "admin")
        listed = client.get("/v1/inbound-handlers", headers=admin).get_json()["data"]
        assert listed == [{"name": "record", "path": f"{HERE}:record_handler"}]
        created = client.post("/v1/sources", headers=admin, json={
            "name": "psp", "scheme": "standard-webhooks",
            "secret": kit.SECRETS["standard-webhooks"],
            "handlers": [{"event_type": "payment.*", "handler": "record"}]})
        assert created.status_code == 201, created.get_json()
        assert created.get_json()["handlers"] == [
            {"event_type": "payment.*", "handler": "record", "side_effect_only": False}]
        _ran.clear()
        body, headers = kit.signed_callback("standard-webhooks", event_id="e-1",
                                            resource_id="pay_1", version=1, status="paid")
        receipt = receive.receive(rt, "psp", headers, body)

        assert process.process_event(receipt.inbound_event_id) == "applied"
        assert _ran == ["e-1"]
    finally:
        rt.close()
        runtime_mod.install(None)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- credentials


def test_header_values_are_write_only_and_never_stored_with_attempts(client, auth, runtime):
    contract_and_partner(client, auth)
    reader = _token(runtime, "reader", "read")
    with Receiver() as receiver, WorkerThread(runtime):
        created = make_endpoint(client, auth, url=f"{receiver.url}/hook", headers={
            "Authorization": "Bearer s3cr3t-value", "X-Tenant": "acme-eu"},
            public_headers=["X-Tenant"])
        path = f"/v1/partners/acme/endpoints/{created['id']}"
        for answer in (client.get(path, headers=reader),
                       client.get("/v1/partners/acme/endpoints", headers=reader),
                       client.patch(path, headers=auth, json={"description": "eu"})):
            assert answer.status_code == 200
            assert "s3cr3t-value" not in answer.text
        shown = client.get(path, headers=reader).get_json()
        assert shown["headers"] == {"Authorization": None, "X-Tenant": "acme-eu"}
        # A reader's copy sent back (null) keeps the stored value; the partner still gets it.
        changed = client.patch(path, headers=auth, json={
            "headers": {**shown["headers"], "X-Region": "eu"},
            "public_headers": ["X-Tenant", "X-Region"]})
        assert changed.status_code == 200, changed.get_json()
        event = client.post("/v1/partners/acme/events", headers=auth, json=order()).get_json()
        wait_for(lambda: receiver.on("/hook"), message="the webhook")
        sent = receiver.on("/hook")[0].headers
        assert (sent["authorization"], sent["x-tenant"], sent["x-region"]) == (
            "Bearer s3cr3t-value", "acme-eu", "eu")
        wait_for(lambda: _attempts(runtime), message="the attempt record")
    (attempt,) = _attempts(runtime)
    assert attempt.request_headers["Authorization"] == "[redacted]"
    assert attempt.request_headers["X-Tenant"] == "acme-eu"
    detail = client.get(f"/v1/events/{event['id']}", headers=reader)
    assert "s3cr3t-value" not in detail.text


def _attempts(runtime: Runtime) -> list[Attempt]:
    with runtime.db.begin() as session:
        rows = list(session.scalars(select(Attempt)))
        session.expunge_all()
        return rows


@pytest.mark.parametrize("url", ["https://user:pass@hooks.example.com/in",
                                 "https://token@hooks.example.com/in"])
def test_a_password_in_the_url_is_refused_at_create_and_change(client, auth, url):
    contract_and_partner(client, auth)
    response = client.post("/v1/partners/acme/endpoints", headers=auth, json={"url": url})
    assert response.status_code == 422
    error = response.get_json()["error"]
    assert error["code"] == "invalid_url" and error["details"]["reason"] == "userinfo"
    assert "header" in error["message"]
    ep = make_endpoint(client, auth, url="https://hooks.example.com/in")
    changed = client.patch(f"/v1/partners/acme/endpoints/{ep['id']}", headers=auth,
                           json={"url": url})
    assert changed.status_code == 422


def test_inbound_callbacks_are_stored_without_credentials_or_signatures(client, auth, runtime):
    kit.create_source(runtime, "psp", "standard-webhooks")
    body, headers = kit.signed_callback("standard-webhooks", event_id="e-1",
                                        resource_id="pay_1", version=1)
    headers += [("Authorization", "Bearer partner-token"),
                ("Proxy-Authorization", "Basic cHJveHk="), ("X-Request-Id", "r-1")]
    response = client.post("/inbound/psp", data=body, headers=headers)
    assert response.status_code == 202, response.get_json()
    detail = client.get(f"/v1/inbound-events/{response.get_json()['id']}", headers=auth)
    stored = detail.get_json()["headers"]
    assert stored["authorization"] == stored["proxy-authorization"] == "[redacted]"
    assert stored["webhook-signature"] == "[redacted]"
    assert stored["x-request-id"] == "r-1" and stored["webhook-id"] == "e-1"
    assert "partner-token" not in detail.text and "cHJveHk=" not in detail.text
    with runtime.db.begin() as session:
        raw = session.scalar(select(InboundEvent.headers))
    assert "partner-token" not in str(raw)


# ---------------------------------------------------------------------------- keys


def test_keys_are_listed_and_revoked_over_the_api_and_refused_at_once(client, auth, runtime):
    victim = _token(runtime, "billing", "events:write")
    assert client.get("/v1/me", headers=victim).status_code == 200
    listed = client.get("/v1/keys", headers=auth).get_json()["data"]
    (row,) = [k for k in listed if k["name"] == "billing"]
    assert set(row) == {"id", "name", "prefix", "scopes", "partner", "created_at",
                        "last_used_at", "revoked_at"}
    assert row["last_used_at"] is not None and row["revoked_at"] is None
    assert victim["Authorization"].split()[1] not in client.get("/v1/keys", headers=auth).text
    assert client.get("/v1/keys", headers=victim).status_code == 403
    revoked = client.delete(f"/v1/keys/{row['id']}", headers=auth)
    assert revoked.status_code == 200 and revoked.get_json()["revoked_at"]
    assert client.get("/v1/me", headers=victim).status_code == 401
    with runtime.db.begin() as session:
        actions = session.scalars(select(AuditRecord.action).where(
            AuditRecord.subject_id == row["id"])).all()
    assert actions == ["key.revoked"]


def test_a_key_revoked_by_another_process_is_refused_within_the_cache_ttl(runtime,
                                                                          monkeypatch):
    """The cache spares a query per request; it may not outlive a revocation by more than
    CACHE_TTL_S (a second), even when the revocation happened in another process."""
    assert keys.CACHE_TTL_S <= 1.0
    now = [1000.0]
    monkeypatch.setattr(keys, "_clock", lambda: now[0])
    keys.forget()
    with runtime.db.begin() as session:
        key, token = create_api_key(session, "svc", ["read"])
        key_id = key.id
    assert keys.authenticate(runtime, token) is not None  # cached now
    with runtime.db.begin() as session:  # what `kurir keys revoke` does, elsewhere
        session.get_one(ApiKey, key_id).revoked_at = session.get_one(ApiKey, key_id).created_at
    now[0] += keys.CACHE_TTL_S
    assert keys.authenticate(runtime, token) is None


def test_last_used_is_written_at_most_once_a_minute(runtime, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(keys, "_clock", lambda: now[0])
    keys.forget()
    with runtime.db.begin() as session:
        key, token = create_api_key(session, "svc", ["read"])
        key_id = key.id
    keys.authenticate(runtime, token)
    with runtime.db.begin() as session:
        first = session.get_one(ApiKey, key_id).last_used_at
    assert first is not None
    now[0] += 10 * keys.CACHE_TTL_S  # the cache expired: the key is read again
    keys.authenticate(runtime, token)
    with runtime.db.begin() as session:
        assert session.get_one(ApiKey, key_id).last_used_at == first


def test_cli_lists_and_revokes_keys_and_warns_when_it_grants_admin(settings, runtime):
    runner = CliRunner()
    made = runner.invoke(cli, ["keys", "create", "--name", "ops"], env=_env(settings))
    assert made.exit_code == 0
    assert "no --scope given: the key gets admin" in made.stderr
    scoped = runner.invoke(cli, ["keys", "create", "--name", "ro", "--scope", "read"],
                           env=_env(settings))
    assert scoped.exit_code == 0 and "admin" not in scoped.stderr
    token = scoped.stdout.strip().splitlines()[-1]
    listed = runner.invoke(cli, ["keys", "ls"], env=_env(settings))
    assert listed.exit_code == 0 and "ops" in listed.stdout and "ro" in listed.stdout
    assert token not in listed.stdout
    with runtime.db.begin() as session:
        key_id = session.scalar(select(ApiKey.id).where(ApiKey.name == "ro"))
    revoked = runner.invoke(cli, ["keys", "revoke", key_id], env=_env(settings))
    assert revoked.exit_code == 0, revoked.output
    assert runner.invoke(cli, ["keys", "revoke", key_id], env=_env(settings)).exit_code == 1
    keys.forget()
    assert keys.authenticate(runtime, token) is None
    with runtime.db.begin() as session:
        trail = session.execute(select(AuditRecord.action, AuditRecord.actor)
                                .order_by(AuditRecord.id)).all()
    assert [a for a, _ in trail] == ["key.created", "key.created", "key.revoked"]
    assert all(actor.startswith("cli") for _, actor in trail)


# ---------------------------------------------------------------------------- the master key


def test_secrets_reencrypt_moves_every_secret_to_the_newest_key(client, auth, settings,
                                                                runtime):
    """Rotating KURIR_SECRET_KEY: new key first, re-encrypt, drop the old one. Secrets made
    under the first passphrase derivation (one SHA-256) are moved too."""
    contract_and_partner(client, auth)
    ep = make_endpoint(client, auth)
    with runtime.db.begin() as session:
        legacy_row = session.scalar(select(EndpointSecret))
        plain = runtime.secret_box.decrypt(legacy_row.secret_encrypted)
        legacy_row.secret_encrypted = _legacy(settings.secret_key).encrypt(
            plain.encode()).decode()
    new_key = "a brand new master passphrase"
    env = {**_env(settings), "KURIR_SECRET_KEY": f"{new_key},{settings.secret_key}"}
    result = CliRunner().invoke(cli, ["secrets", "reencrypt"], env=env)
    assert result.exit_code == 0, result.output
    assert "re-encrypted 1 of 1" in result.stdout
    newest_only = SecretBox([new_key])
    with runtime.db.begin() as session:
        stored = session.scalar(select(EndpointSecret.secret_encrypted))
    assert newest_only.decrypt(stored) == plain == ep["secret"]
    again = CliRunner().invoke(cli, ["secrets", "reencrypt"], env=env)
    assert "re-encrypted 0 of 1" in again.stdout


def test_a_passphrase_is_stretched_not_hashed_once():
    box = SecretBox(["correct horse battery staple"])
    token = box.encrypt("whsec_x")
    with pytest.raises(ValueError, match="cannot be decrypted"):
        SecretBox([_legacy_key_only("correct horse battery staple")]).decrypt(token)
    assert box.decrypt(_legacy("correct horse battery staple").encrypt(b"old").decode()) == "old"


def _legacy_key_only(passphrase: str) -> str:
    import base64
    import hashlib

    return base64.urlsafe_b64encode(hashlib.sha256(passphrase.encode()).digest()).decode()


# ---------------------------------------------------------------------------- logs


def test_bound_values_never_reach_logs_or_error_messages(runtime, caplog):
    """A failing statement holding a secret: SQLAlchemy used to print its parameters."""
    secret = "whsec_this-must-not-be-logged"
    with runtime.db.begin() as session:
        create_api_key(session, "svc", ["read"])
        existing = session.scalar(select(ApiKey.key_hash))
    engine_log = logging.getLogger("sqlalchemy.engine")
    caplog.set_level(logging.INFO, logger="sqlalchemy.engine")
    engine_log.setLevel(logging.INFO)
    try:
        with pytest.raises(IntegrityError) as info, runtime.db.begin() as session:
            session.execute(insert(ApiKey).values(
                id="key_dup", name=secret, prefix="x", key_hash=existing, scopes=[]))
    finally:
        engine_log.setLevel(logging.WARNING)
    assert secret not in str(info.value)
    assert secret not in caplog.text
    assert "api_keys" in str(info.value)  # the statement is still there to debug with
