"""Publishing and reading events over HTTP (SPEC §4); the rules live in sender.publish."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request
from sqlalchemy import exists, select
from sqlalchemy.orm import selectinload

from app.errors import BadRequest, NotFound, PayloadTooLarge
from app.models import SUCCEEDED, Delivery, Event, Partner
from app.pagination import paginate, parse_limit
from app.web.api.serializers import event_json
from app.web.auth import current_principal, require_scope
from app.web.context import runtime
from app.web.jsonio import read_json_object, time_param
from sender import endpoints as endpoint_service
from sender.publish import publish_event

blueprint = Blueprint("api_events", __name__)


@blueprint.post("/partners/<uid>/events")
@require_scope("events:write")
def publish(uid: str) -> Response:
    rt = runtime()
    limit = rt.settings.max_payload_bytes
    if request.content_length is not None and request.content_length > limit:
        # Refused on the header alone: the body is never read, let alone parsed.
        raise PayloadTooLarge.over(limit)
    if request.content_length is None and len(request.get_data(cache=True)) >= limit:
        # A chunked body is cut at the limit by Werkzeug, silently: refuse it whole.
        raise PayloadTooLarge.over(limit)
    body = read_json_object()
    principal = current_principal()
    result = publish_event(rt.db, rt.redis, rt.settings, partner_uid=uid, body=body,
                           api_key_id=principal.key_id,
                           idempotency_key=request.headers.get("Idempotency-Key"))
    response = jsonify(result.body)
    response.status_code = result.status
    if result.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response


def _bool_arg(name: str) -> bool | None:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return None
    value = raw.strip().lower()
    if value in {"true", "1"}:
        return True
    if value in {"false", "0"}:
        return False
    raise BadRequest(f"{name} must be true or false", code="invalid_parameter",
                     details={"parameter": name})


@blueprint.get("/partners/<uid>/events")
@require_scope("read")
def list_events(uid: str) -> Response:
    """The partner's feed, newest first; `delivery_success=false` is what did not arrive."""
    limit = parse_limit(request.args.get("limit"))
    since, until = time_param("since"), time_param("until")
    success = _bool_arg("delivery_success")
    with runtime().db.begin() as session:
        partner = endpoint_service.get_partner(session, uid)
        stmt = select(Event).where(Event.partner_id == partner.id)
        type_ = request.args.get("type")
        if type_:
            stmt = stmt.where(Event.type == type_)
        if since is not None:
            stmt = stmt.where(Event.created_at >= since)
        if until is not None:
            stmt = stmt.where(Event.created_at < until)
        if success is not None:
            unfinished = exists().where(Delivery.event_id == Event.id,
                                        Delivery.state != SUCCEEDED)
            stmt = stmt.where(unfinished if success is False else ~unfinished)
        rows, cursor = paginate(session, stmt, Event.id, limit=limit,
                                cursor=request.args.get("cursor"))
        data = [event_json(event, uid) for event in rows]
    return jsonify({"data": data, "next_cursor": cursor})


@blueprint.get("/events/<event_id>")
@require_scope("read")
def get_event(event_id: str) -> Response:
    with runtime().db.begin() as session:
        row = session.execute(
            select(Event, Partner.uid).join(Partner, Partner.id == Event.partner_id)
            .where(Event.id == event_id)
            .options(selectinload(Event.deliveries).selectinload(Delivery.attempts))).first()
        if row is None:
            raise NotFound(f"event {event_id!r} does not exist", details={"id": event_id})
        event, uid = row
        return jsonify(event_json(event, uid, deliveries=list(event.deliveries)))
