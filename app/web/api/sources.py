"""`/v1/sources`: configure inbound sources and read the state of their resources."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request
from sqlalchemy import select
from sqlalchemy.orm import selectinload

from app.errors import Conflict, NotFound, ValidationFailed
from app.inbound import sources as sources_mod
from app.inbound.state import state_to_dict
from app.models import InboundSource, ResourceState
from app.pagination import paginate, parse_limit
from app.web.auth import require_scope
from app.web.context import runtime
from app.web.jsonio import read_json_object

blueprint = Blueprint("api_sources", __name__)

_CREATE_FIELDS = {"name", "scheme", "secret", "secrets", "tolerance_s", "mapping", "allow_gaps",
                  "handlers", "reconcile_url"}


def _secrets_from(body: dict[str, Any]) -> list[str]:
    secrets = body.get("secrets")
    if secrets is None and "secret" in body:
        secrets = [body["secret"]]
    if not isinstance(secrets, list) or not secrets:
        raise ValidationFailed('give "secret" or a non-empty "secrets" list',
                               code="invalid_secret")
    return secrets


@blueprint.post("/sources")
@require_scope("sources:write")
def create_source() -> tuple[Response, int]:
    body = read_json_object()
    unknown = sorted(set(body) - _CREATE_FIELDS)
    if unknown:
        raise ValidationFailed(f"unknown field(s): {', '.join(unknown)}", code="invalid_source",
                               details={"fields": unknown})
    rt = runtime()
    with rt.db.begin() as session:
        source = sources_mod.create_source(
            session, rt.secret_box, rt.settings,
            name=body.get("name"),  # type: ignore[arg-type]
            scheme=body.get("scheme"),  # type: ignore[arg-type]
            secrets=_secrets_from(body),
            tolerance_s=body.get("tolerance_s"),
            mapping=body.get("mapping"),
            allow_gaps=body.get("allow_gaps", True),
            handlers=body.get("handlers") or [],
            reconcile_url=body.get("reconcile_url"),
        )
        payload = sources_mod.source_to_dict(source)
    return jsonify(payload), 201


@blueprint.get("/sources")
@require_scope("read")
def list_sources() -> Response:
    limit = parse_limit(request.args.get("limit"))
    with runtime().db.begin() as session:
        stmt = select(InboundSource).options(selectinload(InboundSource.secrets))
        rows, cursor = paginate(session, stmt, InboundSource.id, limit=limit,
                                cursor=request.args.get("cursor"), newest_first=False)
        data = [sources_mod.source_to_dict(s) for s in rows]
    return jsonify({"data": data, "next_cursor": cursor})


@blueprint.get("/sources/<name>")
@require_scope("read")
def get_source(name: str) -> Response:
    with runtime().db.begin() as session:
        return jsonify(sources_mod.source_to_dict(sources_mod.get_source(session, name)))


@blueprint.post("/sources/<name>/secrets")
@require_scope("sources:write")
def add_secret(name: str) -> tuple[Response, int]:
    """Add a secret; ``"rotate": true`` retires the others after the rotation overlap."""
    body = read_json_object()
    rotate = body.get("rotate", False)
    if not isinstance(rotate, bool):
        raise ValidationFailed("rotate must be a boolean", code="invalid_secret")
    rt = runtime()
    with rt.db.begin() as session:
        source = sources_mod.get_source(session, name)
        sources_mod.add_secret(session, rt.secret_box, source, body.get("secret"),  # type: ignore[arg-type]
                               rotate=rotate,
                               overlap_s=rt.settings.secret_rotation_overlap_seconds)
        session.refresh(source)
        payload = sources_mod.source_to_dict(source)
    return jsonify(payload), 201


@blueprint.get("/sources/<name>/resources/<path:resource_id>")
@require_scope("read")
def get_resource(name: str, resource_id: str) -> Response:
    """The current state of one resource; ``?resource_type=`` picks one of several kinds."""
    resource_type = request.args.get("resource_type")
    with runtime().db.begin() as session:
        source = sources_mod.get_source(session, name)
        stmt = select(ResourceState).where(ResourceState.source_id == source.id,
                                           ResourceState.resource_id == resource_id)
        if resource_type is not None:
            stmt = stmt.where(ResourceState.resource_type == resource_type)
        found = list(session.scalars(stmt.order_by(ResourceState.resource_type)))
        if not found:
            raise NotFound(f"source {name!r} has no resource {resource_id!r}",
                           details={"source": name, "resource_id": resource_id})
        if len(found) > 1:
            raise Conflict("several resource types share this id; pass ?resource_type=",
                           code="ambiguous_resource",
                           details={"resource_types": [s.resource_type for s in found]})
        return jsonify(state_to_dict(found[0], source.name))
