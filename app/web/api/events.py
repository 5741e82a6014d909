"""Publishing and reading events over HTTP; the rules live in app.services.events."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from app import telemetry
from app.errors import PayloadTooLarge
from app.pagination import parse_limit
from app.services import events
from app.web.api.serializers import event_json
from app.web.auth import current_actor
from app.web.context import runtime
from app.web.jsonio import bool_param, read_json_object, time_param

blueprint = Blueprint("api_events", __name__)


@blueprint.post("/partners/<uid>/events")
def publish(uid: str) -> Response:
    actor = current_actor()
    rt = runtime()
    limit = rt.settings.max_payload_bytes
    if request.content_length is not None and request.content_length > limit:
        # Refused on the header alone: the body is never read, let alone parsed.
        raise PayloadTooLarge.over(limit)
    if request.content_length is None and len(request.get_data(cache=True)) >= limit:
        # A chunked body is cut at the limit by Werkzeug, silently: refuse it whole.
        raise PayloadTooLarge.over(limit)
    body = read_json_object()
    result = events.publish(
        rt,
        actor,
        uid,
        body,
        request.headers.get("Idempotency-Key"),
        traceparent=request.headers.get(telemetry.TRACEPARENT),
    )
    response = jsonify(result.body)
    response.status_code = result.status
    if result.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response


@blueprint.get("/partners/<uid>/events")
def list_events(uid: str) -> Response:
    """The partner's events, newest first; `delivery_success=false` is what did not arrive."""
    actor = current_actor()
    limit = parse_limit(request.args.get("limit"))
    since, until = time_param("since"), time_param("until")
    success = bool_param("delivery_success")
    with runtime().db.begin() as session:
        rows, cursor = events.page(
            session,
            actor,
            uid,
            type_=request.args.get("type"),
            since=since,
            until=until,
            delivery_success=success,
            limit=limit,
            cursor=request.args.get("cursor"),
        )
        data = [event_json(event, uid) for event in rows]
    return jsonify({"data": data, "next_cursor": cursor})


@blueprint.get("/events/<event_id>")
def get_event(event_id: str) -> Response:
    actor = current_actor()
    with runtime().db.begin() as session:
        event, uid = events.get(session, actor, event_id)
        return jsonify(event_json(event, uid, deliveries=list(event.deliveries)))
