"""The partner portal's pages: endpoints, their secret, test events, deliveries, the event
catalog and how to verify signatures.

Views act as the portal session's actor (`Actor.portal`: this partner only, audited as
`portal:<uid>`) through the same services as the API and the operator UI; another partner's
resources answer "not found", whatever the URL says. Every change is a POST with the
session's CSRF token, answered by a redirect to a page that is safe to reload — except
"reveal secret", which answers with the secret itself so that it travels in no URL and no
cookie.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from flask import Blueprint, flash, g, redirect, render_template, request, url_for
from werkzeug.wrappers import Response as WerkzeugResponse

from app.clock import isoformat, utcnow
from app.errors import Conflict, KurirError, RateLimited, ValidationFailed
from app.models import Endpoint
from app.services import (
    deliveries,
    endpoints,
    event_types,
    feed,
    filters,
    keys,
    partners,
    pins,
    portal,
    verification,
)
from app.vocabulary import EndpointMode, SignatureKind
from app.web import csrf, error_pages, present, timeinput
from app.web.context import runtime
from app.web.delivery_log import log_context
from app.web.endpoint_form import EndpointForm
from app.web.jsonio import check_url_and_headers
from app.web.portal import guide, security

log = logging.getLogger(__name__)

blueprint = Blueprint("portal", __name__, url_prefix="/portal")

Page = str | WerkzeugResponse | tuple[str, int] | tuple[str, int, dict[str, str]]
# While a delivery is on its way, its page reloads itself this often (no script needed).
REFRESH_S = 2
# The refusal code of a link posted from another site's page (login CSRF).
CROSS_SITE = "cross_site"
# Blocked ordering keys listed on an endpoint's page (the API pages through all of them).
BLOCKED_KEYS_SHOWN = 50


# ------------------------------------------------------------------------------ plumbing


@blueprint.before_request
def _csrf() -> None:
    if request.endpoint != "portal.enter":  # the link itself is that request's credential
        csrf.check_csrf()
    check_url_and_headers(form=True)  # NUL would be a 500 on PostgreSQL


@blueprint.after_request
def _headers(response: WerkzeugResponse) -> WerkzeugResponse:
    ancestors = runtime().settings.portal_frame_ancestors
    response.headers.setdefault(
        "Content-Security-Policy",
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        f"form-action 'self'; frame-ancestors {ancestors}; base-uri 'none'",
    )
    if not runtime().settings.portal_framable:
        response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    # A magic link's token is in its URL: never send it on as a Referer.
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    response.headers.setdefault("Cache-Control", "no-store")
    return response


@blueprint.context_processor
def _template_globals() -> dict[str, Any]:
    settings = runtime().settings
    return {
        "csrf_token": csrf.csrf_token,
        "ago": present.ago,
        "isoformat": isoformat,
        "shown_time": timeinput.shown,
        "time_input": timeinput.input_value,
        "time_presets": timeinput.PRESETS,
        "duration": present.duration,
        "portal_title": settings.portal_title,
        "partner": g.get("partner"),
        "scope": security.scope(),
        "delivery_url": _delivery_url,
        "endpoint_url": _endpoint_url,
        "deliveries_url": _deliveries_url,
    }


def _delivery_url(delivery_id: str) -> str:
    return url_for("portal.delivery", delivery_id=delivery_id)


def _endpoint_url(endpoint_id: str) -> str:
    return url_for("portal.endpoint", endpoint_id=endpoint_id)


def _deliveries_url(**params: Any) -> str:
    query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
    return url_for("portal.deliveries") + (f"?{query}" if query else "")


def _uid() -> str:
    return str(security.actor().partner_uid)


@blueprint.errorhandler(KurirError)
def _kurir_error(exc: KurirError) -> Page:
    # A refused action goes back to its page with the reason; what does not exist (another
    # partner's endpoint, whatever the URL) is a 404 for every method alike.
    if request.method == "POST" and g.get("portal_actor") is not None and exc.status != 404:
        flash(exc.message, "error")
        back = redirect(
            request.referrer if _same_portal(request.referrer) else url_for("portal.home")
        )
        if exc.retry_after_s is not None:
            back.headers["Retry-After"] = str(exc.retry_after_s)
        return back
    title = "Not found" if exc.status == 404 else "Cannot show this page"
    headers = {} if exc.retry_after_s is None else {"Retry-After": str(exc.retry_after_s)}
    return (
        render_template("portal/error.html", status=exc.status, title=title, message=exc.message),
        exc.status,
        headers,
    )


def _same_portal(target: str | None) -> bool:
    return bool(target) and str(target).startswith(request.host_url.rstrip("/") + "/portal")


error_pages.register(blueprint, "portal/error.html", page="portal", speaker="The portal")


# ------------------------------------------------------------------------------ session


@blueprint.route("/login/<token>", methods=["GET", "POST"])
def enter(token: str) -> Page:
    """A magic link. GET shows a page that posts it on (at once, by script), so a link
    scanner that merely fetches the URL does not spend it; POST spends it."""
    if request.method == "GET":
        # Its POST then carries a real Origin (under no-referrer it would be "null"), which
        # `cross_site_entry` checks where a browser sends no Sec-Fetch-Site. The token is in
        # this page's own URL, so a same-origin Referer tells us nothing we did not have.
        return (
            render_template("portal/enter.html", token=token),
            200,
            {"Referrer-Policy": "same-origin"},
        )
    refused = security.cross_site_entry(
        request.headers, request.host, runtime().settings.public_url
    )
    if refused is not None:
        log.warning("portal link posted from another site, refused", extra={"reason": refused})
        return render_template(
            "portal/link_refused.html",
            title="Open the link itself",
            code=CROSS_SITE,
            message="This sign-in did not come from the link's own page, so it was refused "
            "and the link is still unused. Open the link you were given directly in "
            "your browser.",
        ), 403
    try:
        with runtime().db.begin() as session:
            entered = portal.enter(session, token)
    except portal.LinkRefused as exc:
        titles = {
            portal.LINK_USED: "This link was already used",
            portal.LINK_EXPIRED: "This link has expired",
            portal.LINK_REVOKED: "This link was withdrawn",
            portal.LINK_UNKNOWN: "This link is not valid",
        }
        return render_template(
            "portal/link_refused.html",
            title=titles.get(exc.code, "No entry"),
            message=exc.message,
            code=exc.code,
        ), exc.status
    security.start(entered)
    log.info(
        "portal session started",
        extra={"partner": entered.partner.uid, "portal_session": entered.session.id},
    )
    return redirect(url_for("portal.home"))


@blueprint.post("/logout")
@security.session_required
def logout() -> Page:
    current = security.token()
    if current:
        with runtime().db.begin() as session:
            portal.end(session, current)
    security.end()
    g.partner = None  # the page after signing out shows no portal navigation
    return render_template(
        "portal/signed_out.html", reason=portal.ENDED, message=security.ENDED_MESSAGES[portal.ENDED]
    )


# ------------------------------------------------------------------------------ endpoints


# Where a session that does not see the endpoints starts: the first section it sees.
_STARTS = (("deliveries", "portal.deliveries"), ("catalog", "portal.catalog"))


@blueprint.get("/")
@security.session_required
def home() -> Page:
    actor = security.actor()
    scope = security.scope()
    if not scope.shows("endpoints"):
        start = next((view for feature, view in _STARTS if scope.shows(feature)), "portal.verify")
        return redirect(url_for(start))
    with runtime().db.begin() as session:
        rows, next_cursor = endpoints.page(
            session, actor, _uid(), limit=100, cursor=request.args.get("cursor")
        )
        health = endpoints.health(session, actor, rows, since=utcnow() - timedelta(hours=24))
        statuses = endpoints.health_statuses(rows, health)
        failing = [e for e in rows if statuses[e.id] == endpoints.FAILING]
        return render_template(
            "portal/endpoints.html",
            endpoints=rows,
            health=health,
            operational_on=partners.get(session, actor, _uid()).operational_events,
            statuses=statuses,
            failing=failing,
            retrying=endpoints.retrying_counts(session, actor, [e.id for e in failing]),
            next_url=url_for("portal.home", cursor=next_cursor) if next_cursor else None,
        )


@blueprint.post("/operational-events")
@security.session_required
def operational_events() -> WerkzeugResponse:
    """The partner's opt-in to Kurir's operational events about its own endpoints."""
    on = request.form.get("on") == "1"
    with runtime().db.begin() as session:
        partners.set_operational_events(session, security.actor(), _uid(), on)
    flash(
        "Operational events on: endpoints of yours subscribed to them (endpoint.disabled, "
        "delivery.exhausted, …) receive them."
        if on
        else "Operational events off.",
        "ok",
    )
    return redirect(url_for("portal.home"))


def _catalog(session: Any) -> list[event_types.CatalogEntry]:
    return event_types.catalog(session, security.actor())


@blueprint.route("/endpoints/new", methods=["GET", "POST"])
@security.session_required
def endpoint_new() -> Page:
    rt = runtime()
    actor = security.actor()
    if request.method == "GET":
        form = EndpointForm.blank(rt.settings.default_timeout_s)
        with rt.db.begin() as session:
            return render_template(
                "portal/endpoint_form.html", form=form, catalog=_catalog(session), ep=None
            )
    form = EndpointForm.from_request(request.form)
    body = form.body(editing=False)
    with rt.db.begin() as session:
        if body is not None:
            try:
                with session.begin_nested():
                    created = endpoints.create(session, rt, actor, _uid(), body)
                    endpoint_id = created.endpoint.id
                    ed25519 = created.endpoint.signature == SignatureKind.ED25519
            except ValidationFailed as exc:  # a field, or the partner's endpoint limit
                form.refused(exc)
            except RateLimited as exc:  # the form stays filled in, to send again later
                form.refused(exc)
                return (
                    render_template(
                        "portal/endpoint_form.html", form=form, catalog=_catalog(session), ep=None
                    ),
                    429,
                    {"Retry-After": str(exc.retry_after_s)},
                )
            else:
                flash(
                    (
                        "Endpoint created. Its public key is on the Public key tab"
                        if ed25519
                        else "Endpoint created. Its signing secret is on the Secret tab"
                    )
                    + "; send a test event to check that it arrives.",
                    "ok",
                )
                return redirect(url_for("portal.endpoint", endpoint_id=endpoint_id))
        return render_template(
            "portal/endpoint_form.html", form=form, catalog=_catalog(session), ep=None
        ), 422


@blueprint.post("/endpoints/new/filter-test", endpoint="endpoint_filter_test_new")
@blueprint.post("/endpoints/<endpoint_id>/filter-test")
@security.session_required
def endpoint_filter_test(endpoint_id: str | None = None) -> Page:
    """ "Try this filter" in the endpoint form: the form comes back as it was sent, with the
    filter's verdict on the samples (or the reason it is refused); nothing is saved."""
    rt = runtime()
    with rt.db.begin() as session:
        ep = _endpoint(session, endpoint_id) if endpoint_id is not None else None
        form = (
            EndpointForm.from_request(request.form, existing=ep)
            if ep is not None
            else EndpointForm.from_request(request.form)
        )
        try:
            form.tried = filters.try_filter(
                session,
                security.actor(),
                _uid(),
                None,
                form.filter_test_body(),
                event_types_=form.tried_types,
            )
        except ValidationFailed as exc:
            form.refused(exc)
        return render_template(
            "portal/endpoint_form.html", form=form, catalog=_catalog(session), ep=ep
        ), (200 if form.tried is not None else 422)


def _endpoint(session: Any, endpoint_id: str, scope: str = "read") -> Endpoint:
    return endpoints.live(session, security.actor(), _uid(), endpoint_id, scope)


@blueprint.get("/endpoints/<endpoint_id>")
@security.session_required
def endpoint(endpoint_id: str) -> Page:
    actor = security.actor()
    with runtime().db.begin() as session:
        ep = _endpoint(session, endpoint_id)
        health = endpoints.health(session, actor, [ep], since=utcnow() - timedelta(hours=24))
        chart_range = endpoints.chart_range(request.args.get("range"))
        recent = deliveries.page(
            session, actor, deliveries.DeliveryFilter(endpoint=ep.id), limit=5, cursor=None
        )
        feed_url = (
            request.host_url.rstrip("/")
            + f"/v1/partners/{_uid()}/feed?"
            + urlencode({"endpoint": ep.id})
        )
        blocked: list[endpoints.BlockedKey] = []
        more_blocked = None
        if ep.on_dead == "block":  # whatever `ordering` says now: numbered ones stay held
            blocked, more_blocked = endpoints.blocked_keys(
                session, actor, _uid(), ep.id, cursor=None, limit=BLOCKED_KEYS_SHOWN
            )
        return render_template(
            "portal/endpoint.html",
            ep=ep,
            health=health.get(ep.id, endpoints.Health(0, 0)),
            status=endpoints.health_status(ep, health.get(ep.id)),
            series=endpoints.success_series(session, actor, ep, chart_range),
            range_url=lambda r: url_for("portal.endpoint", endpoint_id=ep.id, range=r),
            retrying=endpoints.retrying_counts(session, actor, [ep.id]).get(ep.id, 0),
            may_enable=endpoints.may_enable(actor, ep),
            headers=present.endpoint_headers(ep.headers, ep.public_headers),
            recent=recent,
            blocked=blocked,
            more_blocked=more_blocked is not None,
            parked=endpoints.parked(session, actor, ep),
            expired=feed.expired_backlog(session, runtime().settings, ep),
            pinned=pins.of_endpoint(session, actor, ep),
            lag=feed.lag_of(session, runtime().settings, ep),
            public_key=endpoints.public_key(ep),
            probes=endpoints.probes(session, actor, ep),
            probed=endpoints.is_probed(ep),
            auto_recover_on=runtime().settings.auto_recover,
            verification=verification.status(ep),
            feed_url=feed_url,
            feed_keys=keys.feed_keys(session, actor) if ep.mode == EndpointMode.PULL else [],
            new_key=(
                portal.take_once(runtime().redis, actor, shown)
                if (shown := request.args.get("key")) and ep.mode == EndpointMode.PULL
                else None
            ),
            ack_url=request.host_url.rstrip("/") + f"/v1/partners/{_uid()}/endpoints/{ep.id}/ack",
        )


@blueprint.route("/endpoints/<endpoint_id>/edit", methods=["GET", "POST"])
@security.session_required
def endpoint_edit(endpoint_id: str) -> Page:
    rt = runtime()
    actor = security.actor()
    with rt.db.begin() as session:
        ep = _endpoint(session, endpoint_id, "endpoints:write")
        if request.method == "GET":
            return render_template(
                "portal/endpoint_form.html",
                ep=ep,
                form=EndpointForm.from_endpoint(ep),
                catalog=_catalog(session),
            )
        form = EndpointForm.from_request(request.form, existing=ep)
        body = form.body(editing=True)
        if body is not None:
            try:
                with session.begin_nested():
                    endpoints.update(session, rt, actor, _uid(), endpoint_id, body)
            except ValidationFailed as exc:
                form.refused(exc)
            else:
                flash("Saved. Deliveries from now on use the new settings.", "ok")
                return redirect(url_for("portal.endpoint", endpoint_id=endpoint_id))
        session.refresh(ep)
        return render_template(
            "portal/endpoint_form.html", ep=ep, form=form, catalog=_catalog(session)
        ), 422


@blueprint.post("/endpoints/<endpoint_id>/enable")
@security.session_required
def endpoint_enable(endpoint_id: str) -> WerkzeugResponse:
    actor = security.actor()
    with runtime().db.begin() as session:
        ep = _endpoint(session, endpoint_id, "endpoints:write")
        if endpoints.enable(session, actor, ep, runtime()):
            flash(
                "Enabled. New events are delivered to it again; what was held back while "
                "it was disabled can be resent from this page.",
                "ok",
            )
        else:
            flash("The endpoint is already enabled.", "info")
    return redirect(url_for("portal.endpoint", endpoint_id=endpoint_id))


@blueprint.post("/endpoints/<endpoint_id>/resend-parked")
@security.session_required
def endpoint_resend_parked(endpoint_id: str) -> WerkzeugResponse:
    """Enable (if disabled) and resend what was held back while the endpoint was disabled."""
    rt = runtime()
    with rt.db.begin() as session:
        ep = _endpoint(session, endpoint_id, "endpoints:write")
        enabled, job = endpoints.resend_parked(session, rt, security.actor(), ep)
        total = job.total
    flash(
        f"{'Enabled; r' if enabled else 'R'}esending the {total} event"
        f"{'s' if total != 1 else ''} held back while it was disabled, oldest first. "
        "Follow them in its deliveries.",
        "ok",
    )
    return redirect(url_for("portal.endpoint", endpoint_id=endpoint_id))


@blueprint.post("/endpoints/<endpoint_id>/skip-expired")
@security.session_required
def endpoint_skip_expired(endpoint_id: str) -> WerkzeugResponse:
    """Move a pull endpoint past the events of its backlog that lie beyond retention."""
    rt = runtime()
    with rt.db.begin() as session:
        skipped = feed.skip_expired(
            session, rt.settings, security.actor(), _uid(), endpoint_id
        ).backlog
    if skipped is None:
        flash("Nothing of its backlog lies past retention: nothing was skipped.", "info")
    else:
        flash(
            f"Skipped {skipped.skipped} event(s) past retention; reads without a cursor "
            "go on from the oldest event still kept.",
            "ok",
        )
    return redirect(url_for("portal.endpoint", endpoint_id=endpoint_id))


@blueprint.route("/endpoints/<endpoint_id>/delete", methods=["GET", "POST"])
@security.session_required
def endpoint_delete(endpoint_id: str) -> Page:
    actor = security.actor()
    with runtime().db.begin() as session:
        ep = _endpoint(session, endpoint_id, "endpoints:write")
        if request.method == "GET":
            return render_template("portal/endpoint_delete.html", ep=ep)
        # A pull endpoint has no URL: its id is typed instead.
        if request.form.get("confirm") != (ep.url or ep.id):
            flash(
                "Type the endpoint's URL (a pull endpoint: its id) exactly to confirm the "
                "deletion.",
                "error",
            )
            return redirect(url_for("portal.endpoint_delete", endpoint_id=endpoint_id))
        endpoints.delete(session, actor, _uid(), endpoint_id)
    flash(
        "Endpoint deleted. It receives nothing from now on; its past deliveries stay in the log.",
        "ok",
    )
    return redirect(url_for("portal.home"))


@blueprint.post("/feed-keys")
@security.session_required
def feed_key_create() -> WerkzeugResponse:
    """A feed key for the partner's pull consumer, shown once on the endpoint's page that
    this redirects to (the token waits in Redis, never in the URL)."""
    rt = runtime()
    actor = security.actor()
    endpoint_id = request.form.get("endpoint", "")
    with rt.db.begin() as session:
        _endpoint(session, endpoint_id)
        key, token = keys.create_feed_key(session, actor, request.form.get("name", ""))
        key_id = key.id
        portal.stash_once(rt.redis, actor, key_id, token)
    flash("Feed key made: copy it below now, it is not shown again.", "ok")
    return redirect(url_for("portal.endpoint", endpoint_id=endpoint_id, key=key_id))


@blueprint.post("/feed-keys/<key_id>/revoke")
@security.session_required
def feed_key_revoke(key_id: str) -> WerkzeugResponse:
    with runtime().db.begin() as session:
        key = keys.revoke_feed_key(session, security.actor(), key_id)
        name = key.name
    flash(f"Feed key {name!r} revoked: a consumer using it is refused from now on.", "ok")
    endpoint_id = request.form.get("endpoint", "")
    return redirect(
        url_for("portal.endpoint", endpoint_id=endpoint_id)
        if endpoint_id
        else url_for("portal.home")
    )


# ------------------------------------------------------------------------------ secret


def _secret_page(ep: Endpoint, secret: str | None = None, since: Any = None) -> str:
    return render_template(
        "portal/secret.html",
        ep=ep,
        secret=secret,
        since=since,
        old_until=endpoints.previous_secret_expiry(ep),
        overlap=runtime().settings.secret_rotation_overlap_seconds,
        public_key=endpoints.public_key(ep),
        public_keys=endpoints.public_keys(ep),
    )


@blueprint.get("/endpoints/<endpoint_id>/secret")
@security.session_required
def endpoint_secret(endpoint_id: str) -> Page:
    with runtime().db.begin() as session:
        return _secret_page(_endpoint(session, endpoint_id))


@blueprint.post("/endpoints/<endpoint_id>/secret/reveal")
@security.session_required
def endpoint_secret_reveal(endpoint_id: str) -> Page:
    rt = runtime()
    actor = security.actor()
    with rt.db.begin() as session:
        ep = _endpoint(session, endpoint_id, "endpoints:write")
        row, secret = endpoints.read_secret(session, rt, actor, ep)
        return _secret_page(ep, secret, row.created_at)


@blueprint.post("/endpoints/<endpoint_id>/secret/rotate")
@security.session_required
def endpoint_secret_rotate(endpoint_id: str) -> WerkzeugResponse:
    rt = runtime()
    actor = security.actor()
    with rt.db.begin() as session:
        ep = _endpoint(session, endpoint_id, "endpoints:write")
        # The kind may change here ("switch to Ed25519"): by a rotation, with an overlap.
        switch = request.form.get("signature")
        endpoints.rotate_secret(session, rt, actor, ep, {"signature": switch} if switch else {})
        until = endpoints.previous_secret_expiry(ep)
        ed25519 = ep.signature == SignatureKind.ED25519
    flash(
        (
            "Rotated. Put the new public key below in your receiver"
            if ed25519
            else "Rotated. Reveal the new secret below and put it in your receiver"
        )
        + (f"; the previous key keeps signing until {timeinput.shown(until)}." if until else "."),
        "ok",
    )
    return redirect(url_for("portal.endpoint_secret", endpoint_id=endpoint_id))


@blueprint.post("/endpoints/<endpoint_id>/secret/expire-previous")
@security.session_required
def endpoint_secret_expire_previous(endpoint_id: str) -> WerkzeugResponse:
    """Stop the previous secret now or in an hour, instead of at the end of the overlap."""
    with runtime().db.begin() as session:
        ep = _endpoint(session, endpoint_id, "endpoints:write")
        until = endpoints.expire_previous_secrets(
            session, security.actor(), ep, request.form.get("when", "")
        )
    when = "now" if until <= utcnow() else "at " + timeinput.shown(until)
    flash(f"The previous secret stops signing {when}.", "ok")
    return redirect(url_for("portal.endpoint_secret", endpoint_id=endpoint_id))


# ------------------------------------------------------------------------------ verification


@blueprint.post("/endpoints/<endpoint_id>/verify")
@security.session_required
def endpoint_verify(endpoint_id: str) -> WerkzeugResponse:
    """The partner pastes the challenge its receiver got but could not echo."""
    rt = runtime()
    with rt.db.begin() as session:
        try:
            with session.begin_nested():
                verification.confirm(
                    session,
                    rt,
                    security.actor(),
                    _uid(),
                    endpoint_id,
                    {"challenge": request.form.get("challenge", "").strip()},
                )
        except ValidationFailed as exc:
            flash(exc.message, "error")
        else:
            flash("Verified. Events that waited for it are on their way, in order.", "ok")
    return redirect(url_for("portal.endpoint", endpoint_id=endpoint_id))


@blueprint.post("/endpoints/<endpoint_id>/verify/resend")
@security.session_required
def endpoint_resend_challenge(endpoint_id: str) -> WerkzeugResponse:
    rt = runtime()
    with rt.db.begin() as session:
        verification.resend(session, rt, security.actor(), _uid(), endpoint_id)
    flash("A new challenge is on its way; the previous one no longer counts.", "ok")
    return redirect(url_for("portal.endpoint", endpoint_id=endpoint_id))


# ------------------------------------------------------------------------------ test event


@blueprint.post("/endpoints/<endpoint_id>/recover")
@security.session_required
def endpoint_recover(endpoint_id: str) -> WerkzeugResponse:
    rt = runtime()
    actor = security.actor()
    body = {k: v.strip() for k, v in request.form.items() if k in ("since", "until") and v.strip()}
    try:
        with rt.db.begin() as session:
            ep = _endpoint(session, endpoint_id, "endpoints:write")
            job = endpoints.recover_window(session, rt, actor, ep, body)
            flash(
                f"Resending {job.total} in publish order (operation {job.id}).",
                "ok",
            )
    except (ValidationFailed, Conflict) as exc:
        flash(exc.message, "error")
    return redirect(url_for("portal.endpoint", endpoint_id=endpoint_id))


@blueprint.post("/endpoints/<endpoint_id>/probe")
@security.session_required
def endpoint_probe(endpoint_id: str) -> WerkzeugResponse:
    rt = runtime()
    actor = security.actor()
    with rt.db.begin() as session:
        ep = _endpoint(session, endpoint_id, "endpoints:write")
        endpoints.probe_now(session, rt, actor, ep)
    flash("Probe sent. Its answer shows on this page when it comes back.", "ok")
    return redirect(url_for("portal.endpoint", endpoint_id=endpoint_id))


@blueprint.post("/endpoints/<endpoint_id>/test")
@security.session_required
def endpoint_test(endpoint_id: str) -> WerkzeugResponse:
    rt = runtime()
    actor = security.actor()
    with rt.db.begin() as session:
        ep = _endpoint(session, endpoint_id, "endpoints:write")
        delivery_id = endpoints.send_test(session, rt, actor, ep).id
    return redirect(url_for("portal.delivery", delivery_id=delivery_id))


# ------------------------------------------------------------------------------ deliveries


@blueprint.get("/deliveries", endpoint="deliveries")
@security.session_required
def deliveries_page() -> Page:
    actor = security.actor()
    with runtime().db.begin() as session:
        rows, _ = endpoints.page(session, actor, _uid(), limit=100, cursor=None)
        endpoint_id = request.args.get("endpoint", "").strip()
        context = log_context(session, actor, request.args, list_url=_deliveries_url)
        return render_template(
            "portal/deliveries.html",
            endpoints=rows,
            types=[entry.name for entry in _catalog(session)],
            current=endpoint_id,
            **context,
        )


@blueprint.get("/deliveries/<delivery_id>")
@security.session_required
def delivery(delivery_id: str) -> Page:
    with runtime().db.begin() as session:
        found = deliveries.detail(session, security.actor(), delivery_id)
        running = found.on_its_way
        return render_template(
            "portal/delivery.html",
            d=found,
            attempts=present.attempt_views(found.attempts),
            body=present.body_view(found.sent),
            running=running,
            refresh_s=REFRESH_S,
        )


@blueprint.post("/deliveries/<delivery_id>/resend")
@security.session_required
def delivery_resend(delivery_id: str) -> WerkzeugResponse:
    rt = runtime()
    with rt.db.begin() as session:
        held = deliveries.retry(session, rt, security.actor(), delivery_id)
    if held is not None:
        flash(
            f"Not sent: it waits behind event {held.event_id} of the same ordering key, which "
            "was not delivered. Resend that one first.",
            "error",
        )
        return redirect(url_for("portal.delivery", delivery_id=delivery_id))
    flash("Resent: it goes out again now, with the same webhook-id and a fresh signature.", "ok")
    return redirect(url_for("portal.delivery", delivery_id=delivery_id))


# ------------------------------------------------------------------------------ catalog, guide


@blueprint.get("/catalog")
@security.session_required
def catalog() -> Page:
    with runtime().db.begin() as session:
        entries = _catalog(session)
        examples = {
            row.id: json.dumps(
                guide.envelope(row, event_types.example(row), _uid()), indent=2, ensure_ascii=False
            )
            for entry in entries
            for row in entry.versions
        }
        return render_template(
            "portal/catalog.html",
            entries=entries,
            examples=examples,
            dumps=lambda v: json.dumps(v, indent=2, ensure_ascii=False),
        )


@blueprint.get("/verify")
@security.session_required
def verify() -> Page:
    actor = security.actor()
    with runtime().db.begin() as session:
        rows, _ = endpoints.page(session, actor, _uid(), limit=100, cursor=None)
        chosen_id = request.args.get("endpoint") or (rows[0].id if rows else None)
        chosen = _endpoint(session, chosen_id) if chosen_id else None
        signature = chosen.signature if chosen is not None else SignatureKind.HMAC
        if signature == SignatureKind.ED25519:
            # Public: named in full, and nothing to reveal.
            hint = endpoints.public_key(chosen) if chosen is not None else None
        else:
            hint = guide.secret_hint(
                endpoints.secret_prefix(session, runtime(), actor, chosen)
                if chosen is not None
                else None
            )
        return render_template(
            "portal/verify.html",
            endpoints=rows,
            chosen=chosen,
            public_key=hint if signature == SignatureKind.ED25519 else None,
            snippets=guide.snippets(hint, signature),
            headers=guide.headers(signature),
        )
