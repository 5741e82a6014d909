"""Error format, authentication, scopes and readiness of the Flask app."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from flask import Flask, jsonify

from app.cli import cli
from app.config import Settings
from app.runtime import Runtime
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
    env = {"DATABASE_URL": settings.database_url, "KURIR_DATA_DIR": str(settings.data_dir),
           "KURIR_SECRET_KEY": settings.secret_key}
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
    denied = client.post("/v1/_probe/echo", json={"a": 1},
                         headers={"Authorization": f"Bearer {reader}"})
    assert denied.status_code == 403
    assert _error(denied)["details"]["required_scope"] == "events:write"
    allowed = client.post("/v1/_probe/echo", json={"a": 1},
                          headers={"Authorization": f"Bearer {writer}"})
    assert allowed.status_code == 200 and allowed.get_json() == {"a": 1}


def test_unknown_scope_is_refused_by_cli(settings, runtime):
    env = {"DATABASE_URL": settings.database_url, "KURIR_DATA_DIR": str(settings.data_dir),
           "KURIR_SECRET_KEY": settings.secret_key}
    result = CliRunner().invoke(cli, ["keys", "create", "--name", "x", "--scope", "root"],
                                env=env)
    assert result.exit_code != 0


def test_error_format_for_every_kind(probe_app, auth):
    client = probe_app.test_client()
    assert _error(client.get("/nowhere"))["code"] == "not_found"
    assert client.get("/nowhere").status_code == 404
    response = client.delete("/healthz")
    assert response.status_code == 405 and _error(response)["code"] == "method_not_allowed"
    bad_json = client.post("/v1/_probe/echo", data=b"{nope",
                           headers={**auth, "Content-Type": "application/json"})
    assert bad_json.status_code == 400 and _error(bad_json)["code"] == "invalid_json"
    not_object = client.post("/v1/_probe/echo", data=b"[1]",
                             headers={**auth, "Content-Type": "application/json"})
    assert not_object.status_code == 400
    wrong_type = client.post("/v1/_probe/echo", data=b"a=1",
                             headers={**auth, "Content-Type": "text/plain"})
    assert wrong_type.status_code == 415
    assert _error(wrong_type)["code"] == "unsupported_media_type"
    big = client.post("/v1/_probe/echo", data=b"x" * (256 * 1024 + 1),
                      headers={**auth, "Content-Type": "application/json"})
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

    dead = settings.with_overrides(
        database_url=f"postgresql://nobody@127.0.0.1:{free_port()}/none")
    app = create_app(dead)
    response = app.test_client().get("/readyz")
    assert response.status_code == 503
    assert response.get_json()["error"]["details"]["failed"] == ["database"]


def test_operator_created_from_stdin_can_be_verified(settings, runtime):
    from app.accounts import verify_operator

    env = {"DATABASE_URL": settings.database_url, "KURIR_DATA_DIR": str(settings.data_dir),
           "KURIR_SECRET_KEY": settings.secret_key}
    result = CliRunner().invoke(cli, ["operators", "create", "--email", "Ops@Example.com"],
                                input="correct horse battery\n", env=env)
    assert result.exit_code == 0, result.output
    with runtime.db.begin() as session:
        assert verify_operator(session, "ops@example.com", "correct horse battery") is not None
        assert verify_operator(session, "ops@example.com", "wrong password") is None
    again = CliRunner().invoke(cli, ["operators", "create", "--email", "ops@example.com"],
                               input="another password\n", env=env)
    assert again.exit_code != 0 and "already exists" in again.output
