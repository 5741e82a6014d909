"""The `/v1` REST API: one blueprint per resource family, all registered here."""

from __future__ import annotations

from flask import Flask

from app.web import openapi
from app.web.api import (
    dead_letters,
    deliveries,
    event_types,
    events,
    inbound_events,
    keys,
    partners,
    sources,
)


def register_api(app: Flask) -> None:
    for module in (keys, event_types, partners, events, deliveries, dead_letters, sources,
                   inbound_events):
        app.register_blueprint(module.blueprint, url_prefix="/v1")
    app.register_blueprint(openapi.blueprint)
