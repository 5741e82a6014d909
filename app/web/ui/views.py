"""The operator pages: dashboard, dead letters, endpoints, events, inbound events.

Views parse the form, call the same services the API calls (`app.services`, acting as
`operator:<email>`), and render; errors from those services become flash messages, never a
JSON body. Every state change is a POST answered by a redirect to a page that is safe to
reload.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from flask import (
    Blueprint,
    flash,
    g,
    redirect,
    render_template,
    request,
    url_for,
)
from sqlalchemy import select
from werkzeug.wrappers import Response as WerkzeugResponse

from app.clock import isoformat, utcnow
from app.errors import KurirError, NotFound, ValidationFailed
from app.models import (
    DL_OPEN,
    DL_STATES,
    INBOUND_STATUSES,
    Attempt,
    DeadLetter,
    Endpoint,
    Event,
    OperationalEvent,
    Partner,
)
from app.pagination import parse_limit
from app.services import (
    audit,
    dead_letters,
    endpoints,
    event_types,
    events,
    feed,
    operators,
    partners,
    pins,
    sources,
)
from app.services.dead_letters import FILTER_KEYS, DeadLetterFilter
from app.services.deliveries import delivered_version
from app.services.metrics import queue_stats
from app.web import csrf, error_pages, present
from app.web.context import runtime
from app.web.endpoint_form import EndpointForm
from app.web.jsonio import check_url_and_headers
from app.web.ui import security, stats
from app.web.ui.throttle import LoginThrottle

log = logging.getLogger(__name__)

blueprint = Blueprint("ui", __name__, url_prefix="/ui")

KNOWN_REASONS = ("retries_exhausted", "endpoint_disabled", "blocked_address", "endpoint_gone",
                 "endpoint_deleted")
PAGE_SIZES = (25, 50, 100, 250)
# Blocked ordering keys shown on an endpoint's page; the API lists them all.
BLOCKED_KEYS_SHOWN = 50

Page = str | WerkzeugResponse | tuple[str, int] | tuple[str, int, dict[str, str]]


# ------------------------------------------------------------------------------ plumbing


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
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    response.headers.setdefault("Cache-Control", "no-store")
    return response


@blueprint.context_processor
def _template_globals() -> dict[str, Any]:
    return {"csrf_token": csrf.csrf_token, "ago": present.ago,
            "isoformat": isoformat, "operator_email": g.get("operator_email"),
            "duration": present.duration, "dead_letters_url": dead_letters_url,
            "delivery_url": lambda delivery_id: url_for("ui.delivery", delivery_id=delivery_id),
            "endpoint_url": lambda endpoint_id: url_for("ui.endpoint", endpoint_id=endpoint_id),
            "deliveries_url": _deliveries_url}


def _deliveries_url(**params: Any) -> str:
    query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
    return url_for("ui.deliveries") + (f"?{query}" if query else "")


def dead_letters_url(**params: Any) -> str:
    """The list URL for these filters (`endpoint` cannot go through url_for's keywords)."""
    query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
    return url_for("ui.dead_letters") + (f"?{query}" if query else "")


def _back(default: str) -> WerkzeugResponse:
    target = request.form.get("back") or request.referrer or ""
    if target.startswith(request.host_url):
        target = "/" + target[len(request.host_url):]
    return redirect(security.safe_next(target) if target.startswith("/ui") else default)


@blueprint.errorhandler(KurirError)
def _kurir_error(exc: KurirError) -> Page:
    if request.method == "POST":
        flash(exc.message, "error")
        return _back(url_for("ui.dashboard"))
    return render_template("ui/error.html", status=exc.status, title="Cannot show this page",
                           message=exc.message), exc.status


error_pages.register(blueprint, "ui/error.html", page="Kurir", speaker="Kurir")


def _ui_filter_args() -> dict[str, str]:
    """The dead-letter filter as the form shows it; `state` defaults to open."""
    args = {key: request.args.get(key, "").strip() for key in FILTER_KEYS}
    if "state" not in request.args:
        args["state"] = DL_OPEN
    return args


def _filter_form(args: dict[str, str]) -> dead_letters.FilterForm:
    params = {k: v for k, v in args.items() if v and not (k == "state" and v == "any")}
    return dead_letters.parse_filter(params)


# ------------------------------------------------------------------------------ session


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


# ------------------------------------------------------------------------------ dashboard


@blueprint.get("/")
@security.login_required
def dashboard() -> Page:
    rt = runtime()
    try:
        queues = queue_stats(rt.redis)
        queue_error = None
    except Exception as exc:  # Redis down must not take the dashboard with it
        queues, queue_error = [], f"Redis is not reachable ({type(exc).__name__})"
    with rt.db.begin() as session:
        disabled = stats.disabled_endpoints(session)
        return render_template(
            "ui/dashboard.html",
            chart=stats.deliveries_by_hour(session),
            in_flight=stats.in_flight(session),
            open_letters=stats.open_dead_letters(session),
            quarantined=stats.quarantined_inbound(session),
            disabled=disabled,
            partners=partners.uids(session, {e.partner_id for e in disabled}),
            events=stats.recent_operational_events(session),
            blocked=endpoints.blocked_key_counts(session),
            queues=queues, queue_error=queue_error)


# ------------------------------------------------------------------------------ dead letters


@blueprint.get("/dead-letters", endpoint="dead_letters")
@security.login_required
def dead_letters_page() -> Page:
    args = _ui_filter_args()
    form = _filter_form(args)
    if not form.valid:
        flash("Some filters cannot be read; they are marked below. The other criteria are "
              "applied, and bulk actions stay off until every field is valid.", "error")
    flt = form.filter
    limit = parse_limit(request.args.get("limit") or "50")
    cursor = request.args.get("cursor") or None
    actor = security.actor()
    with runtime().db.begin() as session:
        page = dead_letters.page(session, actor, flt, limit=limit, cursor=cursor, options=())
        matching = dead_letters.matching(session, actor, flt)
        any_open = matching > 0 or dead_letters.open_dead_letter_exists(session, actor)
        query = {k: v for k, v in args.items() if v}
        return render_template(
            "ui/dead_letters.html", page=page, args=args, flt=flt, matching=matching,
            errors=form.errors, any_open=any_open, limit=limit, cursor=cursor,
            states=DL_STATES, reasons=KNOWN_REASONS, page_sizes=PAGE_SIZES,
            next_url=(dead_letters_url(**query, limit=limit, cursor=page.next_cursor)
                      if page.next_cursor else None),
            first_url=dead_letters_url(**query, limit=limit) if cursor else None,
            filter_params=flt.to_params(), filtered=not flt.with_state(None).is_empty())


@blueprint.post("/dead-letters/bulk")
@security.login_required
def dead_letters_bulk() -> WerkzeugResponse:
    ids = list(dict.fromkeys(request.form.getlist("ids")))
    action = request.form.get("action")
    back = _back(url_for("ui.dead_letters"))
    if not ids:
        flash("Select at least one dead letter first.", "error")
        return back
    rt = runtime()
    actor = security.actor()
    force = request.form.get("force") == "1"
    if action == "resend":
        with rt.db.begin() as session:
            outcome = dead_letters.resend_ids(session, rt, actor, ids, force=force)
            op_id = outcome.job.id
        if not outcome.inline:
            flash(f"Resending {len(ids)} dead letters in the background.", "ok")
            return redirect(url_for("ui.job", op_id=op_id))
        _flash_resend(len(outcome.resent), outcome.skipped)
        return back
    if action == "discard":
        note = request.form.get("note", "")
        done = 0
        for letter_id in ids:
            try:
                with rt.db.begin() as session:
                    dead_letters.discard(session, actor, letter_id, note=note, rt=rt)
                done += 1
            except KurirError:
                pass
        flash(f"Discarded {done} dead letter{'s' if done != 1 else ''}"
              + (f"; {len(ids) - done} were no longer open." if done < len(ids) else "."),
              "ok" if done else "error")
        return back
    flash("Choose an action: resend or discard.", "error")
    return back


def _flash_resend(resent: int, skipped: dict[str, str]) -> None:
    if resent:
        flash(f"Resent {resent} dead letter{'s' if resent != 1 else ''}.", "ok")
    if skipped:
        reasons: dict[str, int] = {}
        for reason in skipped.values():
            reasons[reason] = reasons.get(reason, 0) + 1
        text = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in reasons.items())
        hint = (" Enable the endpoint first, or tick “resend even to disabled endpoints”."
                if dead_letters.ENDPOINT_DISABLED in reasons else "")
        flash(f"Not resent: {text}.{hint}", "error")


@blueprint.post("/dead-letters/resend-matching")
@security.login_required
def dead_letters_resend_matching() -> WerkzeugResponse:
    params = {k: request.form.get(k, "") for k in FILTER_KEYS if request.form.get(k)}
    params["state"] = DL_OPEN
    form = dead_letters.parse_filter(params)
    back = dead_letters_url(**{k: v for k, v in params.items() if k != "state"})
    if not form.valid:
        # Acting on the fields that did parse would resend more than was asked for.
        flash("Not resent: " + "; ".join(f"{k} {m}" for k, m in form.errors.items())
              + ". Fix the filter first.", "error")
        return redirect(back)
    if form.filter.with_state(None).is_empty() and request.form.get("all") != "1":
        # As in the API: "everything" is said outright, never implied by missing criteria.
        flash("Not resent: no search criteria were given. To resend every open dead letter, "
              "use \"Resend all matching\" on the unfiltered list.", "error")
        return redirect(url_for("ui.dead_letters"))
    rt = runtime()
    with rt.db.begin() as session:
        op = dead_letters.resend_matching(session, rt, security.actor(), form,
                                          everything=request.form.get("all") == "1",
                                          force=request.form.get("force") == "1")
        op_id, total = op.id, op.total
    flash(f"Resending {total} dead letter{'s' if total != 1 else ''} in the background.", "ok")
    return redirect(url_for("ui.job", op_id=op_id))


@blueprint.get("/dead-letters/<letter_id>")
@security.login_required
def dead_letter(letter_id: str) -> Page:
    with runtime().db.begin() as session:
        letter, uid = dead_letters.get(session, security.actor(), letter_id)
        delivery = letter.delivery
        event = session.get_one(Event, letter.event_id)
        endpoint = session.get_one(Endpoint, letter.endpoint_id)
        partner = session.get_one(Partner, letter.partner_id)
        attempts = dead_letters.attempts(session, letter, newest_first=True)
        return render_template(
            "ui/dead_letter.html", letter=letter, delivery=delivery, event=event,
            endpoint=endpoint, partner=partner,
            body=present.body_view(dead_letters.sent(session, letter)),
            fate=dead_letters.fate(session, letter), attempts=present.attempt_views(attempts))


@blueprint.post("/dead-letters/<letter_id>/resend")
@security.login_required
def dead_letter_resend(letter_id: str) -> WerkzeugResponse:
    rt = runtime()
    actor = security.actor()
    enabled = False
    with rt.db.begin() as session:
        found, _ = dead_letters.get(session, actor, letter_id)
        if request.form.get("enable") == "1":
            ep = endpoints.by_id(session, actor, found.endpoint_id, "endpoints:write")
            if ep.deleted_at is None:
                enabled = endpoints.enable(session, actor, ep)
        letter = dead_letters.resend_one(session, rt, actor, letter_id,
                                         force=request.form.get("force") == "1")
        run = letter.delivery.run
    flash(("Endpoint enabled. " if enabled else "")
          + f"Resent: the delivery starts run {run} with a fresh retry budget.", "ok")
    return redirect(url_for("ui.dead_letter", letter_id=letter_id))


@blueprint.post("/dead-letters/<letter_id>/discard")
@security.login_required
def dead_letter_discard(letter_id: str) -> WerkzeugResponse:
    rt = runtime()
    with rt.db.begin() as session:
        dead_letters.discard(session, security.actor(), letter_id,
                             note=request.form.get("note", ""), rt=rt)
    flash("Discarded. It stays searchable, and will not be resent.", "ok")
    return redirect(url_for("ui.dead_letter", letter_id=letter_id))


@blueprint.get("/jobs/<op_id>")
@security.login_required
def job(op_id: str) -> Page:
    with runtime().db.begin() as session:
        op = dead_letters.job(session, security.actor(), op_id)
        flt = DeadLetterFilter.from_params(op.params.get("filter") or {})
        outcomes = dead_letters.job_outcomes(session, security.actor(), op)
        return render_template("ui/job.html", op=op, flt=flt, outcomes=outcomes,
                               skipped=op.params.get("skipped") or {},
                               running=op.state in ("pending", "running")
                               or outcomes.in_progress > 0)


# ------------------------------------------------------------------------------ endpoints


@blueprint.get("/endpoints", endpoint="endpoints")
@security.login_required
def endpoints_page() -> Page:
    state = request.args.get("state", "")
    partner_uid = request.args.get("partner", "").strip()
    limit = parse_limit(request.args.get("limit") or "50")
    actor = security.actor()
    with runtime().db.begin() as session:
        try:
            rows, next_cursor = endpoints.page(
                session, actor, partner_uid or None,
                state=state if state in ("enabled", "disabled") else None,
                limit=limit, cursor=request.args.get("cursor"))
        except NotFound:
            flash(f"There is no partner {partner_uid!r}.", "error")
            rows, next_cursor = [], None
        ids = [e.id for e in rows]
        query: dict[str, Any] = {k: v for k, v in {"state": state,
                                                   "partner": partner_uid}.items() if v}
        return render_template(
            "ui/endpoints.html", endpoints=rows, state=state, partner=partner_uid,
            partners=partners.uids(session, {e.partner_id for e in rows}),
            health=stats.endpoint_health(session, ids, since=utcnow() - timedelta(hours=24)),
            open_letters=stats.open_letters_by_endpoint(session, ids),
            next_url=(url_for("ui.endpoints", **query, cursor=next_cursor)
                      if next_cursor else None),
            any_endpoint=bool(rows) or bool(session.scalar(select(Endpoint.id).limit(1))))


@blueprint.get("/endpoints/<endpoint_id>")
@security.login_required
def endpoint(endpoint_id: str) -> Page:
    actor = security.actor()
    with runtime().db.begin() as session:
        ep = endpoints.by_id(session, actor, endpoint_id)
        partner = session.get_one(Partner, ep.partner_id)
        parked = endpoints.parked(session, actor, ep) if ep.deleted_at is None else None
        health = stats.endpoint_health(session, [ep.id], since=utcnow() - timedelta(hours=24))
        recent = list(session.scalars(
            select(OperationalEvent).where(OperationalEvent.subject_id == ep.id)
            .order_by(OperationalEvent.id.desc()).limit(10)))
        trail, _ = audit.search(session, actor, subject_id=ep.id, limit=10)
        blocked: list[endpoints.BlockedKey] = []
        more_blocked = None
        # Whatever `ordering` says now: the gate holds every numbered delivery.
        if ep.on_dead == "block" and ep.deleted_at is None:
            blocked, more_blocked = endpoints.blocked_keys(
                session, actor, partner.uid, ep.id, cursor=None, limit=BLOCKED_KEYS_SHOWN)
        return render_template(
            "ui/endpoint.html", ep=ep, partner=partner, parked=parked,
            blocked=blocked, more_blocked=more_blocked is not None,
            health=health.get(ep.id, stats.Health(0, 0)), recent=recent, trail=trail,
            headers=present.endpoint_headers(ep.headers, ep.public_headers),
            lag=feed.lag_of(session, runtime().settings, ep),
            pinned=pins.of_endpoint(session, actor, ep),
            open_letters=stats.open_letters_by_endpoint(session, [ep.id]).get(ep.id, 0))


@blueprint.post("/endpoints/<endpoint_id>/enable")
@security.login_required
def endpoint_enable(endpoint_id: str) -> WerkzeugResponse:
    actor = security.actor()
    with runtime().db.begin() as session:
        ep = endpoints.by_id(session, actor, endpoint_id, "endpoints:write")
        if endpoints.enable(session, actor, ep):
            parked = endpoints.parked(session, actor, ep)
            if parked.holds_keys:
                flash(f"Enabled. The {parked.letters} dead letter(s) parked while it was "
                      "disabled hold their ordering keys (on_dead: block): nothing more of "
                      "those keys is sent until they are resent — use “Resend everything "
                      "parked” below.", "info")
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
    flash("Rotated. The new secret is below; the old one keeps signing during the overlap.",
          "ok")
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
        row, secret = endpoints.read_secret(session, rt, actor, ep)
        partner = session.get_one(Partner, ep.partner_id)
        return render_template("ui/secret.html", ep=ep, partner=partner, secret=secret,
                               since=row.created_at,
                               old_until=endpoints.previous_secret_expiry(ep))


@blueprint.post("/endpoints/<endpoint_id>/resend-parked")
@security.login_required
def endpoint_resend_parked(endpoint_id: str) -> WerkzeugResponse:
    rt = runtime()
    actor = security.actor()
    with rt.db.begin() as session:
        ep = endpoints.by_id(session, actor, endpoint_id, "endpoints:write")
        enabled, op = endpoints.resend_parked(session, rt, actor, ep)
        op_id, total = op.id, op.total
    flash(f"{'Endpoint enabled; r' if enabled else 'R'}esending {total} parked dead letter"
          f"{'s' if total != 1 else ''}.", "ok")
    return redirect(url_for("ui.job", op_id=op_id))


@blueprint.post("/endpoints/<endpoint_id>/skip-expired")
@security.login_required
def endpoint_skip_expired(endpoint_id: str) -> WerkzeugResponse:
    """Move a pull endpoint past the events of its backlog that lie beyond retention."""
    rt = runtime()
    actor = security.actor()
    with rt.db.begin() as session:
        ep = endpoints.by_id(session, actor, endpoint_id, "endpoints:write")
        partner = session.get_one(Partner, ep.partner_id)
        skipped = feed.skip_expired(session, rt.settings, actor, partner.uid, ep.id).backlog
    if skipped is None:
        flash("Nothing of its backlog lies past retention: nothing was skipped.", "info")
    else:
        flash(f"Skipped {skipped.skipped} event(s) past retention (the oldest "
              f"{skipped.oldest_event}); its reads go on from the oldest event kept.", "ok")
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
        partner = session.get_one(Partner, ep.partner_id)
        catalog = event_types.catalog(session, actor)
        if request.method == "GET":
            return render_template("ui/endpoint_edit.html", ep=ep, partner=partner,
                                   form=EndpointForm.from_endpoint(ep), catalog=catalog)
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
        return render_template("ui/endpoint_edit.html", ep=ep, partner=partner, form=form,
                               catalog=catalog), 422


@blueprint.post("/endpoints/<endpoint_id>/test")
@security.login_required
def endpoint_test(endpoint_id: str) -> WerkzeugResponse:
    rt = runtime()
    actor = security.actor()
    with rt.db.begin() as session:
        ep = endpoints.by_id(session, actor, endpoint_id, "endpoints:write")
        delivery_id = endpoints.send_test(session, rt, actor, ep).id
    flash("Test event sent (kurir.test, to this endpoint only). This page shows its attempt "
          "when it ends.", "ok")
    return redirect(url_for("ui.delivery", delivery_id=delivery_id))


# ------------------------------------------------------------------------------ contracts


@blueprint.get("/contracts")
@security.login_required
def contracts() -> Page:
    with runtime().db.begin() as session:
        return render_template("ui/contracts.html",
                               catalog=event_types.catalog(session, security.actor()))


# ------------------------------------------------------------------------------ events


@blueprint.get("/events/<event_id>")
@security.login_required
def event(event_id: str) -> Page:
    with runtime().db.begin() as session:
        ev, _uid = events.get(session, security.actor(), event_id)
        partner = session.get_one(Partner, ev.partner_id)
        deliveries = list(ev.deliveries)
        endpoints_by_id = {e.id: e for e in session.scalars(select(Endpoint).where(
            Endpoint.id.in_([d.endpoint_id for d in deliveries])))} if deliveries else {}
        letters = {dl.delivery_id: dl for dl in session.scalars(
            select(DeadLetter).where(DeadLetter.event_id == ev.id)
            .order_by(DeadLetter.id))}
        attempts: dict[str, list[Attempt]] = {d.id: list(d.attempts) for d in deliveries}
        # Each endpoint got the version it was pinned to, which may not be the one published.
        versions = {d.id: delivered_version(d, ev.version) for d in deliveries}
        return render_template("ui/event.html", ev=ev, partner=partner, deliveries=deliveries,
                               endpoints=endpoints_by_id, letters=letters, attempts=attempts,
                               versions=versions, payload=present.pretty_json(ev.payload))


# ------------------------------------------------------------------------------ inbound


@blueprint.get("/inbound")
@security.login_required
def inbound() -> Page:
    status = request.args.get("status", "")
    source_name = request.args.get("source", "").strip()
    resource_id = request.args.get("resource_id", "").strip()
    limit = parse_limit(request.args.get("limit") or "50")
    actor = security.actor()
    with runtime().db.begin() as session:
        names = {s.id: s.name for s in sources.every(session, actor)}
        try:
            rows, next_cursor, _ = sources.event_page(
                session, actor, source=source_name or None,
                status=status if status in INBOUND_STATUSES else None,
                resource_id=resource_id or None, limit=limit,
                cursor=request.args.get("cursor"))
        except NotFound:
            flash(f"There is no source {source_name!r}.", "error")
            rows, next_cursor = [], None
        query: dict[str, Any] = {k: v for k, v in {"status": status, "source": source_name,
                                                   "resource_id": resource_id}.items() if v}
        return render_template(
            "ui/inbound.html", rows=rows, status=status, source=source_name,
            resource_id=resource_id, sources=names, statuses=INBOUND_STATUSES,
            counts=stats.inbound_by_status(session), can_replay=True,
            next_url=(url_for("ui.inbound", **query, cursor=next_cursor)
                      if next_cursor else None))


@blueprint.post("/inbound/<inbound_id>/replay")
@security.login_required
def inbound_replay_view(inbound_id: str) -> WerkzeugResponse:
    rt = runtime()
    with rt.db.begin() as session:
        sources.replay(session, rt, security.actor(), inbound_id)
    flash(f"Replaying {inbound_id}: it is queued for processing again.", "ok")
    return _back(url_for("ui.inbound"))


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


blueprint.add_app_template_filter(dumps, "dumps")
blueprint.add_app_template_filter(lambda n: f"{n:,}", "thousands")
