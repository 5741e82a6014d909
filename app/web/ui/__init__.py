"""The operator UI: server-rendered pages under /ui behind an operator login (SPEC §8)."""

from __future__ import annotations

from flask import Flask

from app.web.ui import security
from app.web.ui.views import blueprint


def register(app: Flask) -> None:
    """Mount the UI on `app`, with its session cookie signed by a key derived for it."""
    security.configure(app, app.extensions["kurir"])
    app.register_blueprint(blueprint)
