"""Partners and their endpoints over HTTP (SPEC §4); the rules live in sender.endpoints."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request
from sqlalchemy import select

from app.clock import isoformat
from app.models import Endpoint, Partner
from app.pagination import paginate, parse_limit
from app.web.api.serializers import endpoint_json, partner_json
from app.web.auth import require_scope
from app.web.context import runtime
from app.web.jsonio import read_json_object
from sender import endpoints as service

blueprint = Blueprint("api_partners", __name__)


def _optional_json() -> dict[str, Any]:
    """Action routes take an optional body: none at all is the same as `{}`."""
    if not request.content_length and not request.get_data(cache=True):
        return {}
    return read_json_object()


# ---------------------------------------------------------------------------- partners


@blueprint.post("/partners")
@require_scope("endpoints:write")
def create_partner() -> tuple[Response, int]:
    body = read_json_object()
    with runtime().db.begin() as session:
        partner = service.create_partner(session, body)
        answer = partner_json(partner)
    return jsonify(answer), 201


@blueprint.get("/partners")
@require_scope("read")
def list_partners() -> Response:
    limit = parse_limit(request.args.get("limit"))
    with runtime().db.begin() as session:
        rows, cursor = paginate(session, select(Partner), Partner.id, limit=limit,
                                cursor=request.args.get("cursor"))
        data = [partner_json(p) for p in rows]
    return jsonify({"data": data, "next_cursor": cursor})


@blueprint.get("/partners/<uid>")
@require_scope("read")
def get_partner(uid: str) -> Response:
    with runtime().db.begin() as session:
        return jsonify(partner_json(service.get_partner(session, uid)))


# ---------------------------------------------------------------------------- endpoints


@blueprint.post("/partners/<uid>/endpoints")
@require_scope("endpoints:write")
def create_endpoint(uid: str) -> tuple[Response, int]:
    body = read_json_object()
    rt = runtime()
    with rt.db.begin() as session:
        partner = service.get_partner(session, uid)
        created = service.create_endpoint(session, partner, body, rt.settings, rt.secret_box)
        answer = endpoint_json(created.endpoint, uid, secret=created.secret)
    return jsonify(answer), 201


@blueprint.get("/partners/<uid>/endpoints")
@require_scope("read")
def list_endpoints(uid: str) -> Response:
    limit = parse_limit(request.args.get("limit"))
    with runtime().db.begin() as session:
        partner = service.get_partner(session, uid)
        stmt = service.live_endpoints_query(partner)
        state = request.args.get("state")
        if state:
            stmt = stmt.where(Endpoint.state == state)
        rows, cursor = paginate(session, stmt, Endpoint.id, limit=limit,
                                cursor=request.args.get("cursor"))
        data = [endpoint_json(e, uid) for e in rows]
    return jsonify({"data": data, "next_cursor": cursor})


@blueprint.get("/partners/<uid>/endpoints/<endpoint_id>")
@require_scope("read")
def get_endpoint(uid: str, endpoint_id: str) -> Response:
    with runtime().db.begin() as session:
        partner = service.get_partner(session, uid)
        return jsonify(endpoint_json(service.get_endpoint(session, partner, endpoint_id), uid))


@blueprint.patch("/partners/<uid>/endpoints/<endpoint_id>")
@require_scope("endpoints:write")
def update_endpoint(uid: str, endpoint_id: str) -> Response:
    body = read_json_object()
    rt = runtime()
    with rt.db.begin() as session:
        partner = service.get_partner(session, uid)
        endpoint = service.get_endpoint(session, partner, endpoint_id)
        service.update_endpoint(session, endpoint, body, rt.settings)
        return jsonify(endpoint_json(endpoint, uid))


@blueprint.delete("/partners/<uid>/endpoints/<endpoint_id>")
@require_scope("endpoints:write")
def delete_endpoint(uid: str, endpoint_id: str) -> Response:
    with runtime().db.begin() as session:
        partner = service.get_partner(session, uid)
        service.delete_endpoint(session, service.get_endpoint(session, partner, endpoint_id))
    no_content = Response(status=204)
    del no_content.headers["Content-Type"]  # there is no content to type
    return no_content


@blueprint.post("/partners/<uid>/endpoints/<endpoint_id>/enable")
@require_scope("endpoints:write")
def enable_endpoint(uid: str, endpoint_id: str) -> Response:
    with runtime().db.begin() as session:
        partner = service.get_partner(session, uid)
        endpoint = service.enable_endpoint(
            session, service.get_endpoint(session, partner, endpoint_id))
        return jsonify(endpoint_json(endpoint, uid))


@blueprint.post("/partners/<uid>/endpoints/<endpoint_id>/disable")
@require_scope("endpoints:write")
def disable_endpoint(uid: str, endpoint_id: str) -> Response:
    body = _optional_json()
    with runtime().db.begin() as session:
        partner = service.get_partner(session, uid)
        endpoint = service.get_endpoint(session, partner, endpoint_id)
        service.reject_unknown(body, ("reason",))
        service.disable_endpoint(session, endpoint, body.get("reason"))
        return jsonify(endpoint_json(endpoint, uid))


@blueprint.post("/partners/<uid>/endpoints/<endpoint_id>/secret/rotate")
@require_scope("endpoints:write")
def rotate_secret(uid: str, endpoint_id: str) -> Response:
    body = _optional_json()
    rt = runtime()
    with rt.db.begin() as session:
        partner = service.get_partner(session, uid)
        endpoint = service.get_endpoint(session, partner, endpoint_id)
        secret = service.rotate_secret(session, endpoint, body, rt.settings, rt.secret_box)
        return jsonify(endpoint_json(endpoint, uid, secret=secret))


@blueprint.get("/partners/<uid>/endpoints/<endpoint_id>/secret")
@require_scope("endpoints:write")
def read_secret(uid: str, endpoint_id: str) -> Response:
    rt = runtime()
    with rt.db.begin() as session:
        partner = service.get_partner(session, uid)
        endpoint = service.get_endpoint(session, partner, endpoint_id)
        row, secret = service.read_secret(endpoint, rt.secret_box)
        return jsonify({"id": row.id, "endpoint": endpoint.id, "secret": secret,
                        "created_at": isoformat(row.created_at),
                        "expires_at": isoformat(row.expires_at)})
