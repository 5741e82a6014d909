"""Operator sessions for the UI: a signed cookie, a per-session CSRF token, login required.

The cookie itself (name, path, flags, signing key) is `app.web.sessions`' business.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import timedelta
from functools import wraps
from typing import Any, TypeVar
from urllib.parse import urlsplit

from flask import Flask, g, redirect, request, session, url_for

from app.models import Operator
from app.runtime import Runtime
from app.services.actor import Actor
from app.web import sessions
from app.web.context import runtime

F = TypeVar("F", bound=Callable[..., Any])

SESSION_LIFETIME = timedelta(hours=12)
session_secret = sessions.session_secret  # the one key derivation, shared by both faces


def configure(app: Flask, rt: Runtime) -> None:
    sessions.configure(app, rt, SESSION_LIFETIME)




def start_session(operator: Operator) -> None:
    # A fresh session at login: nothing from before (incl. the CSRF token) survives it.
    session.clear()
    session.permanent = True
    session["op"] = operator.id
    session["email"] = operator.email
    session["csrf"] = secrets.token_urlsafe(32)


def end_session() -> None:
    session.clear()


def safe_next(target: str | None) -> str:
    """Only local UI paths may be redirected to after login (no open redirect)."""
    if target:
        parts = urlsplit(target)
        if not parts.scheme and not parts.netloc and parts.path.startswith("/ui") \
                and "\\" not in target:
            return target
    return url_for("ui.dashboard")


def login_required(view: F) -> F:
    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        operator_id = session.get("op")
        if operator_id:
            with runtime().db.begin() as db_session:
                operator = db_session.get(Operator, operator_id)
                active = operator is not None and not operator.disabled
                email = operator.email if operator is not None else None
            if active:
                g.operator_id = operator_id
                g.operator_email = email
                return view(*args, **kwargs)
            end_session()
        target = request.full_path if request.method == "GET" else request.path
        return redirect(url_for("ui.login", next=target.rstrip("?")))

    return wrapper  # type: ignore[return-value]


def actor() -> Actor:
    """The signed-in operator, as the services see it (audited as `operator:<email>`)."""
    return Actor.operator(str(g.get("operator_email") or session.get("email") or "unknown"))
