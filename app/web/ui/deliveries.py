"""Operator pages for what was sent: the delivery log, and one delivery with a Retry button.

The log and the delivery page are the partner portal's pieces (`app.web.delivery_log`,
`shared/_delivery_log.html`, `shared/_delivery.html`) with the operator's links and filters
(partner, any endpoint): one implementation, two faces.
"""

from __future__ import annotations

from flask import flash, redirect, render_template, request, url_for
from werkzeug.wrappers import Response as WerkzeugResponse

from app.services import deliveries, event_types
from app.web import present
from app.web.context import runtime
from app.web.delivery_log import log_context
from app.web.ui import security
from app.web.ui.base import Page, blueprint, deliveries_url


@blueprint.get("/deliveries", endpoint="deliveries")
@security.login_required
def deliveries_page() -> Page:
    with runtime().db.begin() as session:
        context = log_context(session, security.actor(), request.args, list_url=deliveries_url)
        types = [e.name for e in event_types.catalog(session, security.actor())]
        return render_template("ui/deliveries.html", types=types, **context)


@blueprint.get("/deliveries/<delivery_id>")
@security.login_required
def delivery(delivery_id: str) -> Page:
    with runtime().db.begin() as session:
        found = deliveries.detail(session, security.actor(), delivery_id)
        running = found.on_its_way
        return render_template(
            "ui/delivery.html",
            d=found,
            attempts=present.attempt_views(found.attempts),
            body=present.body_view(found.sent),
            running=running,
        )


@blueprint.post("/deliveries/<delivery_id>/retry")
@security.login_required
def delivery_retry(delivery_id: str) -> WerkzeugResponse:
    rt = runtime()
    force = request.form.get("force") == "1"
    with rt.db.begin() as session:
        held = deliveries.retry(session, rt, security.actor(), delivery_id, force=force)
    if held is not None:
        flash(
            f"Not sent: it waits behind event {held.event_id} (#{held.sequence} of ordering key "
            f"{held.ordering_key!r}), which is dead. Resend or discard dead letter "
            f"{held.dead_letter_id} to let the key go on.",
            "error",
        )
        return redirect(url_for("ui.delivery", delivery_id=delivery_id))
    flash(
        "Retrying now: same webhook-id, a fresh signature"
        + (", sent although the endpoint is disabled." if force else "."),
        "ok",
    )
    return redirect(url_for("ui.delivery", delivery_id=delivery_id))
