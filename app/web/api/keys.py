"""API keys over HTTP: who-am-I for any key; list, read and revoke for admins."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from app.pagination import parse_limit
from app.services import audit, keys
from app.web.api.serializers import audit_record_json, key_json
from app.web.auth import current_actor
from app.web.context import runtime

blueprint = Blueprint("api_keys", __name__)


@blueprint.get("/me")
def me() -> Response:
    actor = current_actor()
    return jsonify(
        {
            "id": actor.key_id,
            "name": actor.name,
            "scopes": sorted(actor.scopes),
            "partner": actor.partner_uid,
        }
    )


@blueprint.get("/keys")
def list_keys() -> Response:
    actor = current_actor()
    limit = parse_limit(request.args.get("limit"))
    with runtime().db.begin() as session:
        views, cursor = keys.page(session, actor, limit=limit, cursor=request.args.get("cursor"))
        data = [key_json(v.key, v.partner_uid) for v in views]
    return jsonify({"data": data, "next_cursor": cursor})


@blueprint.get("/keys/<key_id>")
def get_key(key_id: str) -> Response:
    actor = current_actor()
    with runtime().db.begin() as session:
        view = keys.get(session, actor, key_id)
        return jsonify(key_json(view.key, view.partner_uid))


@blueprint.delete("/keys/<key_id>")
def revoke_key(key_id: str) -> Response:
    """Revoke: every API process refuses the key within a second. Answers the revoked key."""
    actor = current_actor()
    with runtime().db.begin() as session:
        view = keys.revoke(session, actor, key_id)
        return jsonify(key_json(view.key, view.partner_uid))


@blueprint.get("/audit")
def audit_log() -> Response:
    """The audit trail, newest first: `subject` (an id) and `action` filter it."""
    actor = current_actor()
    limit = parse_limit(request.args.get("limit"))
    with runtime().db.begin() as session:
        rows, cursor = audit.search(
            session,
            actor,
            subject_id=request.args.get("subject"),
            action=request.args.get("action"),
            limit=limit,
            cursor=request.args.get("cursor"),
        )
        data = [audit_record_json(r) for r in audit.shown(session, actor, rows)]
    return jsonify({"data": data, "next_cursor": cursor})
