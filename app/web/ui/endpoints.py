"""Operator pages for endpoints: the list, one endpoint (health, parked letters, blocked
ordering keys, lag, pins, its operational events and audit trail), and what an operator does
to it: enable, disable, rotate and show the secret, resend what was parked, skip a pull
backlog past retention, edit, send a test event."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from flask import flash, redirect, render_template, request, url_for
from werkzeug.wrappers import Response as WerkzeugResponse

from app.clock import utcnow
from app.errors import Conflict, NotFound, ValidationFailed
from app.models import Endpoint
from app.pagination import parse_limit
from app.services import (
    audit,
    dead_letters,
    endpoints,
    event_types,
    feed,
    filters,
    list_filters,
    partners,
    pins,
    verification,
)
from app.vocabulary import SignatureKind
from app.web import present
from app.web.context import runtime
from app.web.endpoint_form import EndpointForm
from app.web.ui import security
from app.web.ui.base import Page, blueprint

# Blocked ordering keys shown on an endpoint's page; the API lists them all.
BLOCKED_KEYS_SHOWN = 50
# Operational events and audit rows shown on an endpoint's page.
RECENT_EVENTS_SHOWN = 10


def _health_since() -> datetime:
    """Health is shown over the last day."""
    return utcnow() - timedelta(hours=24)


@blueprint.get("/endpoints", endpoint="endpoints")
@security.login_required
def endpoints_page() -> Page:
    state = request.args.get("state", "")
    partner_uid = request.args.get("partner", "").strip()
    sort = "health" if request.args.get("sort") == "health" else ""
    limit = parse_limit(request.args.get("limit") or "50")
    actor = security.actor()
    state_filter = state if state in ("enabled", "disabled", "pending_verification") else None
    with runtime().db.begin() as session:
        next_cursor = None
        missing = list_filters.unknown(session, actor, partner=partner_uid or None)
        rows: list[Endpoint] = []
        health: dict[str, endpoints.Health] = {}
        if not missing:
            if sort:
                rows, health = endpoints.worst_first(
                    session, actor, partner_uid or None, state=state_filter, since=_health_since()
                )
            else:
                rows, next_cursor = endpoints.page(
                    session,
                    actor,
                    partner_uid or None,
                    state=state_filter,
                    limit=limit,
                    cursor=request.args.get("cursor"),
                )
                health = endpoints.health(session, actor, rows, since=_health_since())
        ids = [e.id for e in rows]
        query: dict[str, Any] = {
            k: v for k, v in {"state": state, "partner": partner_uid, "sort": sort}.items() if v
        }
        return render_template(
            "ui/endpoints.html",
            endpoints=rows,
            state=state,
            partner=partner_uid,
            sort=sort,
            errors=missing,
            unknown=missing,
            partner_choices=partners.choices(session, actor),
            partners=partners.uids(session, {e.partner_id for e in rows}),
            health=health,
            statuses=endpoints.health_statuses(rows, health),
            open_letters=dead_letters.open_by_endpoint(session, actor, ids),
            next_url=(
                url_for("ui.endpoints", **query, cursor=next_cursor) if next_cursor else None
            ),
            any_endpoint=bool(rows) or endpoints.any_exist(session, actor),
        )


@blueprint.get("/endpoints/<endpoint_id>")
@security.login_required
def endpoint(endpoint_id: str) -> Page:
    actor = security.actor()
    with runtime().db.begin() as session:
        ep = endpoints.by_id(session, actor, endpoint_id)
        partner = partners.by_id(session, actor, ep.partner_id)
        parked = endpoints.parked(session, actor, ep) if ep.deleted_at is None else None
        health = endpoints.health(session, actor, [ep], since=_health_since())
        chart_range = endpoints.chart_range(request.args.get("range"))
        series = endpoints.success_series(session, actor, ep, chart_range)
        retrying = endpoints.retrying_counts(session, actor, [ep.id]).get(ep.id, 0)
        recent = endpoints.operational_events(session, actor, ep, limit=RECENT_EVENTS_SHOWN)
        trail, _ = audit.search(session, actor, subject_id=ep.id, limit=RECENT_EVENTS_SHOWN)
        blocked: list[endpoints.BlockedKey] = []
        more_blocked = None
        # Whatever `ordering` says now: the gate holds every numbered delivery.
        if ep.on_dead == "block" and ep.deleted_at is None:
            blocked, more_blocked = endpoints.blocked_keys(
                session, actor, partner.uid, ep.id, cursor=None, limit=BLOCKED_KEYS_SHOWN
            )
        return render_template(
            "ui/endpoint.html",
            ep=ep,
            partner=partner,
            parked=parked,
            blocked=blocked,
            more_blocked=more_blocked is not None,
            health=health.get(ep.id, endpoints.Health(0, 0)),
            status=endpoints.health_status(ep, health.get(ep.id)),
            series=series,
            range_url=lambda r: url_for("ui.endpoint", endpoint_id=ep.id, range=r),
            retrying=retrying,
            recent=recent,
            trail=trail,
            headers=present.endpoint_headers(ep.headers, ep.public_headers),
            lag=feed.lag_of(session, runtime().settings, ep),
            public_key=endpoints.public_key(ep),
            pinned=pins.of_endpoint(session, actor, ep),
            open_letters=dead_letters.open_by_endpoint(session, actor, [ep.id]).get(ep.id, 0),
            probes=endpoints.probes(session, actor, ep),
            probed=endpoints.is_probed(ep),
            auto_recover_on=runtime().settings.auto_recover,
            verification=verification.status(ep),
        )


@blueprint.post("/endpoints/<endpoint_id>/enable")
@security.login_required
def endpoint_enable(endpoint_id: str) -> WerkzeugResponse:
    actor = security.actor()
    with runtime().db.begin() as session:
        ep = endpoints.by_id(session, actor, endpoint_id, "endpoints:write")
        if endpoints.enable(session, actor, ep, runtime()):
            parked = endpoints.parked(session, actor, ep)
            if parked.holds_keys:
                flash(
                    f"Enabled. The {parked.letters} dead letter(s) parked while it was "
                    "disabled hold their ordering keys (on_dead: block): nothing more of "
                    "those keys is sent until they are resent — use “Resend everything "
                    "parked” below.",
                    "info",
                )
            else:
                flash("Enabled. New events will be delivered to it again.", "ok")
        else:
            flash("The endpoint is already enabled.", "info")
    return redirect(url_for("ui.endpoint", endpoint_id=endpoint_id))


@blueprint.post("/endpoints/<endpoint_id>/disable")
@security.login_required
def endpoint_disable(endpoint_id: str) -> WerkzeugResponse:
    reason = request.form.get("reason", "").strip() or None
    actor = security.actor()
    with runtime().db.begin() as session:
        ep = endpoints.by_id(session, actor, endpoint_id, "endpoints:write")
        if ep.state == endpoints.DISABLED:
            flash("The endpoint is already disabled.", "info")
        else:
            endpoints.disable(session, actor, ep, reason)
            flash("Disabled. New events for it are parked as dead letters.", "ok")
    return redirect(url_for("ui.endpoint", endpoint_id=endpoint_id))


@blueprint.post("/endpoints/<endpoint_id>/rotate-secret")
@security.login_required
def endpoint_rotate(endpoint_id: str) -> WerkzeugResponse:
    rt = runtime()
    actor = security.actor()
    with rt.db.begin() as session:
        ep = endpoints.by_id(session, actor, endpoint_id, "endpoints:write")
        endpoints.rotate_secret(session, rt, actor, ep)
        what = "public key" if ep.signature == SignatureKind.ED25519 else "secret"
    flash(f"Rotated. The new {what} is below; the old one keeps signing during the overlap.", "ok")
    # The secret is read by the page, never carried in the redirect or the session cookie;
    # reloading that page shows it again and rotates nothing.
    return redirect(url_for("ui.endpoint_secret", endpoint_id=endpoint_id))


@blueprint.get("/endpoints/<endpoint_id>/secret")
@security.login_required
def endpoint_secret(endpoint_id: str) -> Page:
    rt = runtime()
    actor = security.actor()
    with rt.db.begin() as session:
        ep = endpoints.by_id(session, actor, endpoint_id, "endpoints:write")
        if ep.deleted_at is not None:
            raise NotFound(f"Endpoint {endpoint_id} is deleted; it has no secret to show.")
        partner = partners.by_id(session, actor, ep.partner_id)
        if ep.signature == SignatureKind.ED25519:
            # Its private key is never shown; the public keys are, unaudited (public).
            return render_template(
                "ui/secret.html",
                ep=ep,
                partner=partner,
                public_keys=endpoints.public_keys(ep),
                old_until=endpoints.previous_secret_expiry(ep),
            )
        row, secret = endpoints.read_secret(session, rt, actor, ep)
        return render_template(
            "ui/secret.html",
            ep=ep,
            partner=partner,
            secret=secret,
            since=row.created_at,
            old_until=endpoints.previous_secret_expiry(ep),
        )


@blueprint.post("/endpoints/<endpoint_id>/resend-parked")
@security.login_required
def endpoint_resend_parked(endpoint_id: str) -> WerkzeugResponse:
    rt = runtime()
    actor = security.actor()
    with rt.db.begin() as session:
        ep = endpoints.by_id(session, actor, endpoint_id, "endpoints:write")
        enabled, job = endpoints.resend_parked(session, rt, actor, ep)
        job_id, total = job.id, job.total
    flash(
        f"{'Endpoint enabled; r' if enabled else 'R'}esending {total} parked dead letter"
        f"{'s' if total != 1 else ''}.",
        "ok",
    )
    return redirect(url_for("ui.resend_job", job_id=job_id))


@blueprint.post("/endpoints/<endpoint_id>/skip-expired")
@security.login_required
def endpoint_skip_expired(endpoint_id: str) -> WerkzeugResponse:
    """Move a pull endpoint past the events of its backlog that lie beyond retention."""
    rt = runtime()
    actor = security.actor()
    with rt.db.begin() as session:
        ep = endpoints.by_id(session, actor, endpoint_id, "endpoints:write")
        partner = partners.by_id(session, actor, ep.partner_id)
        skipped = feed.skip_expired(session, rt.settings, actor, partner.uid, ep.id).backlog
    if skipped is None:
        flash("Nothing of its backlog lies past retention: nothing was skipped.", "info")
    else:
        flash(
            f"Skipped {skipped.skipped} event(s) past retention (the oldest "
            f"{skipped.oldest_event}); its reads go on from the oldest event kept.",
            "ok",
        )
    return redirect(url_for("ui.endpoint", endpoint_id=endpoint_id))


@blueprint.route("/endpoints/<endpoint_id>/edit", methods=["GET", "POST"])
@security.login_required
def endpoint_edit(endpoint_id: str) -> Page:
    """The portal's endpoint form, for an operator (audited as the operator)."""
    rt = runtime()
    actor = security.actor()
    with rt.db.begin() as session:
        ep = endpoints.by_id(session, actor, endpoint_id, "endpoints:write")
        if ep.deleted_at is not None:
            raise NotFound(f"Endpoint {endpoint_id} is deleted; it cannot be changed.")
        partner = partners.by_id(session, actor, ep.partner_id)
        catalog = event_types.catalog(session, actor)
        if request.method == "GET":
            return render_template(
                "ui/endpoint_edit.html",
                ep=ep,
                partner=partner,
                form=EndpointForm.from_endpoint(ep),
                catalog=catalog,
            )
        form = EndpointForm.from_request(request.form, existing=ep)
        body = form.body(editing=True)
        if body is not None:
            try:
                with session.begin_nested():
                    endpoints.update(session, rt, actor, partner.uid, endpoint_id, body)
            except ValidationFailed as exc:
                form.refused(exc)
            else:
                flash("Saved. Deliveries from now on use the new settings.", "ok")
                return redirect(url_for("ui.endpoint", endpoint_id=endpoint_id))
        session.refresh(ep)
        return render_template(
            "ui/endpoint_edit.html", ep=ep, partner=partner, form=form, catalog=catalog
        ), 422


@blueprint.post("/endpoints/<endpoint_id>/recover")
@security.login_required
def endpoint_recover(endpoint_id: str) -> WerkzeugResponse:
    rt = runtime()
    actor = security.actor()
    body = {k: v.strip() for k, v in request.form.items() if k in ("since", "until") and v.strip()}
    try:
        with rt.db.begin() as session:
            ep = endpoints.by_id(session, actor, endpoint_id, "endpoints:write")
            job = endpoints.recover_window(session, rt, actor, ep, body)
            flash(
                f"Resending {job.total} in publish order (operation {job.id}).",
                "ok",
            )
    except (ValidationFailed, Conflict) as exc:
        flash(exc.message, "error")
    return redirect(url_for("ui.endpoint", endpoint_id=endpoint_id))


@blueprint.post("/endpoints/<endpoint_id>/probe")
@security.login_required
def endpoint_probe(endpoint_id: str) -> WerkzeugResponse:
    rt = runtime()
    actor = security.actor()
    with rt.db.begin() as session:
        ep = endpoints.by_id(session, actor, endpoint_id, "endpoints:write")
        endpoints.probe_now(session, rt, actor, ep)
    flash("Probe sent. Its answer shows below when it comes back.", "ok")
    return redirect(url_for("ui.endpoint", endpoint_id=endpoint_id))


@blueprint.post("/endpoints/<endpoint_id>/verify/resend")
@security.login_required
def endpoint_resend_challenge(endpoint_id: str) -> WerkzeugResponse:
    rt = runtime()
    actor = security.actor()
    with rt.db.begin() as session:
        ep = endpoints.by_id(session, actor, endpoint_id, "endpoints:write")
        partner = partners.by_id(session, actor, ep.partner_id)
        verification.resend(session, rt, actor, partner.uid, endpoint_id)
    flash("A new challenge is on its way; the previous one no longer counts.", "ok")
    return redirect(url_for("ui.endpoint", endpoint_id=endpoint_id))


@blueprint.post("/endpoints/<endpoint_id>/filter-test")
@security.login_required
def endpoint_filter_test(endpoint_id: str) -> Page:
    """ "Try this filter" in the edit form: the form as sent, with the filter's verdict on
    the samples; nothing is saved."""
    actor = security.actor()
    with runtime().db.begin() as session:
        ep = endpoints.by_id(session, actor, endpoint_id)
        partner = partners.by_id(session, actor, ep.partner_id)
        form = EndpointForm.from_request(request.form, existing=ep)
        try:
            form.tried = filters.try_filter(
                session,
                actor,
                partner.uid,
                None,
                form.filter_test_body(),
                event_types_=form.tried_types,
            )
        except ValidationFailed as exc:
            form.refused(exc)
        return render_template(
            "ui/endpoint_edit.html",
            ep=ep,
            partner=partner,
            form=form,
            catalog=event_types.catalog(session, actor),
        ), (200 if form.tried is not None else 422)


@blueprint.post("/endpoints/<endpoint_id>/test")
@security.login_required
def endpoint_test(endpoint_id: str) -> WerkzeugResponse:
    rt = runtime()
    actor = security.actor()
    with rt.db.begin() as session:
        ep = endpoints.by_id(session, actor, endpoint_id, "endpoints:write")
        delivery_id = endpoints.send_test(session, rt, actor, ep).id
    flash(
        "Test event sent (kurir.test, to this endpoint only). This page shows its attempt "
        "when it ends.",
        "ok",
    )
    return redirect(url_for("ui.delivery", delivery_id=delivery_id))


@blueprint.route("/endpoints/<endpoint_id>/delete", methods=["GET", "POST"])
@security.login_required
def endpoint_delete(endpoint_id: str) -> Page:
    """Delete an endpoint, once its URL (a pull endpoint: its id) is typed to confirm
    (audited as the operator, `endpoint.deleted`)."""
    actor = security.actor()
    with runtime().db.begin() as session:
        ep = endpoints.by_id(session, actor, endpoint_id, "endpoints:write")
        if ep.deleted_at is not None:
            raise NotFound(f"Endpoint {endpoint_id} is already deleted.")
        partner = partners.by_id(session, actor, ep.partner_id)
        if request.method == "GET":
            return render_template("ui/endpoint_delete.html", ep=ep, partner=partner)
        if request.form.get("confirm", "").strip() != (ep.url or ep.id):
            flash(
                "Not deleted: type the endpoint's URL (a pull endpoint: its id) exactly.",
                "error",
            )
            return redirect(url_for("ui.endpoint_delete", endpoint_id=endpoint_id))
        endpoints.delete(session, actor, partner.uid, endpoint_id)
    flash("Endpoint deleted. It receives nothing from now on; its history stays.", "ok")
    return redirect(url_for("ui.endpoint", endpoint_id=endpoint_id))
