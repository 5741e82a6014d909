"""`/v1/sources`: configure inbound sources and read the state of their resources."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from app.pagination import parse_limit
from app.services import sources
from app.web.auth import current_actor
from app.web.context import runtime
from app.web.jsonio import read_json_object

blueprint = Blueprint("api_sources", __name__)


@blueprint.post("/sources")
def create_source() -> tuple[Response, int]:
    actor = current_actor()
    body = read_json_object()
    rt = runtime()
    with rt.db.begin() as session:
        payload = sources.describe(sources.create(session, rt, actor, body))
    return jsonify(payload), 201


@blueprint.get("/sources")
def list_sources() -> Response:
    actor = current_actor()
    limit = parse_limit(request.args.get("limit"))
    with runtime().db.begin() as session:
        rows, cursor = sources.page(session, actor, limit=limit, cursor=request.args.get("cursor"))
        data = [sources.describe(s) for s in rows]
    return jsonify({"data": data, "next_cursor": cursor})


@blueprint.get("/inbound-handlers")
def list_handlers() -> Response:
    """The handlers a source may select by name (configured with KURIR_INBOUND_HANDLERS)."""
    names = sources.handlers(runtime(), current_actor())
    return jsonify({"data": [{"name": name, "path": path} for name, path in names.items()]})


@blueprint.get("/sources/<name>")
def get_source(name: str) -> Response:
    actor = current_actor()
    with runtime().db.begin() as session:
        return jsonify(sources.describe(sources.get(session, actor, name)))


@blueprint.post("/sources/<name>/secrets")
def add_secret(name: str) -> tuple[Response, int]:
    """Add a secret; ``"rotate": true`` retires the others after the rotation overlap."""
    actor = current_actor()
    body = read_json_object()
    rt = runtime()
    with rt.db.begin() as session:
        source = sources.add_secret(
            session, rt, actor, name, body.get("secret"), rotate=body.get("rotate", False)
        )
        payload = sources.describe(source)
    return jsonify(payload), 201


@blueprint.get("/sources/<name>/resources/<path:resource_id>")
def get_resource(name: str, resource_id: str) -> Response:
    """The current state of one resource; ``?resource_type=`` picks one of several kinds."""
    actor = current_actor()
    with runtime().db.begin() as session:
        return jsonify(
            sources.resource(session, actor, name, resource_id, request.args.get("resource_type"))
        )
