"""A publish's targets: the partner, its live endpoints and the contract, read in one round
trip, and the per-process cache the PostgreSQL hot path reads them from.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from app import event_types
from app.errors import NotFound
from app.intake import sql
from app.vocabulary import Ordering


@dataclass(frozen=True)
class Targets:
    """What a publish plan is made from; `digest` (PostgreSQL) fingerprints the endpoints."""

    partner_id: str
    # (endpoint id, state, subscribed types or None, pinned versions or None, mode)
    endpoints: list[tuple[str, str, list[str] | None, dict[str, Any] | None, str]]
    contract: event_types.Contract | None
    digest: str | None = None
    sunset_at: datetime | None = None
    # The endpoints with `ordering: "key"`.
    ordered: frozenset[str] = frozenset()
    # Endpoint id -> its filter, for the endpoints that have one.
    filters: dict[str, str] = field(default_factory=dict)


def read_targets(
    connection: Connection, partner_uid: str, type_: str, version: int, *, with_digest: bool = False
) -> Targets:
    """The partner, its live endpoints and the contract, in one round trip; `with_digest`
    (PostgreSQL only) adds the endpoints' digest a guarded write checks.

    Raises:
        NotFound: the partner does not exist.
    """
    statement = sql.TARGETS_WITH_DIGEST if with_digest else sql.TARGETS
    rows = connection.execute(
        statement, {"uid": partner_uid, "type_name": type_, "type_version": version}
    ).all()
    if not rows:
        raise NotFound(f"partner {partner_uid!r} does not exist", details={"uid": partner_uid})
    first = rows[0]
    return Targets(
        partner_id=first.partner_id,
        endpoints=[
            (row.endpoint_id, row.state, row.event_types, row.versions, row.mode)
            for row in rows
            if row.endpoint_id is not None
        ],
        contract=event_types.contract_from(
            connection, first.contract_id, first.deprecated, type_, version
        ),
        digest=first.digest if with_digest else None,
        sunset_at=first.sunset_at,
        ordered=frozenset(row.endpoint_id for row in rows if row.ordering == Ordering.KEY),
        filters={row.endpoint_id: row.filter for row in rows if row.filter is not None},
    )


# Bound of the targets cache, in endpoints held: at the bound it is emptied and each
# (partner, type, version) read again on its next publish.
TARGETS_CACHE_MAX_ENDPOINTS = 100_000


class TargetsCache:
    """Recent targets per (partner uid, type, version), for the PostgreSQL hot path.

    An entry may be stale: the write it feeds re-checks the endpoints' digest in the same
    statement and writes nothing if they changed, and the entry is then dropped. The contract
    (row id and compiled schema) never changes once published. Bounded by the endpoints it
    holds, since one partner may have thousands.
    """

    def __init__(self, max_endpoints: int = TARGETS_CACHE_MAX_ENDPOINTS) -> None:
        self._items: dict[tuple[str, str, int], Targets] = {}
        self._held = 0
        self._lock = threading.Lock()
        self._max = max_endpoints

    def get(self, key: tuple[str, str, int]) -> Targets | None:
        return self._items.get(key)

    def put(self, key: tuple[str, str, int], targets: Targets) -> None:
        with self._lock:
            if self._held + len(targets.endpoints) + 1 > self._max:
                self._items.clear()
                self._held = 0
            old = self._items.pop(key, None)
            if old is not None:
                self._held -= len(old.endpoints) + 1
            self._items[key] = targets
            self._held += len(targets.endpoints) + 1

    def drop(self, key: tuple[str, str, int]) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._held -= len(old.endpoints) + 1


targets_cache = TargetsCache()
