"""The partner portal: server-rendered pages under /portal for one partner, opened by a
one-time magic link (see app.services.portal and docs/portal.md)."""

from __future__ import annotations

from flask import Flask

from app.web.portal.views import blueprint


def register(app: Flask) -> None:
    """Mount the portal (its cookie is configured with the UI's, in app.web.sessions)."""
    app.register_blueprint(blueprint)
