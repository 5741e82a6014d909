"""Endpoints: what every face may do to a partner's endpoint, validated and audited once.

The rules of a valid endpoint (URL and SSRF verdict, headers, subscriptions, limits, secrets)
live in `sender.endpoints`; this module decides who may apply them, records every change in
the audit trail, and writes the operational events the operator pages build on
(`endpoint.enabled` remembers when the endpoint had been disabled, so its parked letters can be
found again).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.clock import isoformat, utcnow
from app.errors import NotFound
from app.models import Endpoint, EndpointSecret, OperationalEvent
from app.pagination import paginate
from app.runtime import Runtime
from app.services import audit, partners
from app.services.actor import Actor
from sender import endpoints as rules

ENABLED, DISABLED = rules.ENABLED, rules.DISABLED
EndpointWithSecret = rules.EndpointWithSecret


def _not_found(endpoint_id: str) -> NotFound:
    return NotFound(f"endpoint {endpoint_id!r} does not exist", details={"endpoint": endpoint_id})


def _record(session: Session, actor: Actor, action: str, endpoint: Endpoint,
            **details: Any) -> None:
    audit.record(session, actor, action, "endpoint", endpoint.id,
                 partner_id=endpoint.partner_id, **details)


def get(session: Session, actor: Actor, uid: str, endpoint_id: str,
        scope: str = "read") -> Endpoint:
    """The live endpoint `endpoint_id` of partner `uid`, if the actor may touch it."""
    partner = partners.visible(session, actor, uid, scope)
    return rules.get_endpoint(session, partner, endpoint_id)


def by_id(session: Session, actor: Actor, endpoint_id: str, scope: str = "read") -> Endpoint:
    """An endpoint by id alone (operator pages link them so), deleted ones included."""
    actor.require(scope)
    endpoint = session.get(Endpoint, endpoint_id)
    if endpoint is None or not actor.may_see_partner(endpoint.partner_id):
        raise _not_found(endpoint_id)
    return endpoint


def page(session: Session, actor: Actor, uid: str | None, *, state: str | None = None,
         limit: int, cursor: str | None) -> tuple[list[Endpoint], str | None]:
    """Live endpoints, newest first, of one partner (or of every visible one when `uid` is
    None)."""
    if uid is not None:
        partner = partners.visible(session, actor, uid)
        stmt = rules.live_endpoints_query(partner)
    else:
        actor.require("read")
        stmt = select(Endpoint).where(Endpoint.deleted_at.is_(None))
        if actor.partner_id is not None:
            stmt = stmt.where(Endpoint.partner_id == actor.partner_id)
    if state:
        stmt = stmt.where(Endpoint.state == state)
    return paginate(session, stmt, Endpoint.id, limit=limit, cursor=cursor)


def create(session: Session, rt: Runtime, actor: Actor, uid: str,
           body: dict[str, Any]) -> EndpointWithSecret:
    partner = partners.visible(session, actor, uid, "endpoints:write")
    created = rules.create_endpoint(session, partner, body, rt.settings, rt.secret_box)
    endpoint = created.endpoint
    _record(session, actor, "endpoint.created", endpoint, url=endpoint.url,
            event_types=endpoint.event_types, headers=sorted(endpoint.headers or {}))
    return created


def update(session: Session, rt: Runtime, actor: Actor, uid: str, endpoint_id: str,
           body: dict[str, Any]) -> Endpoint:
    endpoint = get(session, actor, uid, endpoint_id, "endpoints:write")
    rules.update_endpoint(session, endpoint, body, rt.settings)
    changed = sorted(body)
    details: dict[str, Any] = {"fields": changed}
    if "url" in body:
        details["url"] = endpoint.url
    _record(session, actor, "endpoint.updated", endpoint, **details)
    return endpoint


def delete(session: Session, actor: Actor, uid: str, endpoint_id: str) -> None:
    endpoint = get(session, actor, uid, endpoint_id, "endpoints:write")
    rules.delete_endpoint(session, endpoint)
    _record(session, actor, "endpoint.deleted", endpoint)


def enable(session: Session, actor: Actor, endpoint: Endpoint) -> bool:
    """Enable a disabled endpoint; False when it was enabled already (nothing recorded)."""
    actor.require("endpoints:write")
    if endpoint.deleted_at is not None:
        raise _not_found(endpoint.id)
    if endpoint.state == ENABLED:
        return False
    was = isoformat(endpoint.disabled_at)
    reason = endpoint.disabled_reason
    rules.enable_endpoint(session, endpoint)
    session.add(OperationalEvent(kind="endpoint.enabled", subject_id=endpoint.id,
                                 data={"actor": str(actor), "was_disabled_at": was,
                                       "was_disabled_because": reason}))
    _record(session, actor, "endpoint.enabled", endpoint, was_disabled_at=was)
    return True


def disable(session: Session, actor: Actor, endpoint: Endpoint,
            reason: str | None = None) -> bool:
    """Disable by hand; False when it was disabled already (a new reason is still kept)."""
    actor.require("endpoints:write")
    if endpoint.deleted_at is not None:
        raise _not_found(endpoint.id)
    was_enabled = endpoint.state == ENABLED
    rules.disable_endpoint(session, endpoint, reason)
    if was_enabled:
        session.add(OperationalEvent(kind="endpoint.disabled", subject_id=endpoint.id,
                                     data={"actor": str(actor),
                                           "reason": endpoint.disabled_reason, "manual": True}))
    _record(session, actor, "endpoint.disabled", endpoint, reason=endpoint.disabled_reason)
    return was_enabled


def rotate_secret(session: Session, rt: Runtime, actor: Actor, endpoint: Endpoint,
                  body: dict[str, Any] | None = None) -> str:
    """A new current secret; the old ones keep signing for the configured overlap."""
    actor.require("endpoints:write")
    if endpoint.deleted_at is not None:
        raise _not_found(endpoint.id)
    secret = rules.rotate_secret(session, endpoint, body or {}, rt.settings, rt.secret_box)
    _record(session, actor, "endpoint.secret_rotated", endpoint,
            overlap_s=rt.settings.secret_rotation_overlap_seconds)
    return secret


def read_secret(session: Session, rt: Runtime, actor: Actor,
                endpoint: Endpoint) -> tuple[EndpointSecret, str]:
    """The current secret (a write scope is needed to read it)."""
    actor.require("endpoints:write")
    return rules.read_secret(endpoint, rt.secret_box)


def previous_secret_expiry(endpoint: Endpoint, now: datetime | None = None) -> datetime | None:
    """Until when the secrets before the current one still sign (after a rotation)."""
    now = now or utcnow()
    live = [s.expires_at for s in endpoint.secrets
            if s.expires_at is not None and s.expires_at > now]
    return max(live) if live else None


def parked_since(session: Session, endpoint: Endpoint) -> datetime | None:
    """When the endpoint was last disabled: now, or before its latest re-enable."""
    from app.clock import parse_time

    if endpoint.state == DISABLED and endpoint.disabled_at is not None:
        return endpoint.disabled_at
    latest = session.scalar(
        select(OperationalEvent)
        .where(OperationalEvent.subject_id == endpoint.id,
               OperationalEvent.kind.in_(("endpoint.enabled", "endpoint.disabled")))
        .order_by(OperationalEvent.id.desc()).limit(1))
    if latest is None:
        return None
    if latest.kind == "endpoint.enabled":
        raw = (latest.data or {}).get("was_disabled_at")
        return parse_time(raw) if raw else None
    return latest.created_at
