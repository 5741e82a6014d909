"""The operator UI: server-rendered pages under /ui behind an operator login."""

from __future__ import annotations

from flask import Flask

from app.web.ui import deliveries, partners, security  # noqa: F401 - their routes join the UI
from app.web.ui.views import blueprint


def register(app: Flask) -> None:
    """Mount the UI on `app`, with its session cookie signed by a key derived for it."""
    security.configure(app, app.extensions["kurir"])
    app.register_blueprint(blueprint)
