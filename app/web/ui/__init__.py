"""The operator UI: server-rendered pages under /ui behind an operator login.

`base` holds the blueprint and what every page shares; each other module is one resource's
pages (`session` is signing in and out). Pages parse the form, call the services as
`operator:<email>`, and render; every state change is a POST answered by a redirect to a page
that is safe to reload.
"""

from __future__ import annotations

from flask import Flask

# Each module adds its routes to the blueprint when imported.
from app.web.ui import (  # noqa: F401
    contracts,
    dashboard,
    dead_letters,
    deliveries,
    endpoints,
    events,
    inbound,
    operational,
    partners,
    security,
    session,
    storage,
)
from app.web.ui.base import blueprint


def register(app: Flask) -> None:
    """Mount the UI on `app`, with its session cookie signed by a key derived for it."""
    security.configure(app, app.extensions["kurir"])
    app.register_blueprint(blueprint)
