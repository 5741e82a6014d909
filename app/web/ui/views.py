"""The operator pages (SPEC §8): dashboard, dead letters, endpoints, events, inbound events.

Views parse the form, call the same services the API calls (`dlq.*`, `sender.endpoints`),
and render; errors from those services become flash messages, never a JSON body.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from flask import (
    Blueprint,
    abort,
    flash,
    g,
    redirect,
    render_template,
    request,
    url_for,
)
from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response as WerkzeugResponse

from app.accounts import verify_operator
from app.clock import isoformat, parse_time, utcnow
from app.errors import KurirError, NotFound
from app.models import (
    DL_OPEN,
    INBOUND_STATUSES,
    Attempt,
    BulkOperation,
    DeadLetter,
    Delivery,
    Endpoint,
    Event,
    InboundEvent,
    InboundSource,
    OperationalEvent,
    Partner,
)
from app.pagination import paginate, parse_limit
from app.web.context import runtime
from app.web.jsonio import check_url_and_headers
from app.web.metrics import queue_stats
from app.web.ui import present, security, stats
from app.web.ui.throttle import LoginThrottle
from dlq import discard as discard_mod
from dlq import resend as resend_mod
from dlq.search import DL_STATES, FILTER_KEYS, DeadLetterFilter, count, search

log = logging.getLogger(__name__)

blueprint = Blueprint("ui", __name__, url_prefix="/ui")

KNOWN_REASONS = ("retries_exhausted", "endpoint_disabled", "blocked_address", "endpoint_gone",
                 "endpoint_deleted")
PAGE_SIZES = (25, 50, 100, 250)

inbound_replay: Callable[..., Any] | None
try:  # the inbound subsystem may be absent from a trimmed build
    from app.inbound.replay import replay as inbound_replay
except ImportError:  # pragma: no cover - depends on what is installed
    inbound_replay = None

Page = str | WerkzeugResponse | tuple[str, int] | tuple[str, int, dict[str, str]]


# ------------------------------------------------------------------------------ plumbing


@blueprint.before_request
def _csrf() -> None:
    security.check_csrf()
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
    return {"csrf_token": security.csrf_token, "ago": present.ago,
            "isoformat": isoformat, "operator_email": g.get("operator_email"),
            "duration": present.duration, "dead_letters_url": dead_letters_url}


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


@blueprint.errorhandler(HTTPException)
def _http_error(exc: HTTPException) -> Page:
    status = exc.code or 500
    if status == 400 and exc.description == "csrf":
        return render_template(
            "ui/error.html", status=400, title="This form has expired",
            message="The form was not sent from a current Kurir page (its CSRF token is "
                    "missing or wrong), so nothing was changed. Reload the page and try "
                    "again."), 400
    return render_template("ui/error.html", status=status, title=exc.name,
                           message=exc.description), status


@blueprint.errorhandler(Exception)
def _unexpected(exc: Exception) -> Page:
    log.error("unhandled error on %s %s", request.method, request.path, exc_info=exc)
    return render_template("ui/error.html", status=500, title="Something went wrong",
                           message="Kurir hit an internal error; it is logged. Nothing was "
                                   "changed by the failed request."), 500


def _ui_filter_args() -> dict[str, str]:
    """The dead-letter filter as the form shows it; `state` defaults to open."""
    args = {key: request.args.get(key, "").strip() for key in FILTER_KEYS}
    if "state" not in request.args:
        args["state"] = DL_OPEN
    return args


def _filter_from(args: dict[str, str]) -> DeadLetterFilter:
    params = {k: v for k, v in args.items() if v and not (k == "state" and v == "any")}
    return DeadLetterFilter.from_params(params)


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
    wait_s = throttle.retry_after(email, client)
    if wait_s:
        # Refused before the password is looked at: a locked account is no oracle either.
        minutes = -(-wait_s // 60)
        flash(f"Too many failed sign-ins. Try again in {minutes} minute(s).", "error")
        log.warning("sign-in throttled", extra={"client": client})
        page = render_template("ui/login.html", next=next_url, email=email)
        return page, 429, {"Retry-After": str(wait_s)}
    with runtime().db.begin() as session:
        operator = verify_operator(session, email, password) if email and password else None
        if operator is not None:
            security.start_session(operator)
    if operator is None:
        throttle.failed(email, client)
        flash("Wrong email or password.", "error")
        return render_template("ui/login.html", next=next_url, email=email), 401
    throttle.succeeded(email)
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
        return render_template(
            "ui/dashboard.html",
            chart=stats.deliveries_by_hour(session),
            in_flight=stats.in_flight(session),
            open_letters=stats.open_dead_letters(session),
            quarantined=stats.quarantined_inbound(session),
            disabled=stats.disabled_endpoints(session),
            partners=_partner_uids(session, None),
            events=stats.recent_operational_events(session),
            queues=queues, queue_error=queue_error)


def _partner_uids(session: Session, partner_ids: set[str] | None) -> dict[str, str]:
    stmt = select(Partner.id, Partner.uid)
    if partner_ids is not None:
        if not partner_ids:
            return {}
        stmt = stmt.where(Partner.id.in_(partner_ids))
    else:
        stmt = stmt.join(Endpoint, Endpoint.partner_id == Partner.id).where(
            Endpoint.state == "disabled")
    return {pid: uid for pid, uid in session.execute(stmt)}


# ------------------------------------------------------------------------------ dead letters


@blueprint.get("/dead-letters")
@security.login_required
def dead_letters() -> Page:
    args = _ui_filter_args()
    try:
        flt = _filter_from(args)
    except KurirError as exc:
        flash(exc.message, "error")
        flt, args = DeadLetterFilter(state=DL_OPEN), {**args, "state": DL_OPEN}
    limit = parse_limit(request.args.get("limit") or "50")
    cursor = request.args.get("cursor") or None
    with runtime().db.begin() as session:
        page = search(session, flt, limit=limit, cursor=cursor)
        matching = count(session, flt)
        any_open = matching > 0 or bool(session.scalar(
            select(DeadLetter.id).where(DeadLetter.state == DL_OPEN).limit(1)))
        query = {k: v for k, v in args.items() if v}
        return render_template(
            "ui/dead_letters.html", page=page, args=args, flt=flt, matching=matching,
            any_open=any_open, limit=limit, cursor=cursor, states=DL_STATES,
            reasons=KNOWN_REASONS, page_sizes=PAGE_SIZES,
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
    force = request.form.get("force") == "1"
    if action == "resend":
        if len(ids) > resend_mod.INLINE_LIMIT:
            with rt.db.begin() as session:
                op = resend_mod.start_bulk(session, actor=security.actor(), ids=ids,
                                           force=force, connection=rt.redis)
                op_id = op.id
            flash(f"Resending {len(ids)} dead letters in the background.", "ok")
            return redirect(url_for("ui.job", op_id=op_id))
        with rt.db.begin() as session:
            result = resend_mod.resend_ids_inline(session, rt.redis, ids,
                                                  actor=security.actor(), force=force)
        _flash_resend(len(result.resent), result.skipped)
        return back
    if action == "discard":
        note = request.form.get("note", "")
        done = 0
        for letter_id in ids:
            try:
                with rt.db.begin() as session:
                    discard_mod.discard(session, letter_id, actor=security.actor(), note=note)
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
                if resend_mod.ENDPOINT_DISABLED in reasons else "")
        flash(f"Not resent: {text}.{hint}", "error")


@blueprint.post("/dead-letters/resend-matching")
@security.login_required
def dead_letters_resend_matching() -> WerkzeugResponse:
    params = {k: request.form.get(k, "") for k in FILTER_KEYS if request.form.get(k)}
    params["state"] = DL_OPEN
    flt = DeadLetterFilter.from_params(params)
    if flt.with_state(None).is_empty() and request.form.get("all") != "1":
        # As in the API: "everything" is said outright, never implied by missing criteria.
        flash("Not resent: no search criteria were given. To resend every open dead letter, "
              "use \"Resend all matching\" on the unfiltered list.", "error")
        return redirect(url_for("ui.dead_letters"))
    rt = runtime()
    with rt.db.begin() as session:
        op = resend_mod.start_bulk(session, actor=security.actor(), flt=flt,
                                   force=request.form.get("force") == "1", connection=rt.redis)
        op_id, total = op.id, op.total
    flash(f"Resending {total} dead letter{'s' if total != 1 else ''} in the background.", "ok")
    return redirect(url_for("ui.job", op_id=op_id))


@blueprint.get("/dead-letters/<letter_id>")
@security.login_required
def dead_letter(letter_id: str) -> Page:
    with runtime().db.begin() as session:
        letter = session.scalar(select(DeadLetter).where(DeadLetter.id == letter_id)
                                .options(selectinload(DeadLetter.audit)))
        if letter is None:
            raise NotFound(f"There is no dead letter {letter_id}.")
        delivery = session.get_one(Delivery, letter.delivery_id)
        event = session.get_one(Event, letter.event_id)
        endpoint = session.get_one(Endpoint, letter.endpoint_id)
        partner = session.get_one(Partner, letter.partner_id)
        attempts = list(session.scalars(select(Attempt).where(
            Attempt.delivery_id == delivery.id).order_by(Attempt.n.desc())))
        return render_template(
            "ui/dead_letter.html", letter=letter, delivery=delivery, event=event,
            endpoint=endpoint, partner=partner, payload=present.pretty_json(event.payload),
            attempts=[{"row": a, "headers": present.shown_headers(a.request_headers),
                       "body": present.pretty_json(a.response_body)} for a in attempts])


@blueprint.post("/dead-letters/<letter_id>/resend")
@security.login_required
def dead_letter_resend(letter_id: str) -> WerkzeugResponse:
    rt = runtime()
    enabled = False
    with rt.db.begin() as session:
        found = session.get(DeadLetter, letter_id)
        if found is None:
            raise NotFound(f"There is no dead letter {letter_id}.")
        if request.form.get("enable") == "1":
            ep = _get_endpoint(session, found.endpoint_id)
            if ep.state == "disabled" and ep.deleted_at is None:
                _enable(session, ep)
                enabled = True
        letter = resend_mod.resend_one(session, rt.redis, letter_id, actor=security.actor(),
                                       force=request.form.get("force") == "1")
        run = letter.delivery.run
    flash(("Endpoint enabled. " if enabled else "")
          + f"Resent: the delivery starts run {run} with a fresh retry budget.", "ok")
    return redirect(url_for("ui.dead_letter", letter_id=letter_id))


@blueprint.post("/dead-letters/<letter_id>/discard")
@security.login_required
def dead_letter_discard(letter_id: str) -> WerkzeugResponse:
    with runtime().db.begin() as session:
        discard_mod.discard(session, letter_id, actor=security.actor(),
                            note=request.form.get("note", ""))
    flash("Discarded. It stays searchable, and will not be resent.", "ok")
    return redirect(url_for("ui.dead_letter", letter_id=letter_id))


@blueprint.get("/jobs/<op_id>")
@security.login_required
def job(op_id: str) -> Page:
    with runtime().db.begin() as session:
        op = session.get(BulkOperation, op_id)
        if op is None:
            raise NotFound(f"There is no background job {op_id}.")
        flt = DeadLetterFilter.from_params(op.params.get("filter") or {})
        return render_template("ui/job.html", op=op, flt=flt,
                               skipped=op.params.get("skipped") or {},
                               running=op.state in ("pending", "running"))


# ------------------------------------------------------------------------------ endpoints


@blueprint.get("/endpoints")
@security.login_required
def endpoints() -> Page:
    state = request.args.get("state", "")
    partner_uid = request.args.get("partner", "").strip()
    limit = parse_limit(request.args.get("limit") or "50")
    with runtime().db.begin() as session:
        stmt = select(Endpoint).where(Endpoint.deleted_at.is_(None))
        if state in ("enabled", "disabled"):
            stmt = stmt.where(Endpoint.state == state)
        if partner_uid:
            stmt = stmt.join(Partner, Partner.id == Endpoint.partner_id).where(
                Partner.uid == partner_uid)
        rows, next_cursor = paginate(session, stmt, Endpoint.id, limit=limit,
                                     cursor=request.args.get("cursor"))
        ids = [e.id for e in rows]
        query: dict[str, Any] = {k: v for k, v in {"state": state,
                                                   "partner": partner_uid}.items() if v}
        return render_template(
            "ui/endpoints.html", endpoints=rows, state=state, partner=partner_uid,
            partners=_partner_uids(session, {e.partner_id for e in rows}),
            health=stats.endpoint_health(session, ids, since=utcnow() - timedelta(hours=24)),
            open_letters=stats.open_letters_by_endpoint(session, ids),
            next_url=(url_for("ui.endpoints", **query, cursor=next_cursor)
                      if next_cursor else None),
            any_endpoint=bool(rows) or bool(session.scalar(select(Endpoint.id).limit(1))))


def _get_endpoint(session: Session, endpoint_id: str) -> Endpoint:
    endpoint = session.get(Endpoint, endpoint_id)
    if endpoint is None:
        raise NotFound(f"There is no endpoint {endpoint_id}.")
    return endpoint


def parked_since(session: Session, endpoint: Endpoint) -> Any:
    """When the endpoint was last disabled: now, or before its latest re-enable."""
    if endpoint.state == "disabled" and endpoint.disabled_at is not None:
        return endpoint.disabled_at
    latest = session.scalar(
        select(OperationalEvent)
        .where(OperationalEvent.subject_id == endpoint.id,
               OperationalEvent.kind.in_(("endpoint.enabled", "endpoint.disabled")))
        .order_by(OperationalEvent.id.desc()).limit(1))
    if latest is None:
        return None
    if latest.kind == "endpoint.enabled":
        raw = (latest.data or {}).get("was_disabled_at")
        if raw:
            return parse_time(raw)
        return None
    return latest.created_at


@blueprint.get("/endpoints/<endpoint_id>")
@security.login_required
def endpoint(endpoint_id: str) -> Page:
    with runtime().db.begin() as session:
        ep = _get_endpoint(session, endpoint_id)
        partner = session.get_one(Partner, ep.partner_id)
        since = parked_since(session, ep)
        parked = count(session, DeadLetterFilter(endpoint=ep.id, state=DL_OPEN, since=since))
        health = stats.endpoint_health(session, [ep.id], since=utcnow() - timedelta(hours=24))
        recent = list(session.scalars(
            select(OperationalEvent).where(OperationalEvent.subject_id == ep.id)
            .order_by(OperationalEvent.id.desc()).limit(10)))
        return render_template(
            "ui/endpoint.html", ep=ep, partner=partner, since=since, parked=parked,
            health=health.get(ep.id, stats.Health(0, 0)), recent=recent,
            open_letters=stats.open_letters_by_endpoint(session, [ep.id]).get(ep.id, 0))


def _record(session: Session, kind: str, endpoint: Endpoint, **data: Any) -> None:
    session.add(OperationalEvent(kind=kind, subject_id=endpoint.id,
                                 data={"actor": security.actor(), **data}))


def _enable(session: Session, ep: Endpoint) -> None:
    from sender.endpoints import enable_endpoint

    was = isoformat(ep.disabled_at)
    enable_endpoint(session, ep)
    _record(session, "endpoint.enabled", ep, was_disabled_at=was)


@blueprint.post("/endpoints/<endpoint_id>/enable")
@security.login_required
def endpoint_enable(endpoint_id: str) -> WerkzeugResponse:
    with runtime().db.begin() as session:
        ep = _get_endpoint(session, endpoint_id)
        if ep.state == "enabled":
            flash("The endpoint is already enabled.", "info")
        else:
            _enable(session, ep)
            flash("Enabled. New events will be delivered to it again.", "ok")
    return redirect(url_for("ui.endpoint", endpoint_id=endpoint_id))


@blueprint.post("/endpoints/<endpoint_id>/disable")
@security.login_required
def endpoint_disable(endpoint_id: str) -> WerkzeugResponse:
    from sender.endpoints import disable_endpoint

    reason = request.form.get("reason", "").strip() or None
    with runtime().db.begin() as session:
        ep = _get_endpoint(session, endpoint_id)
        if ep.state == "disabled":
            flash("The endpoint is already disabled.", "info")
        else:
            disable_endpoint(session, ep, reason)
            _record(session, "endpoint.disabled", ep, reason=ep.disabled_reason, manual=True)
            flash("Disabled. New events for it are parked as dead letters.", "ok")
    return redirect(url_for("ui.endpoint", endpoint_id=endpoint_id))


@blueprint.post("/endpoints/<endpoint_id>/rotate-secret")
@security.login_required
def endpoint_rotate(endpoint_id: str) -> Page:
    from sender.endpoints import rotate_secret

    rt = runtime()
    with rt.db.begin() as session:
        ep = _get_endpoint(session, endpoint_id)
        secret = rotate_secret(session, ep, {}, rt.settings, rt.secret_box)
        _record(session, "endpoint.secret_rotated", ep)
        partner = session.get_one(Partner, ep.partner_id)
        # Rendered directly, not flashed: the secret must not travel in the session cookie.
        return render_template("ui/secret.html", ep=ep, partner=partner, secret=secret,
                               overlap=present.duration(
                                   rt.settings.secret_rotation_overlap_seconds))


@blueprint.post("/endpoints/<endpoint_id>/resend-parked")
@security.login_required
def endpoint_resend_parked(endpoint_id: str) -> WerkzeugResponse:
    rt = runtime()
    with rt.db.begin() as session:
        ep = _get_endpoint(session, endpoint_id)
        since = parked_since(session, ep)
        if ep.state == "disabled":
            _enable(session, ep)
        flt = DeadLetterFilter(endpoint=ep.id, state=DL_OPEN, since=since)
        op = resend_mod.start_bulk(session, actor=security.actor(), flt=flt,
                                   connection=rt.redis)
        op_id, total = op.id, op.total
    flash(f"Endpoint enabled; resending {total} parked dead letter"
          f"{'s' if total != 1 else ''}.", "ok")
    return redirect(url_for("ui.job", op_id=op_id))


# ------------------------------------------------------------------------------ events


@blueprint.get("/events")
@security.login_required
def event_lookup() -> Page:
    raw = request.args.get("id", "").strip()
    if not raw:
        return render_template("ui/event_lookup.html", query="")
    with runtime().db.begin() as session:
        if raw.startswith("dl_") and session.get(DeadLetter, raw) is not None:
            return redirect(url_for("ui.dead_letter", letter_id=raw))
        if raw.startswith("dlv_"):
            delivery = session.get(Delivery, raw)
            if delivery is not None:
                return redirect(url_for("ui.event", event_id=delivery.event_id))
        if session.get(Event, raw) is not None:
            return redirect(url_for("ui.event", event_id=raw))
    flash(f"Nothing has the id {raw!r}. Paste an event (evt_…), delivery (dlv_…) or dead "
          "letter (dl_…) id.", "error")
    return render_template("ui/event_lookup.html", query=raw), 404


@blueprint.get("/events/<event_id>")
@security.login_required
def event(event_id: str) -> Page:
    with runtime().db.begin() as session:
        ev = session.get(Event, event_id)
        if ev is None:
            raise NotFound(f"There is no event {event_id}.")
        partner = session.get_one(Partner, ev.partner_id)
        deliveries = list(session.scalars(select(Delivery).where(Delivery.event_id == ev.id)
                                          .order_by(Delivery.id)))
        endpoints_by_id = {e.id: e for e in session.scalars(select(Endpoint).where(
            Endpoint.id.in_([d.endpoint_id for d in deliveries])))} if deliveries else {}
        letters = {dl.delivery_id: dl for dl in session.scalars(
            select(DeadLetter).where(DeadLetter.event_id == ev.id)
            .order_by(DeadLetter.id))}
        attempts: dict[str, list[Attempt]] = {}
        for attempt in session.scalars(select(Attempt).where(
                Attempt.delivery_id.in_([d.id for d in deliveries])).order_by(Attempt.n)):
            attempts.setdefault(attempt.delivery_id, []).append(attempt)
        return render_template("ui/event.html", ev=ev, partner=partner, deliveries=deliveries,
                               endpoints=endpoints_by_id, letters=letters, attempts=attempts,
                               payload=present.pretty_json(ev.payload))


# ------------------------------------------------------------------------------ inbound


@blueprint.get("/inbound")
@security.login_required
def inbound() -> Page:
    status = request.args.get("status", "")
    source_name = request.args.get("source", "").strip()
    resource_id = request.args.get("resource_id", "").strip()
    limit = parse_limit(request.args.get("limit") or "50")
    with runtime().db.begin() as session:
        sources = {s.id: s.name for s in session.scalars(select(InboundSource)
                                                         .order_by(InboundSource.name))}
        stmt = select(InboundEvent)
        if status in INBOUND_STATUSES:
            stmt = stmt.where(InboundEvent.status == status)
        if source_name:
            stmt = stmt.where(InboundEvent.source_id == select(InboundSource.id).where(
                InboundSource.name == source_name).scalar_subquery())
        if resource_id:
            stmt = stmt.where(InboundEvent.resource_id == resource_id)
        rows, next_cursor = paginate(session, stmt, InboundEvent.id, limit=limit,
                                     cursor=request.args.get("cursor"))
        query: dict[str, Any] = {k: v for k, v in {"status": status, "source": source_name,
                                                   "resource_id": resource_id}.items() if v}
        return render_template(
            "ui/inbound.html", rows=rows, status=status, source=source_name,
            resource_id=resource_id, sources=sources, statuses=INBOUND_STATUSES,
            counts=stats.inbound_by_status(session), can_replay=inbound_replay is not None,
            next_url=(url_for("ui.inbound", **query, cursor=next_cursor)
                      if next_cursor else None))


@blueprint.post("/inbound/<inbound_id>/replay")
@security.login_required
def inbound_replay_view(inbound_id: str) -> WerkzeugResponse:
    if inbound_replay is None:
        abort(404)
    rt = runtime()
    with rt.db.begin() as session:
        inbound_replay(session, rt, inbound_id)
    flash(f"Replaying {inbound_id}: it is queued for processing again.", "ok")
    return _back(url_for("ui.inbound"))


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


blueprint.add_app_template_filter(dumps, "dumps")
blueprint.add_app_template_filter(lambda n: f"{n:,}", "thousands")
