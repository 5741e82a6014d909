"""The glue `kurir api` puts between granian and the app, and the choice of server."""

from __future__ import annotations

from typing import Any

from app.cli import http_servers


def test_what_granian_copied_from_the_process_environment_is_dropped() -> None:
    process_env = {
        "KURIR_SECRET_KEY": "s3cret",
        "DATABASE_URL": "postgresql://u:p@db/kurir",
        "HTTP_PROXY": "http://proxy:3128",
        "SERVER_PORT": "8080",
    }
    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        seen.update(environ)
        return [b""]

    wrapped = http_servers.without_process_environment(app, process_env)
    # granian's environ: the process's, then the request's keys over it.
    environ = dict(process_env) | {
        "REQUEST_METHOD": "GET",
        "SERVER_PORT": "8080",  # the request's own, though equal to a variable
        "HTTP_X_TRACE": "abc",
    }
    wrapped(environ, lambda *a: None)
    assert "KURIR_SECRET_KEY" not in seen and "DATABASE_URL" not in seen
    assert "HTTP_PROXY" not in seen  # the client sent no Proxy header
    assert seen["SERVER_PORT"] == "8080" and seen["REQUEST_METHOD"] == "GET"
    assert seen["HTTP_X_TRACE"] == "abc"

    sent_proxy = dict(process_env) | {"HTTP_PROXY": "evil"}  # a client's `Proxy:` header
    seen.clear()
    wrapped(sent_proxy, lambda *a: None)
    assert seen["HTTP_PROXY"] == "evil"


def test_a_server_that_is_not_installed_is_a_clear_error(monkeypatch: Any) -> None:
    assert http_servers.missing("granian") is None
    monkeypatch.setattr(http_servers, "installed", lambda server: server != "granian")
    problem = http_servers.missing("granian")
    assert problem is not None
    assert "'granian' is not installed" in problem and "pip install granian" in problem
    assert "KURIR_HTTP_SERVER=gunicorn" in problem


def test_both_servers_are_installed() -> None:
    """Both are install dependencies: the choice never depends on what happens to be there."""
    assert http_servers.installed("gunicorn") and http_servers.installed("granian")
