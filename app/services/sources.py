"""Inbound sources and what they sent us: configure, read, replay — and the receiving door.

Sources belong to the operator: a partner-bound actor never sees them. Handlers are code, so
over HTTP a source only selects handlers registered by name (KURIR_INBOUND_HANDLERS); the
operator's command line may also name a module path.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from app.errors import BadRequest, Conflict, NotFound, ValidationFailed, reject_unknown_fields
from app.inbound import receive as receive_mod
from app.inbound import reconcile as reconcile_mod
from app.inbound import replay as replay_mod
from app.inbound import sources as rules
from app.inbound.state import state_to_dict
from app.inbound.verify import SCHEMES
from app.models import INBOUND_STATUSES, InboundEvent, InboundSource, ResourceState
from app.pagination import paginate
from app.runtime import Runtime
from app.services import audit
from app.services.actor import CLI, Actor

CREATE_FIELDS = frozenset(
    {
        "name",
        "scheme",
        "secret",
        "secrets",
        "tolerance_s",
        "mapping",
        "allow_gaps",
        "handlers",
        "reconcile_url",
    }
)
Receipt = receive_mod.Receipt
StoreUnavailable = receive_mod.StoreUnavailable
RETRY_AFTER_S = receive_mod.RETRY_AFTER_S
describe = rules.source_to_dict
__all__ = ["SCHEMES", "describe"]


def _require(actor: Actor, scope: str) -> None:
    if actor.bound_to_partner:
        raise NotFound("not found")
    actor.require(scope)


def handlers(rt: Runtime, actor: Actor) -> dict[str, str]:
    """The handlers a source may select, by name."""
    _require(actor, "read")
    return rt.settings.handler_registry


def create(session: Session, rt: Runtime, actor: Actor, body: dict[str, Any]) -> InboundSource:
    """Raises ValidationFailed for any bad field (a handler not registered by name among
    them, unless the actor is the operator's command line), Conflict for a taken name."""
    _require(actor, "sources:write")
    reject_unknown_fields(body, CREATE_FIELDS, code="invalid_source")
    secrets = body.get("secrets")
    if secrets is None and "secret" in body:
        secrets = [body["secret"]]
    if not isinstance(secrets, list) or not secrets:
        raise ValidationFailed('give "secret" or a non-empty "secrets" list', code="invalid_secret")
    source = rules.create_source(
        session,
        rt.secret_box,
        rt.settings,
        name=body.get("name"),  # type: ignore[arg-type]
        scheme=body.get("scheme"),  # type: ignore[arg-type]
        secrets=secrets,
        tolerance_s=body.get("tolerance_s"),
        mapping=body.get("mapping"),
        allow_gaps=body.get("allow_gaps", True),
        handlers=body.get("handlers") or [],
        reconcile_url=body.get("reconcile_url"),
        allow_handler_paths=actor.kind == CLI,
    )
    audit.record(
        session,
        actor,
        "source.created",
        "source",
        source.id,
        name=source.name,
        scheme=source.scheme,
        handlers=list(source.handlers or []),
    )
    return source


def get(session: Session, actor: Actor, name: str) -> InboundSource:
    _require(actor, "read")
    return rules.get_source(session, name)


def page(
    session: Session, actor: Actor, *, limit: int, cursor: str | None
) -> tuple[list[InboundSource], str | None]:
    _require(actor, "read")
    stmt = select(InboundSource).options(selectinload(InboundSource.secrets))
    return paginate(session, stmt, InboundSource.id, limit=limit, cursor=cursor, newest_first=False)


def every(session: Session, actor: Actor) -> list[InboundSource]:
    _require(actor, "read")
    return rules.list_sources(session)


def add_secret(
    session: Session, rt: Runtime, actor: Actor, name: str, secret: Any, *, rotate: bool = False
) -> InboundSource:
    """Add a verification secret; `rotate` retires the others after the rotation overlap."""
    _require(actor, "sources:write")
    if not isinstance(rotate, bool):
        raise ValidationFailed("rotate must be a boolean", code="invalid_secret")
    source = rules.get_source(session, name)
    rules.add_secret(
        session,
        rt.secret_box,
        source,
        secret,
        rotate=rotate,
        overlap_s=rt.settings.secret_rotation_overlap_seconds,
    )
    audit.record(
        session, actor, "source.secret_added", "source", source.id, name=name, rotate=rotate
    )
    session.refresh(source)
    return source


def resource(
    session: Session, actor: Actor, name: str, resource_id: str, resource_type: str | None = None
) -> dict[str, Any]:
    """The current state of one resource of a source."""
    source = get(session, actor, name)
    stmt = select(ResourceState).where(
        ResourceState.source_id == source.id, ResourceState.resource_id == resource_id
    )
    if resource_type is not None:
        stmt = stmt.where(ResourceState.resource_type == resource_type)
    found = list(session.scalars(stmt.order_by(ResourceState.resource_type)))
    if not found:
        raise NotFound(
            f"source {name!r} has no resource {resource_id!r}",
            details={"source": name, "resource_id": resource_id},
        )
    if len(found) > 1:
        raise Conflict(
            "several resource types share this id; pass ?resource_type=",
            code="ambiguous_resource",
            details={"resource_types": [s.resource_type for s in found]},
        )
    return state_to_dict(found[0], source.name)


# ------------------------------------------------------------------------- inbound events


def event_page(
    session: Session,
    actor: Actor,
    *,
    source: str | None = None,
    status: str | None = None,
    resource_id: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int,
    cursor: str | None,
) -> tuple[list[InboundEvent], str | None, dict[str, str]]:
    """Received callbacks, newest first, with the names of their sources."""
    _require(actor, "read")
    if status and status not in INBOUND_STATUSES:
        raise BadRequest(
            f"status must be one of {', '.join(INBOUND_STATUSES)}",
            code="invalid_parameter",
            details={"parameter": "status"},
        )
    stmt = select(InboundEvent)
    names: dict[str, str] = {}
    if source:
        found = rules.get_source(session, source)
        stmt = stmt.where(InboundEvent.source_id == found.id)
        names[found.id] = found.name
    if status:
        stmt = stmt.where(InboundEvent.status == status)
    if resource_id:
        stmt = stmt.where(InboundEvent.resource_id == resource_id)
    if since is not None:
        stmt = stmt.where(InboundEvent.received_at >= since)
    if until is not None:
        stmt = stmt.where(InboundEvent.received_at < until)
    rows, next_cursor = paginate(session, stmt, InboundEvent.id, limit=limit, cursor=cursor)
    names.update(source_names(session, {e.source_id for e in rows} - set(names)))
    return rows, next_cursor, names


def source_names(session: Session, source_ids: set[str]) -> dict[str, str]:
    if not source_ids:
        return {}
    return dict(
        session.execute(
            select(InboundSource.id, InboundSource.name).where(InboundSource.id.in_(source_ids))
        ).all()
    )


def event_counts(session: Session, actor: Actor) -> dict[str, int]:
    """Received callbacks by status, every source's: one statement."""
    _require(actor, "read")
    rows = session.execute(select(InboundEvent.status, func.count()).group_by(InboundEvent.status))
    return {status: int(n) for status, n in rows}


def event(session: Session, actor: Actor, event_id: str) -> tuple[InboundEvent, str]:
    _require(actor, "read")
    found = session.get(InboundEvent, event_id)
    if found is None:
        raise NotFound(f"no inbound event {event_id!r}", details={"id": event_id})
    return found, source_names(session, {found.source_id}).get(found.source_id, "")


def replay(session: Session, rt: Runtime, actor: Actor, event_id: str) -> InboundEvent:
    """Process a stored callback again from its raw bytes (after the caller commits)."""
    _require(actor, "sources:write")
    replayed = replay_mod.replay(session, rt, event_id)
    audit.record(
        session,
        actor,
        "inbound_event.replayed",
        "inbound_event",
        replayed.id,
        event_id=replayed.event_id,
    )
    return replayed


def receive(rt: Runtime, source: str, headers: Sequence[tuple[str, str]], body: bytes) -> Receipt:
    """The public door: no actor, the source's signature over the raw bytes is the credential.

    Raises:
        NotFound, Unauthorized (signature), BadRequest (unusable body), PayloadTooLarge,
        StoreUnavailable (the partner should retry).
    """
    return receive_mod.receive(rt, source, headers, body)


def reconcile_now(
    rt: Runtime, actor: Actor, source_name: str | None = None
) -> list[reconcile_mod.Outcome]:
    """Pull the providers' current state now (sources with a reconcile URL) and apply it."""
    _require(actor, "sources:write")
    return reconcile_mod.reconcile_now(rt, source_name=source_name)
