"""The operator UI's blueprint and what every one of its pages shares.

Each page module (`dashboard`, `dead_letters`, `endpoints`, ...) adds its routes to
`blueprint`; this module holds what runs around all of them: the CSRF and input checks before
a request, the security headers after it, the names every template may use, and the error
pages. Errors from the services become a flash message after a POST (back to the page the form
was on) and an error page after a GET, never a JSON body.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from flask import Blueprint, flash, g, redirect, render_template, request, url_for
from werkzeug.wrappers import Response as WerkzeugResponse

from app.clock import isoformat
from app.errors import KurirError
from app.web import csrf, error_pages, present, timeinput
from app.web.jsonio import check_url_and_headers
from app.web.ui import security

blueprint = Blueprint("ui", __name__, url_prefix="/ui")

Page = str | WerkzeugResponse | tuple[str, int] | tuple[str, int, dict[str, str]]


@blueprint.before_request
def _csrf() -> None:
    csrf.check_csrf()
    check_url_and_headers(form=True)  # NUL would be a 500 on PostgreSQL


@blueprint.after_request
def _headers(response: WerkzeugResponse) -> WerkzeugResponse:
    # No inline script or style anywhere, so the policy can forbid them outright.
    response.headers.setdefault(
        "Content-Security-Policy",
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    )
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    response.headers.setdefault("Cache-Control", "no-store")
    return response


def list_url(view: str, **params: Any) -> str:
    """A list page's URL with these filters as its query (empty ones left out): a filter
    such as `endpoint` cannot go through url_for's keywords."""
    query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
    return url_for(view) + (f"?{query}" if query else "")


def dead_letters_url(**params: Any) -> str:
    return list_url("ui.dead_letters", **params)


def deliveries_url(**params: Any) -> str:
    return list_url("ui.deliveries", **params)


@blueprint.context_processor
def _template_globals() -> dict[str, Any]:
    return {
        "csrf_token": csrf.csrf_token,
        "ago": present.ago,
        "isoformat": isoformat,
        "shown_time": timeinput.shown,
        "time_input": timeinput.input_value,
        "time_presets": timeinput.PRESETS,
        "operator_email": g.get("operator_email"),
        "duration": present.duration,
        "dead_letters_url": dead_letters_url,
        "delivery_url": lambda delivery_id: url_for("ui.delivery", delivery_id=delivery_id),
        "endpoint_url": lambda endpoint_id: url_for("ui.endpoint", endpoint_id=endpoint_id),
        "deliveries_url": deliveries_url,
    }


def back(default: str) -> WerkzeugResponse:
    """Back to the UI page the form was posted from (`back` field, else the referrer), or to
    `default` when that is not a local UI page."""
    target = request.form.get("back") or request.referrer or ""
    if target.startswith(request.host_url):
        target = "/" + target[len(request.host_url) :]
    return redirect(security.safe_next(target) if target.startswith("/ui") else default)


@blueprint.errorhandler(KurirError)
def _kurir_error(exc: KurirError) -> Page:
    if request.method == "POST":
        flash(exc.message, "error")
        return back(url_for("ui.dashboard"))
    return render_template(
        "ui/error.html", status=exc.status, title="Cannot show this page", message=exc.message
    ), exc.status


error_pages.register(blueprint, "ui/error.html", page="Kurir", speaker="Kurir")


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


blueprint.add_app_template_filter(dumps, "dumps")
blueprint.add_app_template_filter(lambda n: f"{n:,}", "thousands")
