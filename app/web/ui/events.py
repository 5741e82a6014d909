"""Operator pages for events: the list (newest first, by partner, type and time), lookup of
anything by its id, and one event with each of its deliveries, their attempts, the version
each carried and the dead letter it became."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from flask import redirect, render_template, request, url_for

from app.clock import parse_time
from app.errors import NotFound
from app.pagination import parse_limit
from app.services import dead_letters, deliveries, events, list_filters, partners
from app.services.search import Search
from app.web import present, timeinput
from app.web.context import runtime
from app.web.ui import security
from app.web.ui.base import Page, blueprint


@blueprint.get("/events")
@security.login_required
def event_lookup() -> Page:
    """The events list (newest first, by partner, type and time, or what the search box
    finds), and lookup by any id."""
    raw = request.args.get("id", "").strip()
    actor = security.actor()
    given = timeinput.normalise(request.args)
    # The header's lookup box: an id goes to its page; anything else is searched.
    q = (given.get("q") or "").strip() or raw
    with runtime().db.begin() as session:
        if q and " " not in q and q.split("_", 1)[0] in ("evt", "dlv", "dl"):
            target = _lookup(session, q)
            if target is not None:
                return redirect(target)
        uid = given.get("partner", "").strip() or None
        type_ = given.get("type", "").strip() or None
        errors = list_filters.unknown(session, actor, partner=uid)
        missing = dict(errors)
        search, q_error = Search.parse(q)
        if q_error:
            errors["q"] = q_error
        since = until = None
        for key in ("since", "until"):
            try:
                value = parse_time(given[key]) if given.get(key) else None
            except ValueError:
                errors[key] = "must be an RFC 3339 time like 2026-01-31T00:00:00Z"
                value = None
            since, until = (value, until) if key == "since" else (since, value)
        rows: list[Any] = []
        next_cursor = None
        if not missing:
            rows, next_cursor = events.page(
                session,
                actor,
                uid,
                type_=type_,
                since=since,
                until=until,
                search=search,
                limit=parse_limit(request.args.get("limit") or "50"),
                cursor=request.args.get("cursor"),
            )
        query = {k: given.get(k, "") for k in ("q", "partner", "type", "since", "until")}
        query["q"] = q
        page = render_template(
            "ui/events.html",
            rows=rows,
            args=query,
            errors=errors,
            unknown=missing,
            searched=bool(search),
            choices=list_filters.choices(session, actor, partner=None if missing else uid),
            partner_uids=partners.uids(session, {e.partner_id for e in rows}),
            next_url=(
                url_for("ui.event_lookup")
                + "?"
                + urlencode({**{k: v for k, v in query.items() if v}, "cursor": next_cursor})
                if next_cursor
                else None
            ),
        )
    return (page, 404) if raw and not rows else page


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


@blueprint.get("/events/<event_id>")
@security.login_required
def event(event_id: str) -> Page:
    with runtime().db.begin() as session:
        found = events.detail(session, security.actor(), event_id)
        return render_template(
            "ui/event.html",
            ev=found.event,
            partner=found.partner,
            deliveries=found.deliveries,
            endpoints=found.endpoints,
            letters=found.letters,
            attempts=found.attempts,
            versions=found.versions,
            payload=present.pretty_json(found.event.payload),
        )
