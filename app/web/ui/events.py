"""Operator pages for events: the list (newest first, by partner, type and time), lookup of
anything by its id, and one event with each of its deliveries, their attempts, the version
each carried and the dead letter it became."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from flask import flash, redirect, render_template, request, url_for

from app.errors import BadRequest, NotFound
from app.pagination import parse_limit
from app.services import dead_letters, deliveries, events, partners
from app.web import present
from app.web.context import runtime
from app.web.jsonio import time_param
from app.web.ui import security
from app.web.ui.base import Page, blueprint


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
            flash(
                f"Nothing has the id {raw!r}. Paste an event (evt_…), delivery (dlv_…) or "
                "dead letter (dl_…) id.",
                "error",
            )
        uid = request.args.get("partner", "").strip() or None
        type_ = request.args.get("type", "").strip() or None
        error = None
        try:
            since, until = time_param("since"), time_param("until")
            rows, next_cursor = events.page(
                session,
                actor,
                uid,
                type_=type_,
                since=since,
                until=until,
                limit=parse_limit(request.args.get("limit") or "50"),
                cursor=request.args.get("cursor"),
            )
        except (BadRequest, NotFound) as exc:
            error, rows, next_cursor = exc.message, [], None
        query = {k: request.args.get(k, "") for k in ("partner", "type", "since", "until")}
        page = render_template(
            "ui/events.html",
            rows=rows,
            query=query,
            lookup=raw,
            error=error,
            partner_uids=partners.uids(session, {e.partner_id for e in rows}),
            next_url=(
                url_for("ui.event_lookup")
                + "?"
                + urlencode({**{k: v for k, v in query.items() if v}, "cursor": next_cursor})
                if next_cursor
                else None
            ),
        )
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
