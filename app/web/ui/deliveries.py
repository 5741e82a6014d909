"""Operator pages for what was sent: the delivery log, one delivery with a Retry button, and
the events list.

The log and the delivery page are the partner portal's pieces (`app.web.delivery_log`,
`shared/_delivery_log.html`, `shared/_delivery.html`) with the operator's links and filters
(partner, any endpoint): one implementation, two faces.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from flask import flash, redirect, render_template, request, url_for
from werkzeug.wrappers import Response as WerkzeugResponse

from app.errors import BadRequest, NotFound
from app.pagination import parse_limit
from app.services import dead_letters, deliveries, event_types, events, partners
from app.web import present
from app.web.context import runtime
from app.web.delivery_log import log_context
from app.web.jsonio import time_param
from app.web.ui import security
from app.web.ui.views import Page, blueprint


def deliveries_url(**params: Any) -> str:
    """The log URL for these filters (`endpoint` cannot go through url_for's keywords)."""
    query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
    return url_for("ui.deliveries") + (f"?{query}" if query else "")


@blueprint.get("/deliveries", endpoint="deliveries")
@security.login_required
def deliveries_page() -> Page:
    with runtime().db.begin() as session:
        context = log_context(session, security.actor(), request.args,
                              list_url=deliveries_url)
        types = [e.name for e in event_types.catalog(session, security.actor())]
        return render_template("ui/deliveries.html", types=types, **context)


@blueprint.get("/deliveries/<delivery_id>")
@security.login_required
def delivery(delivery_id: str) -> Page:
    with runtime().db.begin() as session:
        found = deliveries.detail(session, security.actor(), delivery_id)
        running = found.delivery.state in ("pending", "delivering")
        return render_template("ui/delivery.html", d=found,
                               attempts=present.attempt_views(found.attempts),
                               body=present.body_view(found.sent), running=running)


@blueprint.post("/deliveries/<delivery_id>/retry")
@security.login_required
def delivery_retry(delivery_id: str) -> WerkzeugResponse:
    rt = runtime()
    force = request.form.get("force") == "1"
    with rt.db.begin() as session:
        deliveries.retry(session, rt, security.actor(), delivery_id, force=force)
    flash("Retrying now: same webhook-id, a fresh signature"
          + (", sent although the endpoint is disabled." if force else "."), "ok")
    return redirect(url_for("ui.delivery", delivery_id=delivery_id))


@blueprint.get("/events")
@security.login_required
def event_lookup() -> Page:
    """The events list (newest first, by partner, type and time), and lookup by any id."""
    raw = request.args.get("id", "").strip()
    actor = security.actor()
    with runtime().db.begin() as session:
        if raw:
            target = _lookup(session, raw)
            if target is not None:
                return redirect(target)
            flash(f"Nothing has the id {raw!r}. Paste an event (evt_…), delivery (dlv_…) or "
                  "dead letter (dl_…) id.", "error")
        uid = request.args.get("partner", "").strip() or None
        type_ = request.args.get("type", "").strip() or None
        error = None
        try:
            since, until = time_param("since"), time_param("until")
            rows, next_cursor = events.page(
                session, actor, uid, type_=type_, since=since, until=until,
                limit=parse_limit(request.args.get("limit") or "50"),
                cursor=request.args.get("cursor"))
        except (BadRequest, NotFound) as exc:
            error, rows, next_cursor = exc.message, [], None
        query = {k: request.args.get(k, "") for k in ("partner", "type", "since", "until")}
        page = render_template(
            "ui/events.html", rows=rows, query=query, lookup=raw, error=error,
            partner_uids=partners.uids(session, {e.partner_id for e in rows}),
            next_url=(url_for("ui.event_lookup") + "?" + urlencode(
                {**{k: v for k, v in query.items() if v}, "cursor": next_cursor})
                if next_cursor else None))
    return (page, 404) if raw else page


def _lookup(session: Any, raw: str) -> str | None:
    """The page of whatever has this id: a dead letter, a delivery or an event."""
    actor = security.actor()
    try:
        if raw.startswith("dl_"):
            dead_letters.get(session, actor, raw)
            return url_for("ui.dead_letter", letter_id=raw)
        if raw.startswith("dlv_"):
            deliveries.get(session, actor, raw)
            return url_for("ui.delivery", delivery_id=raw)
        events.get(session, actor, raw)
        return url_for("ui.event", event_id=raw)
    except NotFound:
        return None
