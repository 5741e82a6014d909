"""Signing in and out of the operator UI.

A sign-in is throttled per account and client before the password is looked at; the session
it opens is a row (`app.services.operators`) named by the cookie (`app.web.ui.security`).
"""

from __future__ import annotations

import logging

from flask import flash, redirect, render_template, request, url_for
from werkzeug.wrappers import Response as WerkzeugResponse

from app.services import operators
from app.web.context import runtime
from app.web.ui import security
from app.web.ui.base import Page, blueprint
from app.web.ui.throttle import LoginThrottle

log = logging.getLogger(__name__)


@blueprint.route("/login", methods=["GET", "POST"])
def login() -> Page:
    next_url = request.values.get("next", "")
    if request.method == "GET":
        return render_template("ui/login.html", next=next_url, email="")
    email = request.form.get("email", "").strip()
    password = request.form.get("password", "")
    throttle = LoginThrottle(runtime().redis)
    client = request.remote_addr or "unknown"
    # Counted before the slow password check, so a concurrent burst cannot slip past the
    # count together; a success un-counts it below.
    wait_s = throttle.claim(email, client)
    if wait_s:
        # Refused before the password is looked at: a waiting account is no oracle either.
        when = f"{wait_s} seconds" if wait_s < 120 else f"{-(-wait_s // 60)} minutes"
        flash(f"Too many failed sign-ins. Try again in {when}.", "error")
        log.warning("sign-in throttled", extra={"client": client})
        page = render_template("ui/login.html", next=next_url, email=email)
        return page, 429, {"Retry-After": str(wait_s)}
    with runtime().db.begin() as session:
        operator = operators.sign_in(session, email, password)
        if operator is not None:
            security.start_session(operator, operators.open_session(session, operator))
    if operator is None:
        flash("Wrong email or password.", "error")
        return render_template("ui/login.html", next=next_url, email=email), 401
    throttle.succeeded(email, client)
    log.info("operator signed in", extra={"operator_id": operator.id})
    return redirect(security.safe_next(next_url))


@blueprint.post("/logout")
def logout() -> WerkzeugResponse:
    security.end_session()
    flash("You are signed out.", "ok")
    return redirect(url_for("ui.login"))
