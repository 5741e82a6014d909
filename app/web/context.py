"""Access to the process Runtime from inside a request."""

from __future__ import annotations

from flask import current_app

from app.runtime import Runtime


def runtime() -> Runtime:
    return current_app.extensions["kurir"]
