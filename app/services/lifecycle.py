"""Storage and retention as operators see them: rows (and bytes) per table, and per kind
of history its retention period, horizon, rows purged and oldest row kept.

Figures over every partner, so an actor bound to one partner is answered `404 not_found`,
as on the dashboard. The purge itself is the scheduler's (`app.lifecycle.purge`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from app.clock import utcnow
from app.config import Settings
from app.errors import NotFound
from app.lifecycle import marks, policy, stats
from app.lifecycle.marks import Mark
from app.lifecycle.stats import TableStat
from app.services.actor import Actor
from app.vocabulary import RetentionKind

__all__ = ["KindRetention", "Mark", "Storage", "TableStat", "kinds", "storage"]


@dataclass(frozen=True)
class KindRetention:
    """One kind of history: how long it is kept, the horizon now, what retention did."""

    kind: RetentionKind
    days: int
    horizon: datetime  # rows finished before this are purged by the next run
    mark: Mark


@dataclass(frozen=True)
class Storage:
    tables: list[TableStat]
    kinds: list[KindRetention]


def _require_operator(actor: Actor) -> None:
    if actor.bound_to_partner:
        raise NotFound("not found")
    actor.require("read")


def kinds(session: Session, settings: Settings, now: datetime | None = None) -> list[KindRetention]:
    """Every kind's retention and marks (one statement: the marks)."""
    now = now or utcnow()
    days = policy.retention_days(settings)
    horizons = policy.horizons(settings, now)
    return [KindRetention(m.kind, days[m.kind], horizons[m.kind], m) for m in marks.read(session)]


def storage(
    session: Session, settings: Settings, actor: Actor, now: datetime | None = None
) -> Storage:
    """Rows (and bytes) per table, and every kind's retention."""
    _require_operator(actor)
    return Storage(stats.tables(session), kinds(session, settings, now))
