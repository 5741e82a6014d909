"""Ordered delivery: one ordering key's events reach an ordered endpoint one at a time, in
the order their publishes committed.

How it works (docs/ordering.md tells the whole story):

- **Numbering, at publish.** For each ordered endpoint an event goes to, the publish
  transaction bumps the (endpoint, key) row of `ordering_sequences` with an upsert and stores
  the number and the previous event id on the delivery (`assign`). The row stays locked until
  that transaction commits, so a second publisher of the same key waits for the first: numbers
  follow commit order and have no gaps.
- **The gate, at claim.** A numbered delivery may be attempted only once the delivery numbered
  just before it (same endpoint, same key) is *released*: succeeded, or dead and either the
  endpoint says `on_dead: "skip"` or its dead letter is no longer open (discarded). `ready`
  is that condition in SQL; the engine's claim and the sweeper both use it, so it holds
  whatever wakes a delivery. Deliveries without a number (unordered endpoints, events without
  a key) pass it at the cost of one `IS NULL` test.
- **The wake, after a result is recorded.** `released_successors` finds the deliveries whose
  predecessor has just been released, for the engine to claim at once
  (`sender.engine.ordering`); the sweeper is the fallback.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Connection, Table, and_, bindparam, exists, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from app import headers as header_names
from app import operational
from app.models import (
    DEAD,
    DELIVERING,
    DL_OPEN,
    PENDING,
    RETRYING,
    SUCCEEDED,
    DeadLetter,
    Delivery,
    Endpoint,
    Event,
    OrderingSequence,
    Partner,
)
from app.vocabulary import OnDead, OperationalEventType

# Ids per IN (...) list, well under every driver's parameter limit.
_CHUNK = 500

MAX_ORDERING_KEY = 255

SEQUENCE_HEADER, PREVIOUS_ID_HEADER = header_names.SEQUENCE_HEADER, header_names.PREVIOUS_ID_HEADER

_DELIVERIES = cast(Table, Delivery.__table__)
_SEQUENCES = cast(Table, OrderingSequence.__table__)
_LETTERS = cast(Table, DeadLetter.__table__)
_ENDPOINTS = cast(Table, Endpoint.__table__)


def default_key(resource: Mapping[str, Any] | None) -> str | None:
    """`{type}:{id}` of the event's resource; a longer one than a key may be is hashed, so
    the same resource always gets the same key."""
    if not resource:
        return None
    key = f"{resource['type']}:{resource['id']}"
    if len(key) > MAX_ORDERING_KEY:
        return "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    return key


def headers(sequence: int | None, previous_event_id: str | None) -> dict[str, str] | None:
    """The headers an ordered delivery carries on every attempt (none for unordered ones)."""
    if sequence is None:
        return None
    out = {SEQUENCE_HEADER: str(sequence)}
    if previous_event_id is not None:
        out[PREVIOUS_ID_HEADER] = previous_event_id
    return out


@dataclass(frozen=True)
class Place:
    """A delivery's place in its key's sequence for one endpoint."""

    sequence: int
    previous_event_id: str | None


def assign(
    connection: Connection, endpoint_ids: Sequence[str], key: str, event_id: str
) -> dict[str, Place]:
    """Number `event_id` in `key`'s sequence of each endpoint, inside the publish transaction.

    The upsert locks each (endpoint, key) row until the caller commits; endpoints are taken in
    id order so that two publishes never wait for each other in a circle.
    """
    if not endpoint_ids:
        return {}
    rows = [
        {
            "endpoint_id": endpoint_id,
            "ordering_key": key,
            "last_seq": 1,
            "last_event_id": event_id,
            "previous_event_id": None,
        }
        for endpoint_id in sorted(set(endpoint_ids))
    ]
    insert = postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert
    upsert = insert(_SEQUENCES).values(rows)
    stmt = upsert.on_conflict_do_update(
        index_elements=["endpoint_id", "ordering_key"],
        set_={
            "last_seq": _SEQUENCES.c.last_seq + 1,
            "previous_event_id": _SEQUENCES.c.last_event_id,
            "last_event_id": upsert.excluded.last_event_id,
        },
    ).returning(_SEQUENCES.c.endpoint_id, _SEQUENCES.c.last_seq, _SEQUENCES.c.previous_event_id)
    return {
        row.endpoint_id: Place(int(row.last_seq), row.previous_event_id)
        for row in connection.execute(stmt)
    }


def _released(prev: Any, endpoint_id: Any) -> ColumnElement[bool]:
    """`prev` no longer holds its key: succeeded, or dead and let go (skip, or its letter
    is not open any more)."""
    on_dead = (
        select(_ENDPOINTS.c.on_dead)
        .where(_ENDPOINTS.c.id == endpoint_id)
        .correlate_except(_ENDPOINTS)
        .scalar_subquery()
    )
    open_letter = exists().where(_LETTERS.c.delivery_id == prev.c.id, _LETTERS.c.state == DL_OPEN)
    return or_(
        prev.c.state == SUCCEEDED,
        and_(prev.c.state == DEAD, or_(on_dead == OnDead.SKIP, ~open_letter)),
    )


def ready(deliveries: Any = _DELIVERIES) -> ColumnElement[bool]:
    """SQL: the delivery (a row of `deliveries`) may be attempted as far as ordering goes.

    An unnumbered delivery always may; a numbered one once the one before it is released, or
    when there is none (number 1, or its predecessor's event was deleted by retention).
    Built once per table: constructing it costs more CPU than the claim that uses it.
    """
    clause = _READY.get(deliveries)
    if clause is None:
        clause = _READY[deliveries] = _ready(deliveries)
    return clause


_READY: dict[Any, ColumnElement[bool]] = {}


def _ready(deliveries: Any) -> ColumnElement[bool]:
    prev = _DELIVERIES.alias("ordering_prev")
    held = (
        exists()
        .where(
            prev.c.endpoint_id == deliveries.c.endpoint_id,
            prev.c.ordering_key == deliveries.c.ordering_key,
            prev.c.ordering_seq == deliveries.c.ordering_seq - 1,
            ~_released(prev, deliveries.c.endpoint_id),
        )
        .correlate(deliveries)
    )
    return or_(deliveries.c.ordering_seq.is_(None), ~held)


def released_successors(session: Session | Connection, delivery_ids: Sequence[str]) -> list[str]:
    """The waiting deliveries whose predecessor is among `delivery_ids` and released now."""
    global _SUCCESSORS
    if _SUCCESSORS is None:
        prev = _DELIVERIES.alias("ordering_prev")
        nxt = _DELIVERIES.alias("ordering_next")
        _SUCCESSORS = (
            select(nxt.c.id)
            .select_from(
                prev.join(
                    nxt,
                    and_(
                        nxt.c.endpoint_id == prev.c.endpoint_id,
                        nxt.c.ordering_key == prev.c.ordering_key,
                        nxt.c.ordering_seq == prev.c.ordering_seq + 1,
                    ),
                )
            )
            .where(
                prev.c.id.in_(bindparam("ids", expanding=True)),
                prev.c.ordering_seq.is_not(None),
                nxt.c.state.in_((PENDING, RETRYING)),
                _released(prev, prev.c.endpoint_id),
            )
        )
    found: list[str] = []
    ids = sorted(set(delivery_ids))
    for chunk in (ids[i : i + _CHUNK] for i in range(0, len(ids), _CHUNK)):
        found += session.execute(_SUCCESSORS, {"ids": chunk}).scalars().all()
    return found


# Built on first use, like the gate: the wake runs after every recorded ordered batch.
_SUCCESSORS: Any = None


def released_at_endpoint(session: Session, endpoint_id: str) -> list[str]:
    """The waiting deliveries of an endpoint whose dead predecessor now lets them go (after
    its `on_dead` became "skip")."""
    prev = _DELIVERIES.alias("ordering_prev")
    nxt = _DELIVERIES.alias("ordering_next")
    return list(
        session.execute(
            select(nxt.c.id)
            .select_from(
                prev.join(
                    nxt,
                    and_(
                        nxt.c.endpoint_id == prev.c.endpoint_id,
                        nxt.c.ordering_key == prev.c.ordering_key,
                        nxt.c.ordering_seq == prev.c.ordering_seq + 1,
                    ),
                )
            )
            .where(
                prev.c.endpoint_id == endpoint_id,
                prev.c.ordering_seq.is_not(None),
                prev.c.state == DEAD,
                nxt.c.state.in_((PENDING, RETRYING)),
                _released(prev, prev.c.endpoint_id),
            )
        ).scalars()
    )


@dataclass(frozen=True)
class BlockedKey:
    """A key of an `on_dead: "block"` endpoint held by a dead delivery (its head)."""

    ordering_key: str
    sequence: int
    delivery_id: str
    event_id: str
    dead_letter_id: str
    reason: str
    waiting: int


def _head_candidates() -> tuple[Any, ColumnElement[bool]]:
    """Deliveries that hold their key: numbered, dead with an open letter, and nothing of
    their key has gone out after them. A key's head is its lowest-numbered such delivery."""
    d = _DELIVERIES
    later = _DELIVERIES.alias("ordering_later")
    gone_out_after = exists().where(
        later.c.endpoint_id == d.c.endpoint_id,
        later.c.ordering_key == d.c.ordering_key,
        later.c.ordering_seq > d.c.ordering_seq,
        later.c.state.in_((SUCCEEDED, DELIVERING)),
    )
    holding = d.join(_LETTERS, and_(_LETTERS.c.delivery_id == d.c.id, _LETTERS.c.state == DL_OPEN))
    return holding, and_(d.c.ordering_seq.is_not(None), d.c.state == DEAD, ~gone_out_after)


@dataclass(frozen=True)
class BlockedCount:
    """How many keys one `on_dead: "block"` endpoint holds."""

    endpoint_id: str
    partner_uid: str
    keys: int


def blocked_key_counts(session: Session) -> list[BlockedCount]:
    """Every live endpoint that holds at least one key, with how many: one statement,
    whatever the number of endpoints (for /metrics)."""
    d = _DELIVERIES
    holding, holds = _head_candidates()
    rows = session.execute(
        select(d.c.endpoint_id, Partner.uid, func.count(func.distinct(d.c.ordering_key)))
        .select_from(
            holding.join(_ENDPOINTS, _ENDPOINTS.c.id == d.c.endpoint_id).join(
                Partner, Partner.id == _ENDPOINTS.c.partner_id
            )
        )
        .where(holds, _ENDPOINTS.c.on_dead == OnDead.BLOCK, _ENDPOINTS.c.deleted_at.is_(None))
        .group_by(d.c.endpoint_id, Partner.uid)
        .order_by(d.c.endpoint_id)
    )
    return [BlockedCount(endpoint_id, uid, int(keys)) for endpoint_id, uid, keys in rows]


def blocked_keys(
    session: Session, endpoint_id: str, *, after: str | None = None, limit: int = 50
) -> list[BlockedKey]:
    """The keys an `on_dead: "block"` endpoint holds, by key, from `after` (exclusive).

    A key's head is its lowest-numbered dead delivery with an open dead letter after which
    nothing of the key has gone out; `waiting` counts what is held behind it. Resending or
    discarding the head's dead letter releases the key.
    """
    endpoint = session.get(Endpoint, endpoint_id)
    if endpoint is None or endpoint.on_dead != OnDead.BLOCK:
        return []
    d = _DELIVERIES
    holding, holds = _head_candidates()
    heads = (
        select(d.c.ordering_key, func.min(d.c.ordering_seq).label("seq"))
        .select_from(holding)
        .where(d.c.endpoint_id == endpoint_id, holds)
        .group_by(d.c.ordering_key)
        .order_by(d.c.ordering_key)
        .limit(limit)
    )
    if after is not None:
        heads = heads.where(d.c.ordering_key > after)
    found: list[BlockedKey] = []
    for key, seq in session.execute(heads).all():
        row = session.execute(
            select(d.c.id, d.c.event_id, _LETTERS.c.id.label("letter_id"), _LETTERS.c.reason)
            .join(_LETTERS, and_(_LETTERS.c.delivery_id == d.c.id, _LETTERS.c.state == DL_OPEN))
            .where(d.c.endpoint_id == endpoint_id, d.c.ordering_key == key, d.c.ordering_seq == seq)
        ).one()
        waiting = session.scalar(
            select(func.count())
            .select_from(d)
            .where(
                d.c.endpoint_id == endpoint_id,
                d.c.ordering_key == key,
                d.c.ordering_seq > seq,
                d.c.state.in_((PENDING, RETRYING, DEAD)),
            )
        )
        found.append(
            BlockedKey(
                key, int(seq), row.id, row.event_id, row.letter_id, row.reason, int(waiting or 0)
            )
        )
    return found


def report_blocked(
    session: Session, delivery: Delivery, event: Event, endpoint: Endpoint, letter: DeadLetter
) -> None:
    """Record `ordering.key_blocked` when a numbered delivery to an `on_dead: "block"`
    endpoint has just become a dead letter: its key waits behind it from now on. (Only a
    key's head is ever attempted, so the delivery that ran out of retries is its head.)"""
    if delivery.ordering_seq is None or delivery.ordering_key is None:
        return
    if endpoint.on_dead != OnDead.BLOCK:
        return
    operational.about_delivery(
        session,
        OperationalEventType.ORDERING_KEY_BLOCKED,
        event,
        endpoint,
        {
            "ordering_key": delivery.ordering_key,
            "sequence": delivery.ordering_seq,
            "event": event.id,
            "delivery": delivery.id,
            "dead_letter": letter.id,
            "reason": letter.reason,
        },
    )


def _holding_head(head: Any) -> ColumnElement[bool]:
    """`head` (an alias of deliveries) holds its key: dead with an open letter, and nothing
    of its key has gone out after it."""
    later = _DELIVERIES.alias("ordering_after_head")
    letter = _LETTERS.alias("ordering_head_letter")
    return and_(
        head.c.state == DEAD,
        exists().where(letter.c.delivery_id == head.c.id, letter.c.state == DL_OPEN),
        ~exists().where(
            later.c.endpoint_id == head.c.endpoint_id,
            later.c.ordering_key == head.c.ordering_key,
            later.c.ordering_seq > head.c.ordering_seq,
            later.c.state.in_((SUCCEEDED, DELIVERING)),
        ),
    )


def held_behind_blocked_key() -> ColumnElement[bool]:
    """SQL: a waiting numbered delivery (a row of `deliveries`) of an `on_dead: "block"`
    endpoint sits behind a dead delivery of its key that holds the key: nothing of it is
    sent until an operator resends or discards that one's dead letter."""
    d = _DELIVERIES
    head = _DELIVERIES.alias("ordering_head")
    on_dead = (
        select(_ENDPOINTS.c.on_dead)
        .where(_ENDPOINTS.c.id == d.c.endpoint_id)
        .correlate_except(_ENDPOINTS)
        .scalar_subquery()
    )
    return and_(
        d.c.ordering_seq.is_not(None),
        d.c.state.in_((PENDING, RETRYING)),
        on_dead == OnDead.BLOCK,
        exists()
        .where(
            head.c.endpoint_id == d.c.endpoint_id,
            head.c.ordering_key == d.c.ordering_key,
            head.c.ordering_seq < d.c.ordering_seq,
            _holding_head(head),
        )
        .correlate(d),
    )


@dataclass(frozen=True)
class HeldBy:
    """The dead delivery (and its open dead letter) that a waiting delivery sits behind."""

    ordering_key: str
    sequence: int
    delivery_id: str
    event_id: str
    dead_letter_id: str


def held_by(session: Session, delivery: Delivery) -> HeldBy | None:
    """What holds this waiting delivery's key (None: nothing does, or it is not waiting)."""
    if delivery.ordering_seq is None or delivery.state not in (PENDING, RETRYING):
        return None
    endpoint = session.get(Endpoint, delivery.endpoint_id)
    if endpoint is None or endpoint.on_dead != OnDead.BLOCK:
        return None
    head = _DELIVERIES.alias("ordering_head")
    row = session.execute(
        select(head.c.id, head.c.event_id, head.c.ordering_seq, _LETTERS.c.id.label("letter"))
        .join(_LETTERS, and_(_LETTERS.c.delivery_id == head.c.id, _LETTERS.c.state == DL_OPEN))
        .where(
            head.c.endpoint_id == delivery.endpoint_id,
            head.c.ordering_key == delivery.ordering_key,
            head.c.ordering_seq < delivery.ordering_seq,
            _holding_head(head),
        )
        .order_by(head.c.ordering_seq)
        .limit(1)
    ).first()
    if row is None:
        return None
    return HeldBy(
        str(delivery.ordering_key), int(row.ordering_seq), row.id, row.event_id, row.letter
    )
