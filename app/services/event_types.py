"""Event types (contracts): register a version, read, list, deprecate — audited.

Contracts belong to the publishers: a partner-bound actor reads the catalog but never changes
it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app import contracts
from app.errors import NotFound
from app.models import EventType
from app.pagination import paginate
from app.schema_example import example_for
from app.services import audit
from app.services.actor import Actor

Registered = contracts.Registered


def _require_publisher(actor: Actor) -> None:
    actor.require("events:write")
    if actor.bound_to_partner:
        raise NotFound("not found")


def register(session: Session, actor: Actor, body: dict[str, Any]) -> Registered:
    _require_publisher(actor)
    result = contracts.register(session, body)
    row = result.event_type
    if result.created:
        audit.record(session, actor, "event_type.registered", "event_type", row.id,
                     name=row.name, version=row.version)
    return result


def get(session: Session, actor: Actor, name: str, version: int) -> EventType:
    actor.require("read")
    return contracts.get(session, name, version)


def page(session: Session, actor: Actor, *, name: str | None, limit: int,
         cursor: str | None) -> tuple[list[EventType], str | None]:
    actor.require("read")
    stmt = select(EventType)
    if name:
        stmt = stmt.where(EventType.name == name)
    return paginate(session, stmt, EventType.id, limit=limit, cursor=cursor)


def deprecate(session: Session, actor: Actor, name: str, version: int) -> EventType:
    _require_publisher(actor)
    row = contracts.get(session, name, version)
    if not row.deprecated:
        contracts.deprecate(session, name, version)
        audit.record(session, actor, "event_type.deprecated", "event_type", row.id,
                     name=name, version=version)
    return row


@dataclass(frozen=True)
class CatalogEntry:
    """One event type as a subscriber reads it: every version, newest first."""

    name: str
    versions: list[EventType]

    @property
    def latest(self) -> EventType:
        return self.versions[0]

    @property
    def description(self) -> str | None:
        return next((v.description for v in self.versions if v.description), None)


def catalog(session: Session, actor: Actor) -> list[CatalogEntry]:
    """Every event type an endpoint can subscribe to (Kurir's own are left out), by name."""
    actor.require("read")
    rows = session.scalars(select(EventType).where(
        ~EventType.name.startswith(contracts.RESERVED_PREFIX, autoescape=True))
        .order_by(EventType.name, EventType.version.desc()))
    entries: dict[str, list[EventType]] = {}
    for row in rows:
        entries.setdefault(row.name, []).append(row)
    return [CatalogEntry(name, versions) for name, versions in entries.items()]


def example(row: EventType) -> dict[str, Any] | None:
    """The `data` of an example event of this version: the contract's own example (its
    schema's `examples`), or one made from the schema."""
    value = example_for(row.schema)
    return value if isinstance(value, dict) else None
