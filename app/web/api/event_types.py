"""Event contracts over HTTP: register a version, list, read one, deprecate it."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from app.clock import parse_rfc3339
from app.errors import ValidationFailed
from app.pagination import parse_limit
from app.services import event_types
from app.web.api.serializers import event_type_json
from app.web.auth import current_actor
from app.web.context import runtime
from app.web.jsonio import optional_json, read_json_object

blueprint = Blueprint("api_event_types", __name__)


@blueprint.post("/event-types")
def create_event_type() -> tuple[Response, int]:
    actor = current_actor()
    body = read_json_object()
    rt = runtime()
    with rt.db.begin() as session:
        result = event_types.register(session, actor, body, max_bytes=rt.settings.max_payload_bytes)
        answer = event_type_json(result.event_type)
    return jsonify(answer), 201 if result.created else 200


@blueprint.get("/event-types")
def list_event_types() -> Response:
    actor = current_actor()
    limit = parse_limit(request.args.get("limit"))
    with runtime().db.begin() as session:
        rows, cursor = event_types.page(
            session,
            actor,
            name=request.args.get("name"),
            limit=limit,
            cursor=request.args.get("cursor"),
        )
        data = [event_type_json(row) for row in rows]
    return jsonify({"data": data, "next_cursor": cursor})


@blueprint.get("/event-types/<name>/<int:version>")
def get_event_type(name: str, version: int) -> Response:
    actor = current_actor()
    with runtime().db.begin() as session:
        return jsonify(event_type_json(event_types.get(session, actor, name, version)))


@blueprint.post("/event-types/<name>/<int:version>/deprecate")
def deprecate_event_type(name: str, version: int) -> Response:
    """Body optional: `{"sunset_at": "<RFC 3339>"}`."""
    actor = current_actor()
    body = optional_json(allowed=("sunset_at",))
    sunset_at = None
    if body.get("sunset_at") is not None:
        try:
            sunset_at = parse_rfc3339(str(body["sunset_at"]))
        except ValueError:
            raise ValidationFailed(
                "sunset_at must be an RFC 3339 timestamp",
                code="invalid_field",
                details={"field": "sunset_at"},
            ) from None
    with runtime().db.begin() as session:
        row = event_types.deprecate(session, actor, name, version, sunset_at)
        return jsonify(event_type_json(row))


@blueprint.get("/event-types/<name>/versions")
def event_type_versions(name: str) -> Response:
    """Adoption per version: endpoints pinned, deliveries in the last 7 days, sunset."""
    actor = current_actor()
    with runtime().db.begin() as session:
        data = [
            {
                **event_type_json(a.event_type),
                "endpoints_pinned": a.pinned,
                "deliveries_7d": a.deliveries_7d,
            }
            for a in event_types.adoption(session, actor, name)
        ]
    return jsonify({"data": data})
