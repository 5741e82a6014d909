"""CSRF tokens for the server-rendered faces (the operator UI and the partner portal).

Each face keeps the token in its own signed session cookie; every POST must echo it in the
form, which a forged form posted from another site cannot know.
"""

from __future__ import annotations

import hmac
import secrets

from flask import abort, request, session

CSRF_FIELD = "csrf_token"


def csrf_token() -> str:
    """The session's token, created on first use (also before sign-in)."""
    token = session.get("csrf")
    if not token:
        token = secrets.token_urlsafe(32)
        session["csrf"] = token
    return str(token)


def check_csrf() -> None:
    """Refuse (400 "csrf") a POST whose form does not echo the session's token."""
    if request.method != "POST":
        return
    expected = session.get("csrf")
    sent = request.form.get(CSRF_FIELD, "")
    if not expected or not sent or not hmac.compare_digest(str(expected).encode(), sent.encode()):
        abort(400, description="csrf")
