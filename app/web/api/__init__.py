"""The `/v1` REST API: one blueprint per resource family, all registered here."""

from __future__ import annotations

from flask import Flask, request

from app.web import openapi
from app.web.api import (
    dead_letters,
    deliveries,
    event_types,
    events,
    feed,
    inbound_events,
    keys,
    partners,
    sources,
)
from app.web.jsonio import check_url_and_headers


def register_api(app: Flask) -> None:
    for module in (
        keys,
        event_types,
        partners,
        events,
        feed,
        deliveries,
        dead_letters,
        sources,
        inbound_events,
    ):
        app.register_blueprint(module.blueprint, url_prefix="/v1")
    app.register_blueprint(openapi.blueprint)

    @app.before_request
    def _check_url_and_headers() -> None:
        if request.path.startswith("/v1/"):
            check_url_and_headers()
