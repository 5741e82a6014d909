"""Operator pages for dead letters: the filtered list with bulk actions, one letter with
Resend and Discard, and the page that follows a resend job."""

from __future__ import annotations

from urllib.parse import urlencode

from flask import flash, redirect, render_template, request, url_for
from werkzeug.wrappers import Response as WerkzeugResponse

from app.models import DL_OPEN, DL_STATES
from app.pagination import parse_limit
from app.services import dead_letters, endpoints, list_filters
from app.services.dead_letters import FILTER_KEYS, DeadLetterFilter, SearchPage
from app.vocabulary import DeadLetterReason
from app.web import present, timeinput
from app.web.context import runtime
from app.web.ui import security
from app.web.ui.base import Page, back, blueprint, dead_letters_url

# The reasons a dead letter can carry: exactly what the pipelines write (app.vocabulary).
KNOWN_REASONS = tuple(DeadLetterReason)
PAGE_SIZES = (25, 50, 100, 250)


def _ui_filter_args() -> dict[str, str]:
    """The dead-letter filter as the form shows it; `state` defaults to open."""
    given = timeinput.normalise(request.args)
    args = {key: given.get(key, "").strip() for key in FILTER_KEYS}
    if "state" not in request.args:
        args["state"] = DL_OPEN
    return args


def _filter_form(args: dict[str, str]) -> dead_letters.FilterForm:
    params = {k: v for k, v in args.items() if v and not (k == "state" and v == "any")}
    return dead_letters.parse_filter(params)


@blueprint.get("/dead-letters", endpoint="dead_letters")
@security.login_required
def dead_letters_page() -> Page:
    args = _ui_filter_args()
    form = _filter_form(args)
    flt = form.filter
    limit = parse_limit(request.args.get("limit") or "50")
    cursor = request.args.get("cursor") or None
    actor = security.actor()
    with runtime().db.begin() as session:
        missing = list_filters.unknown(session, actor, partner=flt.partner, endpoint=flt.endpoint)
        errors = {**form.errors, **missing}
        if missing:
            page, matching = SearchPage([], None, {}), 0
        else:
            page = dead_letters.page(session, actor, flt, limit=limit, cursor=cursor, options=())
            matching = dead_letters.count_matching(session, actor, flt)
        any_open = matching > 0 or dead_letters.open_dead_letter_exists(session, actor)
        kept = set(request.args.getlist("selected"))
        query = {k: v for k, v in args.items() if v}
        return render_template(
            "ui/dead_letters.html",
            page=page,
            args=args,
            flt=flt,
            matching=matching,
            errors=errors,
            unknown=missing,
            choices=list_filters.choices(
                session, actor, partner=None if "partner" in missing else flt.partner
            ),
            endpoint_urls=endpoints.labels(session, actor, {dl.endpoint_id for dl in page.letters}),
            kept=kept,
            any_open=any_open,
            limit=limit,
            cursor=cursor,
            states=DL_STATES,
            reasons=KNOWN_REASONS,
            page_sizes=PAGE_SIZES,
            next_url=(
                dead_letters_url(**query, limit=limit, cursor=page.next_cursor)
                if page.next_cursor
                else None
            ),
            first_url=dead_letters_url(**query, limit=limit) if cursor else None,
            filter_params=flt.to_params(),
            filtered=not flt.with_state(None).is_empty(),
        )


@blueprint.post("/dead-letters/bulk")
@security.login_required
def dead_letters_bulk() -> WerkzeugResponse:
    ids = list(dict.fromkeys(request.form.getlist("ids")))
    action = request.form.get("action")
    to_list = back(url_for("ui.dead_letters"))
    if not ids:
        flash("Select at least one dead letter first.", "error")
        return to_list
    rt = runtime()
    actor = security.actor()
    force = request.form.get("force") == "1"
    if action == "resend":
        with rt.db.begin() as session:
            outcome = dead_letters.resend_ids(session, rt, actor, ids, force=force)
            job_id = outcome.job.id
        if not outcome.inline:
            flash(f"Resending {len(ids)} dead letters in the background.", "ok")
            return redirect(url_for("ui.resend_job", job_id=job_id))
        _flash_resend(len(outcome.resent), outcome.skipped)
        refused = [i for i in ids if i in outcome.skipped]
        return _keeping(to_list, refused)
    if action == "discard":
        with rt.db.begin() as session:
            done = len(
                dead_letters.discard_ids(
                    session, actor, ids, note=request.form.get("note", ""), rt=rt
                )
            )
        flash(
            f"Discarded {done} dead letter{'s' if done != 1 else ''}"
            + (f"; {len(ids) - done} were no longer open." if done < len(ids) else "."),
            "ok" if done else "error",
        )
        return to_list
    flash("Choose an action: resend or discard.", "error")
    return to_list


def _keeping(to_list: WerkzeugResponse, ids: list[str]) -> WerkzeugResponse:
    """Back to the list with the letters an action refused still ticked (`selected`), so
    that acting on them again (say, with "even to disabled endpoints") needs no re-picking."""
    if not ids:
        return to_list
    target = to_list.headers["Location"]
    joiner = "&" if "?" in target else "?"
    return redirect(target + joiner + urlencode([("selected", i) for i in ids]))


def _flash_resend(resent: int, skipped: dict[str, str]) -> None:
    if resent:
        flash(f"Resent {resent} dead letter{'s' if resent != 1 else ''}.", "ok")
    if skipped:
        reasons: dict[str, int] = {}
        for reason in skipped.values():
            reasons[reason] = reasons.get(reason, 0) + 1
        text = ", ".join(
            f"{n} {'letter' if n == 1 else 'letters'} ({reason.replace('_', ' ')})"
            for reason, n in reasons.items()
        )
        hint = (
            " Enable the endpoint first, or tick “resend even to disabled endpoints”."
            if dead_letters.ENDPOINT_DISABLED in reasons
            else ""
        )
        flash(f"Not resent: {text}.{hint}", "error")


@blueprint.post("/dead-letters/resend-matching")
@security.login_required
def dead_letters_resend_matching() -> WerkzeugResponse:
    params = {k: request.form.get(k, "") for k in FILTER_KEYS if request.form.get(k)}
    params["state"] = DL_OPEN
    form = dead_letters.parse_filter(params)
    to_list = dead_letters_url(**{k: v for k, v in params.items() if k != "state"})
    if not form.valid:
        # Acting on the fields that did parse would resend more than was asked for.
        flash(
            "Not resent: "
            + "; ".join(f"{k} {m}" for k, m in form.errors.items())
            + ". Fix the filter first.",
            "error",
        )
        return redirect(to_list)
    if form.filter.with_state(None).is_empty() and request.form.get("all") != "1":
        # As in the API: "everything" is said outright, never implied by missing criteria.
        flash(
            "Not resent: no search criteria were given. To resend every open dead letter, "
            'use "Resend all matching" on the unfiltered list.',
            "error",
        )
        return redirect(url_for("ui.dead_letters"))
    rt = runtime()
    with rt.db.begin() as session:
        job = dead_letters.resend_matching(
            session,
            rt,
            security.actor(),
            form,
            everything=request.form.get("all") == "1",
            force=request.form.get("force") == "1",
        )
        job_id, total = job.id, job.total
    flash(f"Resending {total} dead letter{'s' if total != 1 else ''} in the background.", "ok")
    return redirect(url_for("ui.resend_job", job_id=job_id))


@blueprint.get("/dead-letters/<letter_id>")
@security.login_required
def dead_letter(letter_id: str) -> Page:
    with runtime().db.begin() as session:
        found = dead_letters.detail(session, security.actor(), letter_id)
        return render_template(
            "ui/dead_letter.html",
            letter=found.letter,
            delivery=found.letter.delivery,
            event=found.event,
            endpoint=found.endpoint,
            partner=found.partner,
            body=present.body_view(found.sent),
            fate=found.fate,
            attempts=present.attempt_views(found.attempts),
        )


@blueprint.post("/dead-letters/<letter_id>/resend")
@security.login_required
def dead_letter_resend(letter_id: str) -> WerkzeugResponse:
    rt = runtime()
    actor = security.actor()
    force = request.form.get("force") == "1"
    enabled = False
    with rt.db.begin() as session:
        if request.form.get("enable") == "1":
            enabled, letter = endpoints.resend_letter_enabling(
                session, rt, actor, letter_id, force=force
            )
        else:
            letter = dead_letters.resend_one(session, rt, actor, letter_id, force=force)
        run = letter.delivery.run
    flash(
        ("Endpoint enabled. " if enabled else "")
        + f"Resent: the delivery starts run {run} with a fresh retry budget.",
        "ok",
    )
    return redirect(url_for("ui.dead_letter", letter_id=letter_id))


@blueprint.post("/dead-letters/<letter_id>/discard")
@security.login_required
def dead_letter_discard(letter_id: str) -> WerkzeugResponse:
    rt = runtime()
    with rt.db.begin() as session:
        dead_letters.discard(
            session, security.actor(), letter_id, note=request.form.get("note", ""), rt=rt
        )
    flash("Discarded. It stays searchable, and will not be resent.", "ok")
    return redirect(url_for("ui.dead_letter", letter_id=letter_id))


@blueprint.get("/jobs/<job_id>")
@security.login_required
def resend_job(job_id: str) -> Page:
    with runtime().db.begin() as session:
        job = dead_letters.resend_job(session, security.actor(), job_id)
        flt = DeadLetterFilter.from_params(job.params.get("filter") or {})
        outcomes = dead_letters.resend_job_outcomes(session, security.actor(), job)
        return render_template(
            "ui/job.html",
            job=job,
            flt=flt,
            outcomes=outcomes,
            skipped=job.params.get("skipped") or {},
            running=dead_letters.job_running(job),
            verdict=dead_letters.job_verdict(job, outcomes),
        )
