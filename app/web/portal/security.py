"""Portal sessions in the browser: the cookie, CSRF, and who the visitor is.

The portal's cookie (`kurir_portal`, path `/portal`, see `app.web.sessions`) carries the
session's random token — looked up hashed in `portal_sessions` on every request, so signing
out or expiry takes effect at once — and the CSRF token every form must echo. The magic link
itself is the only credential that opens a session; nothing else does.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from flask import g, render_template, session

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
    None: "You are not signed in to the portal.",
}




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


def session_required(view: F) -> F:
    """Run the view as the portal session's actor, or say plainly that there is none."""

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
                return view(*args, **kwargs)
            reason = resumed.reason
            end()
        return render_template("portal/signed_out.html", message=ENDED_MESSAGES[reason],
                               reason=reason), 401

    return wrapper  # type: ignore[return-value]


def actor() -> Actor:
    """The signed-in partner, as the services see it (audited as `portal:<uid>`)."""
    return g.portal_actor  # type: ignore[no-any-return]
