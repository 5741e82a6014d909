"""`/v1/inbound-events`: what partners sent us and what became of it; replay one."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request
from sqlalchemy import select

from app.clock import isoformat
from app.errors import BadRequest, NotFound
from app.inbound.replay import replay
from app.inbound.sources import get_source
from app.models import INBOUND_STATUSES, InboundEvent, InboundSource
from app.pagination import paginate, parse_limit
from app.web.auth import require_scope
from app.web.context import runtime
from app.web.jsonio import time_param

blueprint = Blueprint("api_inbound_events", __name__)


def inbound_event_json(event: InboundEvent, source_name: str, *,
                       detail: bool = False) -> dict[str, Any]:
    """The SPEC §4 shape; the detail adds the body and how processing went."""
    body: dict[str, Any] = {
        "id": event.id,
        "source": source_name,
        "event_id": event.event_id,
        "event_type": event.event_type,
        "resource_id": event.resource_id,
        "resource_version": event.resource_version,
        "occurred_at": isoformat(event.occurred_at),
        "status": event.status,
        "reason": event.reason,
        "received_at": isoformat(event.received_at),
        "created_at": isoformat(event.received_at),  # every resource has one (SPEC §4)
    }
    if detail:
        try:
            text: str | None = event.raw_body.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        body.update({
            "resource_type": event.resource_type,
            "resource_status": event.resource_status,
            "attempts": event.attempts,
            "processed_at": isoformat(event.processed_at),
            "updated_at": isoformat(event.updated_at),
            "headers": event.headers,
            "body": text,
            "body_size": len(event.raw_body),
        })
    return body


@blueprint.get("/inbound-events")
@require_scope("read")
def list_inbound_events() -> Response:
    limit = parse_limit(request.args.get("limit"))
    status = request.args.get("status")
    if status and status not in INBOUND_STATUSES:
        raise BadRequest(f"status must be one of {', '.join(INBOUND_STATUSES)}",
                         code="invalid_parameter", details={"parameter": "status"})
    since, until = time_param("since"), time_param("until")
    with runtime().db.begin() as session:
        stmt = select(InboundEvent)
        names: dict[str, str] = {}
        source_name = request.args.get("source")
        if source_name:
            source = get_source(session, source_name)
            stmt = stmt.where(InboundEvent.source_id == source.id)
            names[source.id] = source.name
        if status:
            stmt = stmt.where(InboundEvent.status == status)
        resource_id = request.args.get("resource_id")
        if resource_id:
            stmt = stmt.where(InboundEvent.resource_id == resource_id)
        if since is not None:
            stmt = stmt.where(InboundEvent.received_at >= since)
        if until is not None:
            stmt = stmt.where(InboundEvent.received_at < until)
        rows, cursor = paginate(session, stmt, InboundEvent.id, limit=limit,
                                cursor=request.args.get("cursor"))
        missing = {e.source_id for e in rows} - set(names)
        if missing:
            for source_id, name in session.execute(
                    select(InboundSource.id, InboundSource.name)
                    .where(InboundSource.id.in_(missing))):
                names[source_id] = name
        data = [inbound_event_json(e, names.get(e.source_id, "")) for e in rows]
    return jsonify({"data": data, "next_cursor": cursor})


def _load(session: Any, event_id: str) -> tuple[InboundEvent, str]:
    event = session.get(InboundEvent, event_id)
    if event is None:
        raise NotFound(f"no inbound event {event_id!r}", details={"id": event_id})
    name = session.scalar(select(InboundSource.name).where(InboundSource.id == event.source_id))
    return event, name or ""


@blueprint.get("/inbound-events/<event_id>")
@require_scope("read")
def get_inbound_event(event_id: str) -> Response:
    with runtime().db.begin() as session:
        event, name = _load(session, event_id)
        return jsonify(inbound_event_json(event, name, detail=True))


@blueprint.post("/inbound-events/<event_id>/replay")
@require_scope("sources:write")
def replay_inbound_event(event_id: str) -> tuple[Response, int]:
    rt = runtime()
    with rt.db.begin() as session:
        event = replay(session, rt, event_id)
        name = session.scalar(select(InboundSource.name)
                              .where(InboundSource.id == event.source_id))
        payload = inbound_event_json(event, name or "", detail=True)
    return jsonify(payload), 202
