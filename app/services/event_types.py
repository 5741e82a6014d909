"""Event types (contracts): register a version, read, list, deprecate — audited.

Contracts belong to the publishers: a partner-bound actor reads the catalog but never changes
it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app import event_types, operational
from app.clock import isoformat, utcnow
from app.errors import NotFound
from app.event_types.examples import made_for, own_example
from app.models import Delivery, Endpoint, Event, EventType
from app.pagination import paginate
from app.services import audit
from app.services.actor import Actor
from app.vocabulary import OperationalEventType

Registered = event_types.Registered


def _require_publisher(actor: Actor) -> None:
    actor.require("events:write")
    if actor.bound_to_partner:
        raise NotFound("not found")


def register(session: Session, actor: Actor, body: dict[str, Any], *, max_bytes: int) -> Registered:
    """Register a version; `max_bytes` (`KURIR_MAX_PAYLOAD_BYTES`) bounds what its downgrade
    may make."""
    _require_publisher(actor)
    result = event_types.register(session, body, max_bytes=max_bytes)
    row = result.event_type
    if result.created:
        audit.record(
            session,
            actor,
            "event_type.registered",
            "event_type",
            row.id,
            name=row.name,
            version=row.version,
        )
    return result


def get(session: Session, actor: Actor, name: str, version: int) -> EventType:
    actor.require("read")
    return event_types.get(session, name, version)


def page(
    session: Session, actor: Actor, *, name: str | None, limit: int, cursor: str | None
) -> tuple[list[EventType], str | None]:
    actor.require("read")
    stmt = select(EventType)
    if name:
        stmt = stmt.where(EventType.name == name)
    return paginate(session, stmt, EventType.id, limit=limit, cursor=cursor)


def deprecate(
    session: Session, actor: Actor, name: str, version: int, sunset_at: datetime | None = None
) -> EventType:
    """Deprecate a version (publishes of it get a warning); `sunset_at` says when endpoints
    still pinned to it start being reported. They keep receiving it: a sunset never breaks a
    partner silently."""
    _require_publisher(actor)
    row = event_types.get(session, name, version)
    if not row.deprecated or (sunset_at is not None and sunset_at != row.sunset_at):
        event_types.deprecate(session, name, version, sunset_at)
        audit.record(
            session,
            actor,
            "event_type.deprecated",
            "event_type",
            row.id,
            name=name,
            version=version,
            sunset_at=isoformat(row.sunset_at),
        )
    return row


@dataclass(frozen=True)
class Adoption:
    """Who is on one version: endpoints pinned to it and deliveries of it lately."""

    event_type: EventType
    pinned: list[str]
    deliveries_7d: int


def adoption(
    session: Session, actor: Actor, name: str, now: datetime | None = None
) -> list[Adoption]:
    """Every version of `name`, newest first, with its pinned endpoints and its deliveries of
    the last 7 days (a delivery carries its pin, or the version published)."""
    actor.require("read")
    rows = list(
        session.scalars(
            select(EventType).where(EventType.name == name).order_by(EventType.version.desc())
        )
    )
    if not rows:
        raise NotFound(f"event type {name} does not exist", details={"name": name})
    since = (now or utcnow()) - timedelta(days=7)
    delivered_version = func.coalesce(Delivery.version, Event.version)
    counted = (
        select(delivered_version, func.count())
        .select_from(Delivery)
        .join(Event, Event.id == Delivery.event_id)
        .where(Event.type == name, Event.created_at >= since)
        .group_by(delivered_version)
    )
    if actor.partner_id is not None:  # a partner sees its own adoption only
        counted = counted.where(Event.partner_id == actor.partner_id)
    counts = dict(session.execute(counted).all())
    pins = pinned_endpoints(session, name, actor.partner_id)
    return [
        Adoption(row, sorted(pins.get(row.version, [])), int(counts.get(row.version, 0)))
        for row in rows
    ]


@dataclass(frozen=True)
class CatalogEntry:
    """One event type: every version, newest first, and which endpoints pin which."""

    name: str
    versions: list[EventType]
    pinned: dict[int, list[str]]

    @property
    def latest(self) -> EventType:
        return self.versions[0]

    @property
    def description(self) -> str | None:
        return next((v.description for v in self.versions if v.description), None)


def catalog(session: Session, actor: Actor) -> list[CatalogEntry]:
    """Every event type an endpoint can subscribe to (Kurir's own are left out), by name,
    with the pins of the endpoints the actor may see."""
    actor.require("read")
    rows = session.scalars(
        select(EventType)
        .where(~EventType.name.startswith(event_types.RESERVED_PREFIX, autoescape=True))
        .order_by(EventType.name, EventType.version.desc())
    )
    by_name: dict[str, list[EventType]] = {}
    for row in rows:
        by_name.setdefault(row.name, []).append(row)
    stmt = select(Endpoint.id, Endpoint.versions).where(Endpoint.deleted_at.is_(None))
    if actor.partner_id is not None:
        stmt = stmt.where(Endpoint.partner_id == actor.partner_id)
    pins: dict[str, dict[int, list[str]]] = {}
    for endpoint_id, versions in session.execute(stmt):
        for name, version in (versions or {}).items():
            pins.setdefault(name, {}).setdefault(int(version), []).append(endpoint_id)
    return [CatalogEntry(name, rows, pins.get(name, {})) for name, rows in by_name.items()]


# Bound of the example cache (one per contract version shown): at the bound it is emptied.
# An entry is at most about `schema_example.MAX_BYTES` of JSON.
EXAMPLES_MAX = 256


class _ExampleCache:
    """Examples made from schemas, by event-type row id, made once per process: a version's
    schema never changes, and the catalog shows every version on every page view. `made`
    counts the examples actually made (what a test can watch)."""

    def __init__(self, max_size: int = EXAMPLES_MAX) -> None:
        self._items: dict[str, dict[str, Any] | None] = {}
        self._lock = threading.Lock()
        self._max = max_size
        self.made = 0

    def get(self, row: EventType) -> dict[str, Any] | None:
        if row.id in self._items:
            return self._items[row.id]
        value = made_for(row.schema)
        found = value if isinstance(value, dict) else None
        with self._lock:
            self.made += 1
            if len(self._items) >= self._max:
                self._items.clear()
            self._items[row.id] = found
        return found


examples = _ExampleCache()


def example(row: EventType) -> dict[str, Any] | None:
    """The `data` of an example event of this version (callers do not change it): its first
    registered example, else its schema's own `examples`, both read with the row, else one
    made from the schema within `app.event_types.examples`'s budget, once per version."""
    if row.examples:
        return dict(row.examples[0])
    own = own_example(row.schema)
    if own is not None:
        return own if isinstance(own, dict) else None
    return examples.get(row)


def pinned_endpoints(
    session: Session, name: str, partner_id: str | None = None
) -> dict[int, list[str]]:
    """Version -> ids of the live endpoints (of one partner, when given) pinned to it."""
    found: dict[int, list[str]] = {}
    stmt = select(Endpoint.id, Endpoint.versions).where(
        Endpoint.deleted_at.is_(None), Endpoint.versions.is_not(None)
    )
    if partner_id is not None:
        stmt = stmt.where(Endpoint.partner_id == partner_id)
    for endpoint_id, versions in session.execute(stmt):
        version = (versions or {}).get(name)
        if version is not None:
            found.setdefault(int(version), []).append(endpoint_id)
    return found


def report_sunsets(session: Session, now: datetime | None = None) -> int:
    """Record (and so publish) `event_type.sunset_passed` once per endpoint still pinned to a
    version whose sunset has passed, as of `now`; returns how many. Run by the scheduler."""
    now = now or utcnow()
    recorded = 0
    for row in session.scalars(
        select(EventType)
        .where(
            EventType.sunset_at.is_not(None),
            EventType.sunset_at <= now,
            EventType.sunset_reported_at.is_(None),
        )
        .with_for_update(skip_locked=True)
    ):
        for endpoint_id in sorted(pinned_endpoints(session, row.name).get(row.version, [])):
            operational.about_endpoint(
                session,
                OperationalEventType.EVENT_TYPE_SUNSET_PASSED,
                session.get_one(Endpoint, endpoint_id),
                {"type": row.name, "version": row.version, "sunset_at": isoformat(row.sunset_at)},
                now=now,
            )
            recorded += 1
        row.sunset_reported_at = now
    return recorded
