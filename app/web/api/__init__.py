"""The `/v1` REST API: one blueprint per resource family, all registered here."""

from __future__ import annotations

from flask import Flask

from app.web.api import keys


def register_api(app: Flask) -> None:
    for module in (keys,):
        app.register_blueprint(module.blueprint, url_prefix="/v1")
