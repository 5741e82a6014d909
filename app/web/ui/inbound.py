"""Operator pages for inbound events: received partner callbacks by source, status and
resource, with their counts by status, and Replay."""

from __future__ import annotations

from typing import Any

from flask import flash, render_template, request, url_for
from werkzeug.wrappers import Response as WerkzeugResponse

from app.errors import NotFound
from app.models import INBOUND_STATUSES
from app.pagination import parse_limit
from app.services import sources
from app.web import present
from app.web.context import runtime
from app.web.ui import security
from app.web.ui.base import Page, back, blueprint


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
                session,
                actor,
                source=source_name or None,
                status=status if status in INBOUND_STATUSES else None,
                resource_id=resource_id or None,
                limit=limit,
                cursor=request.args.get("cursor"),
            )
        except NotFound:
            flash(f"There is no source {source_name!r}.", "error")
            rows, next_cursor = [], None
        query: dict[str, Any] = {
            k: v
            for k, v in {
                "status": status,
                "source": source_name,
                "resource_id": resource_id,
            }.items()
            if v
        }
        return render_template(
            "ui/inbound.html",
            rows=rows,
            status=status,
            source=source_name,
            resource_id=resource_id,
            sources=names,
            statuses=INBOUND_STATUSES,
            counts=sources.event_counts(session, actor),
            can_replay=True,
            next_url=(url_for("ui.inbound", **query, cursor=next_cursor) if next_cursor else None),
        )


@blueprint.post("/inbound/<inbound_id>/replay")
@security.login_required
def inbound_replay_view(inbound_id: str) -> WerkzeugResponse:
    rt = runtime()
    with rt.db.begin() as session:
        sources.replay(session, rt, security.actor(), inbound_id)
    flash(f"Replaying {inbound_id}: it is queued for processing again.", "ok")
    return back(url_for("ui.inbound"))


@blueprint.get("/inbound/<inbound_id>")
@security.login_required
def inbound_event(inbound_id: str) -> Page:
    """One received callback: its facts, the headers it came with (credentials hidden) and
    the body exactly as stored, to check what a partner actually sent."""
    with runtime().db.begin() as session:
        event, source_name = sources.event(session, security.actor(), inbound_id)
        raw = bytes(event.raw_body or b"")
        return render_template(
            "ui/inbound_event.html",
            e=event,
            source=source_name,
            headers=present.shown_headers(event.headers),
            body=raw.decode("utf-8", errors="replace"),
            pretty=present.pretty_json(raw),
            size=len(raw),
        )
