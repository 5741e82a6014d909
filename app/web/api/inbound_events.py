"""`/v1/inbound-events`: what partners sent us and what became of it; replay one."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request

from app.clock import isoformat
from app.models import InboundEvent
from app.pagination import parse_limit
from app.services import sources
from app.web.auth import current_actor
from app.web.context import runtime
from app.web.jsonio import time_param

blueprint = Blueprint("api_inbound_events", __name__)


def inbound_event_json(
    event: InboundEvent, source_name: str, *, detail: bool = False
) -> dict[str, Any]:
    """The list shape; the detail adds the body and how processing went."""
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
        "created_at": isoformat(event.received_at),  # every resource has one
    }
    if detail:
        try:
            text: str | None = event.raw_body.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        body.update(
            {
                "resource_type": event.resource_type,
                "resource_status": event.resource_status,
                "attempts": event.attempts,
                "processed_at": isoformat(event.processed_at),
                "updated_at": isoformat(event.updated_at),
                "headers": event.headers,
                "body": text,
                "body_size": len(event.raw_body),
            }
        )
    return body


@blueprint.get("/inbound-events")
def list_inbound_events() -> Response:
    actor = current_actor()
    limit = parse_limit(request.args.get("limit"))
    since, until = time_param("since"), time_param("until")
    with runtime().db.begin() as session:
        rows, cursor, names = sources.event_page(
            session,
            actor,
            source=request.args.get("source"),
            status=request.args.get("status"),
            resource_id=request.args.get("resource_id"),
            since=since,
            until=until,
            limit=limit,
            cursor=request.args.get("cursor"),
        )
        data = [inbound_event_json(e, names.get(e.source_id, "")) for e in rows]
    return jsonify({"data": data, "next_cursor": cursor})


@blueprint.get("/inbound-events/<event_id>")
def get_inbound_event(event_id: str) -> Response:
    actor = current_actor()
    with runtime().db.begin() as session:
        event, name = sources.event(session, actor, event_id)
        return jsonify(inbound_event_json(event, name, detail=True))


@blueprint.post("/inbound-events/<event_id>/replay")
def replay_inbound_event(event_id: str) -> tuple[Response, int]:
    actor = current_actor()
    rt = runtime()
    with rt.db.begin() as session:
        event = sources.replay(session, rt, actor, event_id)
        name = sources.source_names(session, {event.source_id}).get(event.source_id, "")
        payload = inbound_event_json(event, name, detail=True)
    return jsonify(payload), 202
