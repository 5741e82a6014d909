"""Event contracts over HTTP: register a version, list, read one, deprecate it."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request
from sqlalchemy import select

from app import contracts
from app.models import EventType
from app.pagination import paginate, parse_limit
from app.web.api.serializers import event_type_json
from app.web.auth import require_scope
from app.web.context import runtime
from app.web.jsonio import read_json_object

blueprint = Blueprint("api_event_types", __name__)


@blueprint.post("/event-types")
@require_scope("events:write")
def create_event_type() -> tuple[Response, int]:
    body = read_json_object()
    with runtime().db.begin() as session:
        result = contracts.register(session, body)
        answer = event_type_json(result.event_type)
    return jsonify(answer), 201 if result.created else 200


@blueprint.get("/event-types")
@require_scope("read")
def list_event_types() -> Response:
    limit = parse_limit(request.args.get("limit"))
    stmt = select(EventType)
    name = request.args.get("name")
    if name:
        stmt = stmt.where(EventType.name == name)
    with runtime().db.begin() as session:
        rows, cursor = paginate(session, stmt, EventType.id, limit=limit,
                                cursor=request.args.get("cursor"))
        data = [event_type_json(row) for row in rows]
    return jsonify({"data": data, "next_cursor": cursor})


@blueprint.get("/event-types/<name>/<int:version>")
@require_scope("read")
def get_event_type(name: str, version: int) -> Response:
    with runtime().db.begin() as session:
        return jsonify(event_type_json(contracts.get(session, name, version)))


@blueprint.post("/event-types/<name>/<int:version>/deprecate")
@require_scope("events:write")
def deprecate_event_type(name: str, version: int) -> Response:
    with runtime().db.begin() as session:
        return jsonify(event_type_json(contracts.deprecate(session, name, version)))
