"""The Flask faces of Kurir: the REST API, the operator UI, the partner portal, the inbound
receiver, health probes and metrics, in one application."""

from __future__ import annotations

from flask import Flask

from app.config import Settings, load_settings
from app.runtime import Runtime
from app.web import errors, health, inbound, metrics, portal, proxy, ui
from app.web.api import register_api
from app.web.keepalive import UnreadBodyGuard


def create_app(settings: Settings | None = None, *, runtime: Runtime | None = None) -> Flask:
    """Build the WSGI app; `settings` defaults to the environment, `runtime` to fresh handles."""
    if runtime is None:
        runtime = Runtime(settings or load_settings())
    settings = runtime.settings
    app = Flask(__name__, template_folder="templates", static_folder="static")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_payload_bytes
    app.config["JSON_SORT_KEYS"] = False
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions["kurir"] = runtime
    errors.register(app)
    app.register_blueprint(health.blueprint)
    app.register_blueprint(inbound.blueprint)
    register_api(app)
    ui.register(app)
    portal.register(app)
    app.register_blueprint(metrics.blueprint)
    metrics.warn_if_open(app)
    app.wsgi_app = UnreadBodyGuard(app.wsgi_app)  # type: ignore[method-assign]
    app.wsgi_app = proxy.wrap(app.wsgi_app, settings.trusted_proxies)  # type: ignore[method-assign]
    return app
