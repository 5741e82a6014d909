"""Absolute links Kurir hands out (portal magic links), from KURIR_PUBLIC_URL or the request."""

from __future__ import annotations

from flask import request, url_for

from app.web.context import runtime


def base_url() -> str:
    """Kurir's address as partners reach it: KURIR_PUBLIC_URL, else the request's own root
    (behind believed proxies, the address the client used)."""
    return runtime().settings.public_url or request.host_url.rstrip("/")


def portal_url(token: str) -> str:
    """The magic link for a portal token."""
    return base_url() + url_for("portal.enter", token=token)
