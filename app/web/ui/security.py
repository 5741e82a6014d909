"""Operator sessions for the UI: a signed cookie, a per-session CSRF token, login required.

The Flask session key is derived from Kurir's master secret (KURIR_SECRET_KEY, or the dev key
in the data dir) with an HMAC under a fixed label, so every API process agrees on it without
a new setting, and the master key itself never signs cookies.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from datetime import timedelta
from functools import wraps
from typing import Any, TypeVar
from urllib.parse import urlsplit

from flask import Flask, abort, g, redirect, request, session, url_for
from flask.sessions import SecureCookieSession, SecureCookieSessionInterface

from app.crypto import DEV_KEY_FILE
from app.models import Operator
from app.runtime import Runtime
from app.services.actor import Actor
from app.web.context import runtime

F = TypeVar("F", bound=Callable[..., Any])

SESSION_LABEL = b"kurir/ui-session/v1"
SESSION_LIFETIME = timedelta(hours=12)
CSRF_FIELD = "csrf_token"


def session_secret(rt: Runtime) -> str:
    """A stable, purpose-bound key for signing the UI session cookie."""
    material = rt.settings.secret_key
    if material:
        material = material.split(",")[0].strip()
    else:
        rt.secret_box  # noqa: B018 - generates the dev key file once if it is missing
        material = (rt.settings.data_dir / DEV_KEY_FILE).read_text().strip()
    return hmac.new(material.encode(), SESSION_LABEL, hashlib.sha256).hexdigest()


LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


def is_loopback_plain_http(req: Any) -> bool:
    """Whether this request reached us over plain HTTP at a loopback address (a laptop)."""
    host = (req.host or "").rsplit(":", 1)[0] if not (req.host or "").startswith("[") \
        else (req.host or "").split("]")[0] + "]"
    return not req.is_secure and (host in LOOPBACK_HOSTS or host.startswith("127."))


def cookie_secure(rt: Runtime, req: Any) -> bool:
    """KURIR_COOKIE_SECURE when set; otherwise Secure unless the UI is served over plain HTTP
    on a loopback address, where a browser would refuse to keep a Secure cookie."""
    configured = rt.settings.cookie_secure
    if configured is not None:
        return configured
    return rt.settings.require_https or not is_loopback_plain_http(req)


class UISessionInterface(SecureCookieSessionInterface):
    """Sessions exist only under /ui: the API and the inbound receiver never pay for one."""

    def open_session(self, app: Flask, request: Any) -> SecureCookieSession | None:
        if not request.path.startswith("/ui"):
            return None  # Flask substitutes its cheap null session
        return super().open_session(app, request)

    def get_cookie_secure(self, app: Flask) -> bool:
        return cookie_secure(app.extensions["kurir"], request)


def configure(app: Flask, rt: Runtime) -> None:
    app.secret_key = session_secret(rt)
    app.session_interface = UISessionInterface()
    app.config.update(
        SESSION_COOKIE_NAME="kurir_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_PATH="/ui",
        PERMANENT_SESSION_LIFETIME=SESSION_LIFETIME,
    )


def csrf_token() -> str:
    """The session's CSRF token, created on first use (also before login)."""
    token = session.get("csrf")
    if not token:
        token = secrets.token_urlsafe(32)
        session["csrf"] = token
    return str(token)


def check_csrf() -> None:
    """Every POST must echo the session's token; a forged cross-site form cannot know it."""
    if request.method != "POST":
        return
    expected = session.get("csrf")
    sent = request.form.get(CSRF_FIELD, "")
    if not expected or not sent or not hmac.compare_digest(str(expected).encode(),
                                                           sent.encode()):
        abort(400, description="csrf")


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
