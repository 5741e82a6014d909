"""Portal sessions in the browser: the cookie, CSRF, and who the visitor is.

The portal's cookie (`kurir_portal`, path `/portal`, see `app.web.sessions`) carries the
session's random token — looked up hashed in `portal_sessions` on every request, so signing
out, revocation or expiry takes effect at once — and the CSRF token every form must echo. The
magic link itself is the only credential that opens a session; nothing else does.

Spending a link is the one POST without a CSRF token (there is no session yet), so it must
come from the link's own page, not from a form on another site that would sign the visitor
in as someone else (login CSRF). `cross_site_entry` decides that from what browsers say about
where a request comes from.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar
from urllib.parse import urlsplit

from flask import g, render_template, request, session

from app.errors import KurirError
from app.services import portal
from app.services.actor import Actor
from app.web.context import runtime

F = TypeVar("F", bound=Callable[..., Any])

TOKEN_KEY = "t"  # noqa: S105 - the name of a cookie field, not a secret

ENDED_MESSAGES = {
    portal.ENDED: "You signed out of this session.",
    portal.EXPIRED: "Portal sessions last 12 hours, and this one has ended.",
    portal.IDLE: "This session ended after an hour without activity.",
    portal.UNKNOWN: "This portal session is not valid any more.",
    portal.REVOKED: "The publisher ended this session (its access to the portal was withdrawn).",
    None: "You are not signed in to the portal.",
}

# Sec-Fetch-Site values of a POST that a page of another site cannot have caused: the enter
# page posting to itself, or the user's own action in the browser (no page involved).
_OWN_SITE = frozenset({"same-origin", "none"})


def cross_site_entry(headers: Any, host: str, public_url: str | None) -> str | None:
    """Why a POST spending a magic link did not come from the link's own page, or None.

    Browsers say where a request comes from in `Sec-Fetch-Site` (every current browser, on
    HTTPS and on loopback): only `same-origin` (the enter page posting to itself) and `none`
    pass. Where that header is absent — older browsers, or plain HTTP off loopback — an
    `Origin` header, when sent, must be this host or KURIR_PUBLIC_URL (the enter page sends a
    real Origin: its Referrer-Policy is `same-origin`). A request with neither header comes
    from no browser (curl, a script), which no other site can make a visitor send: allowed.
    """
    site = headers.get("Sec-Fetch-Site")
    if site is not None:
        return None if site.strip().lower() in _OWN_SITE else f"Sec-Fetch-Site: {site[:40]}"
    origin = headers.get("Origin")
    if origin is None:
        return None
    allowed = {host.lower()}
    if public_url:
        allowed.add(urlsplit(public_url).netloc.lower())
    netloc = urlsplit(origin.strip()).netloc.lower() if origin.strip() != "null" else ""
    return None if netloc and netloc in allowed else f"Origin: {origin[:100]}"


def start(entered: portal.Entered) -> None:
    # A fresh cookie at sign-in: nothing from before (another partner's session, an old CSRF
    # token) survives it.
    session.clear()
    session.permanent = True
    session[TOKEN_KEY] = entered.token
    session["csrf"] = secrets.token_urlsafe(32)


def token() -> str | None:
    value = session.get(TOKEN_KEY)
    return str(value) if value else None


def end() -> None:
    session.clear()


# The portal section (a scoped link's feature) each page belongs to; None: every session
# sees it. A page missing here is a bug (tests/integration/test_portal_scopes.py checks).
SECTIONS: dict[str, str | None] = {
    "portal.logout": None,
    "portal.home": None,  # the endpoint list, or the first section the session sees
    "portal.verify": None,
    "portal.endpoint_new": "endpoints",
    "portal.endpoint": "endpoints",
    "portal.endpoint_edit": "endpoints",
    "portal.endpoint_filter_test": "endpoints",
    "portal.endpoint_filter_test_new": "endpoints",
    "portal.endpoint_enable": "endpoints",
    "portal.endpoint_delete": "endpoints",
    "portal.endpoint_resend_parked": "resend",
    "portal.endpoint_skip_expired": "feed",
    "portal.endpoint_secret": "secrets",
    "portal.endpoint_secret_reveal": "secrets",
    "portal.endpoint_secret_rotate": "secrets",
    "portal.endpoint_secret_expire_previous": "secrets",
    "portal.endpoint_test": "test",
    "portal.endpoint_verify": "endpoints",
    "portal.endpoint_resend_challenge": "endpoints",
    "portal.endpoint_probe": "endpoints",
    "portal.endpoint_recover": "resend",
    "portal.operational_events": "endpoints",
    "portal.feed_key_create": "feed",
    "portal.feed_key_revoke": "feed",
    "portal.deliveries": "deliveries",
    "portal.delivery": "deliveries",
    "portal.delivery_resend": "resend",
    "portal.catalog": "catalog",
}
# Pages that are forms even when fetched (GET): a read-only session is refused them too.
FORM_PAGES = frozenset({"portal.endpoint_new", "portal.endpoint_edit", "portal.endpoint_delete"})
# The one POST a read-only session may make: signing out.
ALWAYS_ALLOWED = frozenset({"portal.logout"})


def _changes(view_name: str) -> bool:
    if view_name in ALWAYS_ALLOWED:
        return False
    return request.method == "POST" or view_name in FORM_PAGES


def scope() -> portal.Scope:
    """The signed-in session's scope (full before sign-in)."""
    found = g.get("portal_scope")
    return found if isinstance(found, portal.Scope) else portal.FULL


def session_required(view: F) -> F:
    """Run the view as the portal session's actor, within its scope, or say plainly that
    there is none (or that the scope does not reach this page: 404, or 403 for a change in a
    read-only session)."""

    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        current = token()
        reason = None
        if current:
            with runtime().db.begin() as db_session:
                resumed = portal.resume(db_session, current)
            if resumed.actor is not None:
                g.portal_actor = resumed.actor
                g.partner = resumed.partner
                g.session_expires_at = resumed.expires_at
                g.portal_scope = resumed.scope
                name = str(request.endpoint)
                try:
                    portal.require(resumed.scope, SECTIONS[name], changes=_changes(name))
                except KurirError as exc:
                    title = "Not found" if exc.status == 404 else "Not in this session"
                    return render_template(
                        "portal/error.html", status=exc.status, title=title, message=exc.message
                    ), exc.status
                return view(*args, **kwargs)
            reason = resumed.reason
            end()
        return render_template(
            "portal/signed_out.html", message=ENDED_MESSAGES[reason], reason=reason
        ), 401

    return wrapper  # type: ignore[return-value]


def actor() -> Actor:
    """The signed-in partner, as the services see it (audited as `portal:<uid>`)."""
    return g.portal_actor
