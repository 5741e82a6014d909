"""Who-am-I for an API key, so a caller can check its key and scopes."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from app.web.auth import current_principal

blueprint = Blueprint("api_keys", __name__)


@blueprint.get("/me")
def me() -> Response:
    principal = current_principal()
    return jsonify({"id": principal.key_id, "name": principal.name,
                    "scopes": sorted(principal.scopes)})
