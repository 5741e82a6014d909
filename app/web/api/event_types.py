"""Event contracts over HTTP: register a version, list, read one, deprecate it."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from app.pagination import parse_limit
from app.services import event_types
from app.web.api.serializers import event_type_json
from app.web.auth import current_actor
from app.web.context import runtime
from app.web.jsonio import read_json_object

blueprint = Blueprint("api_event_types", __name__)


@blueprint.post("/event-types")
def create_event_type() -> tuple[Response, int]:
    actor = current_actor()
    body = read_json_object()
    with runtime().db.begin() as session:
        result = event_types.register(session, actor, body)
        answer = event_type_json(result.event_type)
    return jsonify(answer), 201 if result.created else 200


@blueprint.get("/event-types")
def list_event_types() -> Response:
    actor = current_actor()
    limit = parse_limit(request.args.get("limit"))
    with runtime().db.begin() as session:
        rows, cursor = event_types.page(session, actor, name=request.args.get("name"),
                                        limit=limit, cursor=request.args.get("cursor"))
        data = [event_type_json(row) for row in rows]
    return jsonify({"data": data, "next_cursor": cursor})


@blueprint.get("/event-types/<name>/<int:version>")
def get_event_type(name: str, version: int) -> Response:
    actor = current_actor()
    with runtime().db.begin() as session:
        return jsonify(event_type_json(event_types.get(session, actor, name, version)))


@blueprint.post("/event-types/<name>/<int:version>/deprecate")
def deprecate_event_type(name: str, version: int) -> Response:
    actor = current_actor()
    with runtime().db.begin() as session:
        return jsonify(event_type_json(event_types.deprecate(session, actor, name, version)))
