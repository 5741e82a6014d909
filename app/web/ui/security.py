"""Operator sessions for the UI: a signed cookie, a per-session CSRF token, login required.

The cookie carries the session's random token; the session itself is a row
(`app.services.operators`), read on every request, so signing out, disabling the operator or
changing their password ends it everywhere — a copied cookie included. The cookie's name,
path, flags and signing key are `app.web.sessions`' business.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar
from urllib.parse import urlsplit

from flask import Flask, g, redirect, request, session, url_for

from app.models import Operator
from app.runtime import Runtime
from app.services import operators
from app.services.actor import Actor
from app.web import sessions
from app.web.context import runtime

F = TypeVar("F", bound=Callable[..., Any])

SESSION_LIFETIME = operators.SESSION_LIFETIME
session_secret = sessions.session_secret  # the one key derivation, shared by both faces
TOKEN_KEY = "t"  # noqa: S105 - the name of a cookie field, not a secret


def configure(app: Flask, rt: Runtime) -> None:
    sessions.configure(app, rt, SESSION_LIFETIME)


def start_session(operator: Operator, token: str) -> None:
    """Put a new session's token in the cookie (its row is `operators.open_session`'s)."""
    # A fresh cookie at login: nothing from before (incl. the CSRF token) survives it.
    session.clear()
    session.permanent = True
    session[TOKEN_KEY] = token
    session["email"] = operator.email
    session["csrf"] = secrets.token_urlsafe(32)


def token() -> str | None:
    value = session.get(TOKEN_KEY)
    return str(value) if value else None


def end_session() -> None:
    """Sign out: the row ends (everywhere), then this browser forgets the cookie."""
    current = token()
    if current:
        with runtime().db.begin() as db_session:
            operators.end_session(db_session, current)
    session.clear()


def safe_next(target: str | None) -> str:
    """Only local UI paths may be redirected to after login (no open redirect)."""
    if target:
        parts = urlsplit(target)
        if (
            not parts.scheme
            and not parts.netloc
            and parts.path.startswith("/ui")
            and "\\" not in target
        ):
            return target
    return url_for("ui.dashboard")


def login_required(view: F) -> F:
    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        current = token()
        if current:
            with runtime().db.begin() as db_session:
                found = operators.resume(db_session, current)
            if found is not None:
                g.operator_id = found.operator_id
                g.operator_email = found.email
                return view(*args, **kwargs)
            session.clear()  # ended, expired or disabled: the row says so already
        target = request.full_path if request.method == "GET" else request.path
        return redirect(url_for("ui.login", next=target.rstrip("?")))

    return wrapper  # type: ignore[return-value]


def actor() -> Actor:
    """The signed-in operator, as the services see it (audited as `operator:<email>`)."""
    return Actor.operator(str(g.get("operator_email") or session.get("email") or "unknown"))
