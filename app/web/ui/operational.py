"""Operator pages for operational events: the operator endpoints (list, add one), and a
partner's opt-in toggle."""

from __future__ import annotations

from flask import flash, redirect, render_template, request, url_for
from werkzeug.wrappers import Response as WerkzeugResponse

from app.errors import ValidationFailed
from app.services import operational, partners
from app.web.context import runtime
from app.web.ui import security
from app.web.ui.base import Page, blueprint


@blueprint.get("/operator-endpoints")
@security.login_required
def operator_endpoints() -> Page:
    with runtime().db.begin() as session:
        found = operational.operator_endpoints(session, security.actor())
        return render_template(
            "ui/operator_endpoints.html", found=found, types=operational.TYPES, form={}
        )


@blueprint.post("/operator-endpoints")
@security.login_required
def operator_endpoint_create() -> Page:
    rt = runtime()
    chosen = [t for t in request.form.getlist("event_types") if t]
    body: dict[str, object] = {"url": request.form.get("url", "").strip()}
    if chosen:
        body["event_types"] = chosen
    if request.form.get("description", "").strip():
        body["description"] = request.form["description"].strip()
    with rt.db.begin() as session:
        try:
            with session.begin_nested():
                created = operational.create_operator_endpoint(session, rt, security.actor(), body)
                endpoint_id = created.endpoint.id
        except ValidationFailed as exc:
            found = operational.operator_endpoints(session, security.actor())
            flash(str(exc), "error")
            return render_template(
                "ui/operator_endpoints.html",
                found=found,
                types=operational.TYPES,
                form=request.form,
            ), 422
    flash(
        "Operator endpoint added: it receives Kurir's operational events from now on. "
        "Its signing secret is below.",
        "ok",
    )
    return redirect(url_for("ui.endpoint_secret", endpoint_id=endpoint_id))


@blueprint.post("/partners/<uid>/operational-events")
@security.login_required
def partner_operational_events(uid: str) -> WerkzeugResponse:
    on = request.form.get("on") == "1"
    with runtime().db.begin() as session:
        partners.set_operational_events(session, security.actor(), uid, on)
    flash(
        f"{uid} now receives operational events about its endpoints, on those subscribed to them."
        if on
        else f"{uid} no longer receives operational events.",
        "ok",
    )
    return redirect(url_for("ui.partner", uid=uid))
