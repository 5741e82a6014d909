"""What a delivery sends: the exact bytes of its body, and the contract version they carry.

A delivery made for the version published sends its event's `payload`; one made for another
version (its endpoint's pin) sends that version's `event_versions` row. Both are stored
serialised once, at publish, and never re-serialised: every attempt and every resend signs
and POSTs these bytes. The engine reads them here (on PostgreSQL its claim returns the same
column, `payload_column`, with the UPDATE), and every page that shows "the body sent" reads
them here too, so what an operator or a partner is shown is what the endpoint received and
checked its signature over — never the published event, never a pretty-printed copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import ColumnElement, Table, case, func, select
from sqlalchemy.orm import Session

from app.models import Delivery, Event, EventVersion

# A delivery's body is its event's published payload (version None) or, for an endpoint
# pinned to another contract version, that version's.
BodyKey = tuple[str, int | None]

# Ids per IN (...) list: well under every driver's parameter limit.
_CHUNK = 500


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


def payload_column(deliveries: Table, events: Table) -> ColumnElement[Any]:
    """SQL: the body of a row of `deliveries` joined to its row of `events`.

    The unpinned deliveries (nearly all) never look at `event_versions`.
    """
    versions = cast(Table, EventVersion.__table__)
    versioned = (
        select(versions.c.payload)
        .where(
            versions.c.event_id == deliveries.c.event_id, versions.c.version == deliveries.c.version
        )
        .scalar_subquery()
    )
    return case((deliveries.c.version.is_(None), events.c.payload), else_=versioned)


def read_bodies(session: Session, keys: set[BodyKey]) -> dict[BodyKey, bytes]:
    """The exact bytes every attempt sends: the published payload, or a pinned version's."""
    bodies: dict[BodyKey, bytes] = {}
    published = sorted({event_id for event_id, version in keys if version is None})
    for chunk in _chunks(published):
        for event_id, payload in session.execute(
            select(Event.id, Event.payload).where(Event.id.in_(chunk))
        ):
            bodies[(event_id, None)] = payload.encode("utf-8")
    pinned = sorted({event_id for event_id, version in keys if version is not None})
    for chunk in _chunks(pinned):
        for event_id, version, payload in session.execute(
            select(EventVersion.event_id, EventVersion.version, EventVersion.payload).where(
                EventVersion.event_id.in_(chunk)
            )
        ):
            bodies[(event_id, version)] = payload.encode("utf-8")
    return bodies


@dataclass(frozen=True)
class Sent:
    """What one delivery sends on every attempt: its contract version and its exact body."""

    version: int  # the envelope's `version`: the pin, or the version published
    published_version: int
    body: bytes | None  # None only when the row it comes from is gone


def delivered_version(delivery: Delivery, published_version: int) -> int:
    """The version a delivery carries: its own when it was made for a pin, else the event's."""
    return delivery.version if delivery.version is not None else published_version


def sent_by(session: Session, delivery: Delivery, event: Event) -> Sent:
    """What `delivery` (of `event`) sends, read as the engine reads it."""
    key = (delivery.event_id, delivery.version)
    return Sent(
        delivered_version(delivery, event.version),
        event.version,
        read_bodies(session, {key}).get(key),
    )


def delivered_versions(session: Session, delivery_ids: Iterable[str]) -> dict[str, int]:
    """Delivery id -> the version it carries, for a page of rows, in one query per chunk."""
    out: dict[str, int] = {}
    version = func.coalesce(Delivery.version, Event.version)
    for chunk in _chunks(sorted(set(delivery_ids))):
        out.update(
            session.execute(
                select(Delivery.id, version)
                .join(Event, Event.id == Delivery.event_id)
                .where(Delivery.id.in_(chunk))
            ).all()
        )
    return out
