"""Error format, authentication, API keys, scopes and readiness of the Flask app."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from flask import Flask, jsonify
from sqlalchemy import select

from app.accounts import create_api_key
from app.cli import cli
from app.config import Settings
from app.models import ApiKey, AuditRecord
from app.runtime import Runtime
from app.services import keys
from app.web import create_app
from app.web.auth import require_scope
from app.web.jsonio import read_json_object


def _error(response: Any) -> dict[str, Any]:
    body = response.get_json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "details"}
    return body["error"]


@pytest.fixture
def probe_app(app: Flask) -> Flask:
    """The real app plus routes that exercise the shared request machinery."""

    @app.post("/v1/_probe/echo")
    @require_scope("events:write")
    def echo() -> Any:
        return jsonify(read_json_object())

    @app.get("/v1/_probe/boom")
    @require_scope("read")
    def boom() -> Any:
        raise RuntimeError("secret internals")

    return app


def _create_key(settings: Settings, *scopes: str) -> str:
    env = {
        "DATABASE_URL": settings.database_url,
        "KURIR_DATA_DIR": str(settings.data_dir),
        "KURIR_SECRET_KEY": settings.secret_key,
    }
    args = ["keys", "create", "--name", "svc"]
    for scope in scopes:
        args += ["--scope", scope]
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    token = result.output.strip().splitlines()[-1]
    assert token.startswith("kurir_") and " " not in token
    return token


def test_key_created_by_cli_authenticates_and_is_stored_hashed(probe_app, settings, runtime):
    token = _create_key(settings)
    client = probe_app.test_client()
    response = client.get("/v1/me", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200
    assert response.get_json()["scopes"] == ["admin"]
    with runtime.db.engine.connect() as connection:
        stored = connection.exec_driver_sql("SELECT key_hash FROM api_keys").scalars().all()
    assert stored and token not in stored[0]


@pytest.mark.parametrize("header", [None, "Bearer", "Bearer kurir_wrong", "Basic abc"])
def test_missing_or_bad_key_is_401(probe_app, header):
    headers = {"Authorization": header} if header else {}
    response = probe_app.test_client().get("/v1/me", headers=headers)
    assert response.status_code == 401
    assert _error(response)["code"] == "unauthorized"


def test_missing_scope_is_403_and_granted_scope_passes(probe_app, settings):
    reader = _create_key(settings, "read")
    writer = _create_key(settings, "events:write")
    client = probe_app.test_client()
    denied = client.post(
        "/v1/_probe/echo", json={"a": 1}, headers={"Authorization": f"Bearer {reader}"}
    )
    assert denied.status_code == 403
    assert _error(denied)["details"]["required_scope"] == "events:write"
    allowed = client.post(
        "/v1/_probe/echo", json={"a": 1}, headers={"Authorization": f"Bearer {writer}"}
    )
    assert allowed.status_code == 200 and allowed.get_json() == {"a": 1}


def test_unknown_scope_is_refused_by_cli(settings, runtime):
    env = {
        "DATABASE_URL": settings.database_url,
        "KURIR_DATA_DIR": str(settings.data_dir),
        "KURIR_SECRET_KEY": settings.secret_key,
    }
    result = CliRunner().invoke(cli, ["keys", "create", "--name", "x", "--scope", "root"], env=env)
    assert result.exit_code != 0


def test_error_format_for_every_kind(probe_app, auth):
    client = probe_app.test_client()
    assert _error(client.get("/nowhere"))["code"] == "not_found"
    assert client.get("/nowhere").status_code == 404
    response = client.delete("/healthz")
    assert response.status_code == 405 and _error(response)["code"] == "method_not_allowed"
    bad_json = client.post(
        "/v1/_probe/echo", data=b"{nope", headers={**auth, "Content-Type": "application/json"}
    )
    assert bad_json.status_code == 400 and _error(bad_json)["code"] == "invalid_json"
    not_object = client.post(
        "/v1/_probe/echo", data=b"[1]", headers={**auth, "Content-Type": "application/json"}
    )
    assert not_object.status_code == 400
    wrong_type = client.post(
        "/v1/_probe/echo", data=b"a=1", headers={**auth, "Content-Type": "text/plain"}
    )
    assert wrong_type.status_code == 415
    assert _error(wrong_type)["code"] == "unsupported_media_type"
    big = client.post(
        "/v1/_probe/echo",
        data=b"x" * (256 * 1024 + 1),
        headers={**auth, "Content-Type": "application/json"},
    )
    assert big.status_code == 413 and _error(big)["code"] == "payload_too_large"
    assert _error(big)["details"] == {"limit": 256 * 1024}
    boom = client.get("/v1/_probe/boom", headers=auth)
    assert boom.status_code == 500
    assert _error(boom)["code"] == "internal_error"
    assert b"secret internals" not in boom.data and b"Traceback" not in boom.data


def test_healthz_and_readyz(client):
    assert client.get("/healthz").get_json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.get_json()["checks"] == {"database": "ok", "redis": "ok"}


def test_readyz_is_503_naming_redis_when_it_is_down(settings, migrated):
    from app.ports import free_port

    dead = settings.with_overrides(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    app = create_app(runtime=Runtime(dead, database=migrated.db))
    response = app.test_client().get("/readyz")
    assert response.status_code == 503
    body = response.get_json()
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["redis"].startswith("error")
    assert body["error"]["details"]["failed"] == ["redis"]


def test_readyz_is_503_naming_database_when_it_is_down(settings, redis_client):
    from app.ports import free_port

    dead = settings.with_overrides(database_url=f"postgresql://nobody@127.0.0.1:{free_port()}/none")
    app = create_app(dead)
    response = app.test_client().get("/readyz")
    assert response.status_code == 503
    assert response.get_json()["error"]["details"]["failed"] == ["database"]


def test_operator_created_from_stdin_can_be_verified(settings, runtime):
    from app.accounts import verify_operator

    env = {
        "DATABASE_URL": settings.database_url,
        "KURIR_DATA_DIR": str(settings.data_dir),
        "KURIR_SECRET_KEY": settings.secret_key,
    }
    result = CliRunner().invoke(
        cli,
        ["operators", "create", "--email", "Ops@Example.com"],
        input="correct horse battery\n",
        env=env,
    )
    assert result.exit_code == 0, result.output
    with runtime.db.begin() as session:
        assert verify_operator(session, "ops@example.com", "correct horse battery") is not None
        assert verify_operator(session, "ops@example.com", "wrong password") is None
    again = CliRunner().invoke(
        cli,
        ["operators", "create", "--email", "ops@example.com"],
        input="another password\n",
        env=env,
    )
    assert again.exit_code != 0 and "already exists" in again.output


# ---------------------------------------------------------------------------- keys


def _token(runtime: Runtime, name: str, *scopes: str) -> dict[str, str]:
    with runtime.db.begin() as session:
        _, token = create_api_key(session, name, scopes)
    return {"Authorization": f"Bearer {token}"}


def _env(settings: Any) -> dict[str, str]:
    return {
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": settings.redis_url,
        "KURIR_DATA_DIR": str(settings.data_dir),
        "KURIR_SECRET_KEY": settings.secret_key,
    }


def test_keys_are_listed_and_revoked_over_the_api_and_refused_at_once(client, auth, runtime):
    victim = _token(runtime, "billing", "events:write")
    assert client.get("/v1/me", headers=victim).status_code == 200
    listed = client.get("/v1/keys", headers=auth).get_json()["data"]
    (row,) = [k for k in listed if k["name"] == "billing"]
    assert set(row) == {
        "id",
        "name",
        "prefix",
        "scopes",
        "partner",
        "created_at",
        "last_used_at",
        "revoked_at",
    }
    assert row["last_used_at"] is not None and row["revoked_at"] is None
    assert victim["Authorization"].split()[1] not in client.get("/v1/keys", headers=auth).text
    assert client.get("/v1/keys", headers=victim).status_code == 403
    revoked = client.delete(f"/v1/keys/{row['id']}", headers=auth)
    assert revoked.status_code == 200 and revoked.get_json()["revoked_at"]
    assert client.get("/v1/me", headers=victim).status_code == 401
    with runtime.db.begin() as session:
        actions = session.scalars(
            select(AuditRecord.action).where(AuditRecord.subject_id == row["id"])
        ).all()
    assert actions == ["key.revoked"]


def test_a_key_revoked_by_another_process_is_refused_within_the_cache_ttl(runtime, monkeypatch):
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
    scoped = runner.invoke(
        cli, ["keys", "create", "--name", "ro", "--scope", "read"], env=_env(settings)
    )
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
        trail = session.execute(
            select(AuditRecord.action, AuditRecord.actor).order_by(AuditRecord.id)
        ).all()
    assert [a for a, _ in trail] == ["key.created", "key.created", "key.revoked"]
    assert all(actor.startswith("cli") for _, actor in trail)
