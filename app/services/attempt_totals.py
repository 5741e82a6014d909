"""Every attempt counted once and kept: the totals `/metrics` shows by outcome and latency.

Counting the attempts at each scrape read the whole `attempts` table (5.5-6.6 s at 5 million
rows; minutes over a month of 10 million deliveries a day), and the counts fell each time
retention purged, so a rate over them was wrong. Attempts are only ever added (an id is its
creation time, and the overwrite of a `worker_lost` record keeps the row's id), so the
scheduler folds them into one row of `metric_rollups` in id order (`fold`), and a scrape reads
that row and counts only the attempts after it (`read`): a few minutes of them.

A fold stops `SETTLE` short of now. The process recording an attempt makes its id just before
its commit, so a fold reaching now could pass an id whose row is not committed yet, and that
row would never be counted; younger rows are counted at each scrape instead. So an attempt is
missed only if its transaction stayed open longer than `SETTLE` after its id was made, or its
host's clock ran that far behind. A `worker_lost` record that its worker replaces after it was
folded stays counted as first recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import case, func, select, update
from sqlalchemy.orm import Session

from app.clock import utcnow
from app.ids import id_floor, moment_of
from app.models import Attempt, MetricRollup
from sender.engine.sql import insert_for

if TYPE_CHECKING:
    from app.runtime import Runtime

# Upper bounds (seconds) of the attempt-duration histogram's buckets.
LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0)
SOURCE = "attempts"
# How far behind now a fold stops (see the module's docstring).
SETTLE = timedelta(minutes=10)
# The most of the history one transaction folds: a first fold over months goes a day at a
# time, each in its own transaction, so none is held open for the whole history.
FOLD_STEP = timedelta(days=1)


@dataclass(frozen=True)
class Attempts:
    """Attempts by outcome, and how many ended within each latency bucket."""

    total: int = 0
    duration_ms: int = 0  # summed
    success: int = 0  # a 2xx answer
    network_error: int = 0  # no answer at all: timeout, refused, blocked
    # per bound of LATENCY_BUCKETS_S: attempts that took no longer
    within: tuple[int, ...] = field(default=(0,) * len(LATENCY_BUCKETS_S))

    @property
    def http_error(self) -> int:
        """Any answer but a 2xx."""
        return self.total - self.success - self.network_error

    def __add__(self, other: Attempts) -> Attempts:
        return Attempts(
            self.total + other.total,
            self.duration_ms + other.duration_ms,
            self.success + other.success,
            self.network_error + other.network_error,
            tuple(a + b for a, b in zip(self.within, other.within, strict=True)),
        )

    def stored(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "duration_ms": self.duration_ms,
            "success": self.success,
            "network_error": self.network_error,
            "within": {
                repr(bound): n for bound, n in zip(LATENCY_BUCKETS_S, self.within, strict=True)
            },
        }

    @classmethod
    def from_stored(cls, counts: dict[str, Any]) -> Attempts:
        """The stored figures (a bucket bound added since they were folded starts at 0)."""
        within = counts.get("within") or {}
        return cls(
            int(counts.get("total", 0)),
            int(counts.get("duration_ms", 0)),
            int(counts.get("success", 0)),
            int(counts.get("network_error", 0)),
            tuple(int(within.get(repr(bound), 0)) for bound in LATENCY_BUCKETS_S),
        )


def count(session: Session, after: str | None = None, through: str | None = None) -> Attempts:
    """The attempts with an id in (`after`, `through`] (an open end: no bound), one pass."""
    ok = Attempt.response_status.between(200, 299)
    columns = [
        func.count(),
        func.coalesce(func.sum(Attempt.duration_ms), 0),
        func.coalesce(func.sum(case((ok, 1), else_=0)), 0),
        func.coalesce(func.sum(case((Attempt.response_status.is_(None), 1), else_=0)), 0),
    ] + [
        func.coalesce(func.sum(case((Attempt.duration_ms <= bound * 1000, 1), else_=0)), 0)
        for bound in LATENCY_BUCKETS_S
    ]
    query = select(*columns).select_from(Attempt)
    if after is not None:
        query = query.where(Attempt.id > after)
    if through is not None:
        query = query.where(Attempt.id <= through)
    row = session.execute(query).one()
    total, sum_ms, success, network = (int(v) for v in row[:4])
    return Attempts(total, sum_ms, success, network, tuple(int(v) for v in row[4:]))


def read(session: Session) -> Attempts:
    """Every attempt recorded: the folded totals plus the attempts after them."""
    rollup = session.get(MetricRollup, SOURCE)
    if rollup is None:
        return count(session)
    return Attempts.from_stored(rollup.counts) + count(session, after=rollup.through_id)


def _step_end(session: Session, after: str | None, settled: str) -> str | None:
    """Where the next fold step ends: a day past where the last one ended (or past the oldest
    attempt), and never past `settled`; None when there is no attempt at all yet."""
    start = after if after is not None else session.scalar(select(func.min(Attempt.id)))
    if start is None:
        return None
    moment = moment_of(start)
    if moment is None:  # not one of our ids: fold the rest in one step
        return settled
    return min(id_floor("att", moment + FOLD_STEP), settled)


def _store(
    session: Session, after: str | None, end: str, counts: dict[str, Any], now: datetime
) -> bool:
    """Move the totals from `after` to `end`, only if no other fold moved them meanwhile
    (compare and set: nothing is locked while the step is counted); whether it did."""
    if after is None:
        statement = (
            insert_for(session)(MetricRollup)
            .values(source=SOURCE, through_id=end, counts=counts, updated_at=now)
            .on_conflict_do_nothing(index_elements=["source"])
        )
    else:
        statement = (
            update(MetricRollup)
            .where(MetricRollup.source == SOURCE, MetricRollup.through_id == after)
            .values(through_id=end, counts=counts, updated_at=now)
        )
    return session.execute(statement.returning(MetricRollup.source)).first() is not None


def fold(runtime: Runtime, now: datetime | None = None) -> int:
    """Fold the attempts made up to `SETTLE` before now into the totals, at most a day of
    them per step; how many were folded.

    A step counts in a read-only transaction and then writes one row, so it never holds
    SQLite's only writer (or the row, on PostgreSQL) while it reads a day of attempts.
    """
    now = now or utcnow()
    settled = id_floor("att", now - SETTLE)
    folded = 0
    while True:
        with runtime.db.begin() as session:
            rollup = session.get(MetricRollup, SOURCE)
            after = rollup.through_id if rollup is not None else None
            if after is not None and after >= settled:
                return folded
            end = _step_end(session, after, settled)
            if end is None:
                return folded
            step = count(session, after=after, through=end)
            counts = (Attempts.from_stored(rollup.counts if rollup else {}) + step).stored()
        with runtime.db.begin() as session:
            if _store(session, after, end, counts, now):
                folded += step.total
            # else another fold moved the totals meanwhile: go on from where it left them
