"""Absolute links Kurir hands out (portal magic links), from KURIR_PUBLIC_URL.

A magic link is a credential sent to someone else: its host must be the one the publisher
chose, not whatever Host header (or, behind a believed proxy, X-Forwarded-Host) the request
that asked for it carried — an internal name or a misrouted proxy would send the partner, and
the token, elsewhere. So off loopback KURIR_PUBLIC_URL is required; on a laptop
(`localhost`, `127.0.0.1`, `::1`) the request's own address is what the partner uses too.
"""

from __future__ import annotations

from flask import request, url_for

from app.errors import Unavailable
from app.web.context import runtime
from app.web.sessions import host_is_loopback


def base_url() -> str:
    """Kurir's address as partners reach it: KURIR_PUBLIC_URL, else (on loopback only) the
    request's own root.

    Raises:
        Unavailable: 503 `public_url_required` when KURIR_PUBLIC_URL is unset and the request
            did not come in on a loopback address.
    """
    configured = runtime().settings.public_url
    if configured:
        return configured
    if host_is_loopback(request.host):
        return request.host_url.rstrip("/")
    raise Unavailable(
        "KURIR_PUBLIC_URL is not set: a portal link would take its host from this request "
        f"({request.host!r}). Set KURIR_PUBLIC_URL to the address partners reach Kurir at "
        "(e.g. https://hooks.example.com); without it, links are made only on a loopback "
        "address.",
        code="public_url_required",
        details={"setting": "KURIR_PUBLIC_URL"},
    )


def portal_url(token: str) -> str:
    """The magic link for a portal token."""
    return base_url() + url_for("portal.enter", token=token)
