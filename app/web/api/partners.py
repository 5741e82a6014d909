"""Partners and their endpoints over HTTP; the decisions live in app.services."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request

from app.clock import isoformat, utcnow
from app.errors import ValidationFailed, reject_unknown_fields
from app.pagination import parse_limit
from app.services import endpoints, feed, filters, keys, partners, portal, verification
from app.web.api.dead_letters import resend_job_json
from app.web.api.serializers import (
    blocked_key_json,
    delivery_json,
    endpoint_json,
    filter_test_json,
    key_json,
    lag_json,
    partner_json,
)
from app.web.auth import current_actor
from app.web.context import runtime
from app.web.jsonio import no_content, optional_json, read_json_object
from app.web.links import portal_url

blueprint = Blueprint("api_partners", __name__)


# ---------------------------------------------------------------------------- partners


@blueprint.post("/partners")
def create_partner() -> tuple[Response, int]:
    actor = current_actor()
    body = read_json_object()
    with runtime().db.begin() as session:
        answer = partner_json(partners.create(session, actor, body))
    return jsonify(answer), 201


@blueprint.get("/partners")
def list_partners() -> Response:
    actor = current_actor()
    limit = parse_limit(request.args.get("limit"))
    with runtime().db.begin() as session:
        rows, cursor = partners.page(session, actor, limit=limit, cursor=request.args.get("cursor"))
        data = [partner_json(p) for p in rows]
    return jsonify({"data": data, "next_cursor": cursor})


@blueprint.get("/partners/<uid>")
def get_partner(uid: str) -> Response:
    actor = current_actor()
    with runtime().db.begin() as session:
        return jsonify(partner_json(partners.get(session, actor, uid)))


@blueprint.patch("/partners/<uid>")
def update_partner(uid: str) -> Response:
    actor = current_actor()
    body = read_json_object()
    with runtime().db.begin() as session:
        return jsonify(partner_json(partners.update(session, actor, uid, body)))


@blueprint.post("/partners/<uid>/keys")
def create_partner_key(uid: str) -> tuple[Response, int]:
    """A key bound to this partner (admin only); the key itself is in this answer alone."""
    actor = current_actor()
    body = read_json_object()
    reject_unknown_fields(body, {"name", "scopes"})
    scopes = body.get("scopes") or []
    if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
        raise ValidationFailed(
            "scopes must be a list of scope names",
            code="invalid_scope",
            details={"field": "scopes"},
        )
    with runtime().db.begin() as session:
        view, token = keys.create(
            session,
            actor,
            body.get("name"),  # type: ignore[arg-type]
            scopes,
            partner_uid=uid,
        )
        answer = key_json(view.key, view.partner_uid, token=token)
    return jsonify(answer), 201


@blueprint.post("/partners/<uid>/portal-links")
def create_portal_link(uid: str) -> tuple[Response, int]:
    """A one-time magic link opening the partner portal for this partner."""
    actor = current_actor()
    body = optional_json(allowed=("expires_in_s", "read_only", "features"))
    rt = runtime()
    with rt.db.begin() as session:
        link, token = portal.create_link(
            session,
            actor,
            uid,
            expires_in_s=body.get("expires_in_s"),
            default_ttl_s=rt.settings.portal_link_ttl_seconds,
            read_only=body.get("read_only", False),
            features=body.get("features"),
        )
        answer = {
            "id": link.id,
            "partner": uid,
            "url": portal_url(token),
            "expires_at": isoformat(link.expires_at),
            "created_at": isoformat(link.created_at),
            "read_only": link.read_only,
            "features": portal.scope_of(link).features_list,
        }
    return jsonify(answer), 201


@blueprint.delete("/partners/<uid>/portal-sessions")
def revoke_portal_access(uid: str) -> Response:
    """End every portal session and revoke every unused link of this partner (admin)."""
    actor = current_actor()
    with runtime().db.begin() as session:
        stopped = portal.revoke_partner(session, actor, uid)
    return jsonify({"ended": stopped.ended, "revoked": stopped.revoked})


# ---------------------------------------------------------------------------- endpoints


@blueprint.post("/partners/<uid>/endpoints")
def create_endpoint(uid: str) -> tuple[Response, int]:
    actor = current_actor()
    body = read_json_object()
    rt = runtime()
    with rt.db.begin() as session:
        created = endpoints.create(session, rt, actor, uid, body)
        answer = endpoint_json(created.endpoint, uid, secret=created.secret)
    return jsonify(answer), 201


@blueprint.get("/partners/<uid>/endpoints")
def list_endpoints(uid: str) -> Response:
    actor = current_actor()
    limit = parse_limit(request.args.get("limit"))
    with runtime().db.begin() as session:
        rows, cursor = endpoints.page(
            session,
            actor,
            uid,
            state=request.args.get("state"),
            limit=limit,
            cursor=request.args.get("cursor"),
        )
        data = [endpoint_json(e, uid) for e in rows]
    return jsonify({"data": data, "next_cursor": cursor})


@blueprint.get("/partners/<uid>/endpoints/<endpoint_id>")
def get_endpoint(uid: str, endpoint_id: str) -> Response:
    """One endpoint; a pull endpoint with its lag (what its consumer has not acknowledged)."""
    actor = current_actor()
    rt = runtime()
    now = utcnow()
    with rt.db.begin() as session:
        endpoint = endpoints.live(session, actor, uid, endpoint_id)
        lag = feed.lag_of(session, rt.settings, endpoint, now)
        return jsonify(
            endpoint_json(
                endpoint, uid, lag=None if lag is None else lag_json(lag, endpoint.acked_at, now)
            )
        )


@blueprint.patch("/partners/<uid>/endpoints/<endpoint_id>")
def update_endpoint(uid: str, endpoint_id: str) -> Response:
    actor = current_actor()
    body = read_json_object()
    rt = runtime()
    with rt.db.begin() as session:
        endpoint = endpoints.update(session, rt, actor, uid, endpoint_id, body)
        return jsonify(endpoint_json(endpoint, uid))


@blueprint.delete("/partners/<uid>/endpoints/<endpoint_id>")
def delete_endpoint(uid: str, endpoint_id: str) -> Response:
    actor = current_actor()
    with runtime().db.begin() as session:
        endpoints.delete(session, actor, uid, endpoint_id)
    return no_content()


@blueprint.post("/partners/<uid>/endpoints/<endpoint_id>/enable")
def enable_endpoint(uid: str, endpoint_id: str) -> Response:
    actor = current_actor()
    with runtime().db.begin() as session:
        endpoint = endpoints.live(session, actor, uid, endpoint_id, "endpoints:write")
        endpoints.enable(session, actor, endpoint, runtime())
        return jsonify(endpoint_json(endpoint, uid))


@blueprint.post("/partners/<uid>/endpoints/<endpoint_id>/disable")
def disable_endpoint(uid: str, endpoint_id: str) -> Response:
    actor = current_actor()
    body = optional_json(allowed=("reason",))
    with runtime().db.begin() as session:
        endpoint = endpoints.live(session, actor, uid, endpoint_id, "endpoints:write")
        endpoints.disable(session, actor, endpoint, body.get("reason"))
        return jsonify(endpoint_json(endpoint, uid))


@blueprint.post("/partners/<uid>/endpoints/<endpoint_id>/secret/rotate")
def rotate_secret(uid: str, endpoint_id: str) -> Response:
    actor = current_actor()
    body: dict[str, Any] = optional_json()
    rt = runtime()
    with rt.db.begin() as session:
        endpoint = endpoints.live(session, actor, uid, endpoint_id, "endpoints:write")
        secret = endpoints.rotate_secret(session, rt, actor, endpoint, body)
        return jsonify(endpoint_json(endpoint, uid, secret=secret))


@blueprint.post("/partners/<uid>/endpoints/<endpoint_id>/probe")
def probe_endpoint(uid: str, endpoint_id: str) -> tuple[Response, int]:
    """Send a `kurir.endpoint.probe` now (in the background) to an endpoint Kurir disabled
    after failures."""
    actor = current_actor()
    rt = runtime()
    with rt.db.begin() as session:
        endpoint = endpoints.live(session, actor, uid, endpoint_id, "endpoints:write")
        endpoints.probe_now(session, rt, actor, endpoint)
        answer = endpoint_json(endpoint, uid)
    return jsonify(answer), 202


@blueprint.post("/partners/<uid>/endpoints/<endpoint_id>/recover")
def recover_endpoint(uid: str, endpoint_id: str) -> tuple[Response, int]:
    """Resend, in publish order, what of this endpoint did not succeed in a window."""
    actor = current_actor()
    body = read_json_object()
    rt = runtime()
    with rt.db.begin() as session:
        endpoint = endpoints.live(session, actor, uid, endpoint_id, "endpoints:write")
        job = endpoints.recover_window(session, rt, actor, endpoint, body)
        answer = {"operation": resend_job_json(job), "status_url": f"/v1/operations/{job.id}"}
    return jsonify(answer), 202


@blueprint.post("/partners/<uid>/endpoints/<endpoint_id>/filter-test")
def filter_test(uid: str, endpoint_id: str) -> Response:
    """Try a filter (default: the endpoint's) on sample events; nothing changes."""
    actor = current_actor()
    body = optional_json(allowed=("filter", "event"))
    with runtime().db.begin() as session:
        tried = filters.try_filter(session, actor, uid, endpoint_id, body)
    return jsonify(filter_test_json(tried))


@blueprint.get("/partners/<uid>/endpoints/<endpoint_id>/blocked-keys")
def blocked_keys(uid: str, endpoint_id: str) -> Response:
    """Keys an `on_dead: "block"` endpoint holds behind a dead delivery; resending or
    discarding the named dead letter releases one."""
    actor = current_actor()
    limit = parse_limit(request.args.get("limit"))
    with runtime().db.begin() as session:
        rows, cursor = endpoints.blocked_keys(
            session, actor, uid, endpoint_id, cursor=request.args.get("cursor"), limit=limit
        )
    return jsonify({"data": [blocked_key_json(row) for row in rows], "next_cursor": cursor})


@blueprint.post("/partners/<uid>/endpoints/<endpoint_id>/test")
def send_test(uid: str, endpoint_id: str) -> tuple[Response, int]:
    """Send a `kurir.test` event to this endpoint alone; follow it at GET /v1/deliveries/{id}."""
    actor = current_actor()
    rt = runtime()
    with rt.db.begin() as session:
        endpoint = endpoints.live(session, actor, uid, endpoint_id, "endpoints:write")
        delivery = endpoints.send_test(session, rt, actor, endpoint)
        answer = delivery_json(delivery, with_attempts=False)
    return jsonify(answer), 202


@blueprint.post("/partners/<uid>/endpoints/<endpoint_id>/verify")
def verify_endpoint(uid: str, endpoint_id: str) -> Response:
    """Answer the endpoint's ownership challenge (for receivers that cannot echo it)."""
    actor = current_actor()
    body = read_json_object()
    rt = runtime()
    with rt.db.begin() as session:
        endpoint = verification.confirm(session, rt, actor, uid, endpoint_id, body)
        return jsonify(endpoint_json(endpoint, uid))


@blueprint.post("/partners/<uid>/endpoints/<endpoint_id>/verify/resend")
def resend_challenge(uid: str, endpoint_id: str) -> tuple[Response, int]:
    """Send a fresh ownership challenge (the previous one stops counting)."""
    actor = current_actor()
    optional_json(allowed=())
    rt = runtime()
    with rt.db.begin() as session:
        endpoint = verification.resend(session, rt, actor, uid, endpoint_id)
        answer = endpoint_json(endpoint, uid)
    return jsonify(answer), 202


@blueprint.get("/partners/<uid>/endpoints/<endpoint_id>/secret")
def read_secret(uid: str, endpoint_id: str) -> Response:
    actor = current_actor()
    rt = runtime()
    with rt.db.begin() as session:
        endpoint = endpoints.live(session, actor, uid, endpoint_id, "endpoints:write")
        row, secret = endpoints.read_secret(session, rt, actor, endpoint)
        return jsonify(
            {
                "id": row.id,
                "endpoint": endpoint.id,
                "secret": secret,
                "created_at": isoformat(row.created_at),
                "expires_at": isoformat(row.expires_at),
            }
        )
