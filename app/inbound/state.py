"""Resource state that only moves forward: the ordering rule and its compare-and-set.

Every change to a resource's state goes through :func:`compare_and_set`, one conditional
``UPDATE … WHERE id = :id AND (last_version IS NULL OR last_version < :v)``. The decision
taken beforehand on a read (:func:`decide`) is only advice; the database re-checks the
condition atomically under its row lock, so two workers can never apply out of order: the
later one updates nothing and its event is classified again against the newer state.

Ordering is by ``resource_version`` when the event has one, else by ``occurred_at``. A
resource ordered by version is never moved by an event without one (that would compare
apples with clocks): such an event is a contradiction, quarantined for reconciliation.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, Update, and_, bindparam, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection

from app.clock import isoformat, utcnow
from app.models import ResourceState

# Core table for the conditional statements (typed as a Table for mypy).
_STATES = cast(Table, ResourceState.__table__)

APPLY, STALE, GAP, CONTRADICTION, ALREADY_APPLIED = (
    "apply",
    "stale",
    "gap",
    "contradiction",
    "already_applied",
)


@dataclass(frozen=True)
class Ordering:
    """Where an event (or a snapshot) sits in its resource's history, and what it says."""

    version: int | None
    occurred_at: datetime | None
    status: str | None


@dataclass(frozen=True)
class Decision:
    kind: str
    reason: str | None = None


def decide(
    event: Ordering,
    state: ResourceState | StateRow,
    *,
    allow_gaps: bool,
    event_id: str | None = None,
) -> Decision:
    """Pure: what to do with an event given the resource's current state."""
    if event.version is not None:
        last = state.last_version
        if last is not None:
            if event.version < last:
                return Decision(STALE, "stale_event")
            if event.version == last:
                if event_id is not None and state.last_event_id == event_id:
                    return Decision(ALREADY_APPLIED, "already_applied")
                if (
                    event.status is not None
                    and state.status is not None
                    and event.status != state.status
                ):
                    return Decision(
                        CONTRADICTION,
                        f"contradiction: version {last} is already applied with "
                        f"status {state.status!r}, this event says "
                        f"{event.status!r}",
                    )
                return Decision(STALE, "stale_event")
            if not allow_gaps and event.version > last + 1:
                return Decision(
                    GAP, f"version_gap: expected version {last + 1}, got {event.version}"
                )
        elif not allow_gaps and event.version > 1:
            return Decision(
                GAP, f"version_gap: first version seen is {event.version}, expected 1 (or 0)"
            )
        return Decision(APPLY)
    if state.last_version is not None:
        return Decision(
            CONTRADICTION,
            "contradiction: the event has no resource_version but "
            "the resource is ordered by version",
        )
    if event.occurred_at is None:
        # Receive refuses a resource event with neither; a replayed old row may still lack it.
        return Decision(
            CONTRADICTION, "contradiction: the event has neither resource_version nor occurred_at"
        )
    last_time = state.last_occurred_at
    if last_time is not None:
        if event.occurred_at < last_time:
            return Decision(STALE, "stale_event")
        if event.occurred_at == last_time:
            if event_id is not None and state.last_event_id == event_id:
                return Decision(ALREADY_APPLIED, "already_applied")
            if (
                event.status is not None
                and state.status is not None
                and event.status != state.status
            ):
                return Decision(
                    CONTRADICTION,
                    f"contradiction: {isoformat(last_time)} is already applied "
                    f"with status {state.status!r}, this event says "
                    f"{event.status!r}",
                )
            return Decision(STALE, "stale_event")
    return Decision(APPLY)


@dataclass(frozen=True)
class StateRow:
    """A resource's state as read for one decision (a plain value, not a tracked ORM object)."""

    id: str
    resource_type: str
    resource_id: str
    last_version: int | None
    last_occurred_at: datetime | None
    status: str | None
    last_event_id: str | None
    placeholder: bool


_C = _STATES.c
_COLUMNS = (
    _C.id,
    _C.resource_type,
    _C.resource_id,
    _C.last_version,
    _C.last_occurred_at,
    _C.status,
    _C.last_event_id,
    _C.placeholder,
)
# Built once, values as parameters: these run for every processed event.
_BY_KEY = select(*_COLUMNS).where(
    _C.source_id == bindparam("source_id"),
    _C.resource_type == bindparam("resource_type"),
    _C.resource_id == bindparam("resource_id"),
)
_BY_KEY_LOCKED = _BY_KEY.with_for_update()
_BY_ID = select(*_COLUMNS).where(_C.id == bindparam("state_id"))
_BY_ID_LOCKED = _BY_ID.with_for_update()
_LOCK_CHUNK = 1000
_PLACEHOLDERS = {
    name: maker(_STATES).on_conflict_do_nothing(
        index_elements=["source_id", "resource_type", "resource_id"]
    )
    for name, maker in (("postgresql", pg_insert), ("sqlite", sqlite_insert))
}


def ensure_state(
    connection: Connection,
    source_id: str,
    resource_type: str | None,
    resource_id: str,
    *,
    lock: bool = False,
) -> StateRow:
    """The resource's state row, created as a placeholder if the resource is unknown.

    ``lock`` takes the row lock (PostgreSQL ``FOR UPDATE``) so a source that forbids gaps
    checks and applies each resource's events one at a time. SQLite serialises writers anyway.
    """
    key = {"source_id": source_id, "resource_type": resource_type or "", "resource_id": resource_id}
    stmt = _BY_KEY_LOCKED if lock else _BY_KEY
    row = connection.execute(stmt, key).one_or_none()
    if row is None:
        connection.execute(_PLACEHOLDERS[connection.dialect.name], {**key, "placeholder": True})
        row = connection.execute(stmt, key).one()
    return StateRow(*row)


StateKey = tuple[str, str, str]
"""(source id, resource type or "", resource id): what a state row is unique on."""


def lock_states(connection: Connection, keys: Iterable[StateKey]) -> dict[StateKey, StateRow]:
    """The state rows of many resources, each locked (``FOR UPDATE``) until the transaction
    ends; a resource with no row yet is absent (see :func:`create_placeholders`).

    Rows are locked in key order, by code point (``COLLATE "C"`` on PostgreSQL, as Python
    sorts), the order every batch uses: two batches that share resources then queue up
    instead of deadlocking, and a batch that holds the locks can apply its events in
    whatever order they arrived, knowing that what it read is what its conditional UPDATEs
    will find.
    """
    wanted = sorted(set(keys))
    groups: dict[tuple[str, str], list[str]] = {}
    for source_id, resource_type, resource_id in wanted:
        groups.setdefault((source_id, resource_type), []).append(resource_id)
    order = (
        _C.resource_id.collate("C") if connection.dialect.name == "postgresql" else _C.resource_id
    )
    found: dict[StateKey, StateRow] = {}
    for (source_id, resource_type), resource_ids in groups.items():
        for start in range(0, len(resource_ids), _LOCK_CHUNK):
            rows = connection.execute(
                select(*_COLUMNS)
                .where(
                    _C.source_id == source_id,
                    _C.resource_type == resource_type,
                    _C.resource_id.in_(resource_ids[start : start + _LOCK_CHUNK]),
                )
                .order_by(order)
                .with_for_update()
            )
            for row in rows:
                state = StateRow(*row)
                found[(source_id, resource_type, state.resource_id)] = state
    return found


def create_placeholders(connection: Connection, keys: Iterable[StateKey]) -> None:
    """Create the state rows of resources never seen (in key order; existing ones are left).

    Run in a transaction of its own, committed before :func:`lock_states`: locking rows
    that exist and then creating others would take locks out of order.
    """
    connection.execute(
        _PLACEHOLDERS[connection.dialect.name],
        [
            {
                "source_id": source_id,
                "resource_type": resource_type,
                "resource_id": resource_id,
                "placeholder": True,
            }
            for source_id, resource_type, resource_id in sorted(set(keys))
        ],
    )


def reload(connection: Connection, state_id: str, *, lock: bool = False) -> StateRow:
    row = connection.execute(_BY_ID_LOCKED if lock else _BY_ID, {"state_id": state_id}).one()
    return StateRow(*row)


def compare_and_set(
    connection: Connection,
    state_id: str,
    event: Ordering,
    *,
    last_event_id: str | None,
    data: dict[str, Any] | None = None,
    allow_equal: bool = False,
    now: datetime | None = None,
) -> bool:
    """Apply ``event`` to the state in ONE conditional UPDATE; False if it is not newer.

    ``allow_equal`` lets a provider snapshot correct the status at the version already
    applied (reconciliation): the version still never goes backwards.
    """
    statement, values = _conditional_update(
        state_id, event, last_event_id=last_event_id, data=data, allow_equal=allow_equal, now=now
    )
    result = connection.execute(statement, values)
    return bool(result.rowcount)


@dataclass(frozen=True)
class Write:
    """One compare-and-set to send: apply ``event`` to the state ``state_id``."""

    state_id: str
    event: Ordering
    last_event_id: str | None


def compare_and_set_many(
    connection: Connection, writes: Sequence[Write], *, now: datetime | None = None
) -> int:
    """Many :func:`compare_and_set`, in order, one executemany per run of the same statement
    shape; returns how many applied. Each is still the single conditional UPDATE."""
    applied = 0
    shape: Update | None = None
    group: list[dict[str, Any]] = []
    now = now or utcnow()
    for write in writes:
        statement, values = _conditional_update(
            write.state_id,
            write.event,
            last_event_id=write.last_event_id,
            data=None,
            allow_equal=False,
            now=now,
        )
        if statement is not shape and group:
            applied += connection.execute(shape, group).rowcount  # type: ignore[arg-type]
            group = []
        shape = statement
        group.append(values)
    if group:
        applied += connection.execute(shape, group).rowcount  # type: ignore[arg-type]
    return int(applied)


def written(state: StateRow, write: Write) -> StateRow:
    """The row :func:`compare_and_set` leaves when ``write`` applies to ``state``: the SET
    of :func:`_cas_statement`, in Python, so a batch that holds the row's lock decides its
    next event of the resource without reading it again."""
    event = write.event
    return replace(
        state,
        last_version=event.version if event.version is not None else state.last_version,
        last_occurred_at=event.occurred_at
        if event.occurred_at is not None
        else state.last_occurred_at,
        status=event.status if event.status is not None else state.status,
        last_event_id=write.last_event_id,
        placeholder=False,
    )


def _conditional_update(
    state_id: str,
    event: Ordering,
    *,
    last_event_id: str | None,
    data: dict[str, Any] | None,
    allow_equal: bool,
    now: datetime | None,
) -> tuple[Update, dict[str, Any]]:
    """The compare-and-set statement for this event's shape, and its parameters."""
    values: dict[str, Any] = {
        "b_state_id": state_id,
        "b_placeholder": False,
        "b_updated_at": now or utcnow(),
        "b_last_event_id": last_event_id,
        "b_status": event.status,
        "b_data": data,
        "b_version": event.version,
        "b_occurred_at": event.occurred_at,
    }
    statement = _cas_statement(
        event.version is not None,
        event.occurred_at is not None,
        event.status is not None,
        data is not None,
        allow_equal,
    )
    return statement, values


@functools.cache
def _cas_statement(
    has_version: bool, has_time: bool, has_status: bool, has_data: bool, allow_equal: bool
) -> Update:
    """Built once per shape, values as parameters: it runs for every applied event."""
    col = _STATES.c
    values: dict[str, Any] = {
        "placeholder": bindparam("b_placeholder"),
        "updated_at": bindparam("b_updated_at", type_=col.updated_at.type),
        "last_event_id": bindparam("b_last_event_id"),
    }
    if has_status:
        values["status"] = bindparam("b_status")
    if has_data:
        values["data"] = bindparam("b_data", type_=col.data.type)
    version = bindparam("b_version", type_=col.last_version.type)
    occurred_at = bindparam("b_occurred_at", type_=col.last_occurred_at.type)
    if has_version:
        values["last_version"] = version
        if has_time:
            values["last_occurred_at"] = occurred_at
        newer = col.last_version <= version if allow_equal else col.last_version < version
        condition = or_(col.last_version.is_(None), newer)
    elif has_time:
        values["last_occurred_at"] = occurred_at
        later = (
            col.last_occurred_at <= occurred_at
            if allow_equal
            else col.last_occurred_at < occurred_at
        )
        condition = and_(col.last_version.is_(None), or_(col.last_occurred_at.is_(None), later))
    else:
        # An unordered snapshot: the provider's word, but it cannot undo a known version.
        condition = col.last_version.is_(None)
    return update(_STATES).where(col.id == bindparam("b_state_id"), condition).values(**values)


def state_to_dict(state: ResourceState, source_name: str) -> dict[str, Any]:
    """The API shape of ``GET /v1/sources/{source}/resources/{resource_id}``."""
    return {
        "source": source_name,
        "resource_type": state.resource_type or None,
        "resource_id": state.resource_id,
        "status": state.status,
        "version": state.last_version,
        "occurred_at": isoformat(state.last_occurred_at),
        "updated_at": isoformat(state.updated_at),
        "placeholder": state.placeholder,
    }
