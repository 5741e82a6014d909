"""The figures `/metrics` shows, read from the stores at scrape time (read-only).

The database is the truth, so the figures come from it: deliveries by state, attempts by
outcome with a latency histogram, dead letters, endpoints and inbound events by state, pull
endpoints' lag, blocked ordering keys, and what retention purged per kind of history (its
persisted marks). Queue depth and the age of the oldest waiting job come from RQ.

A reading is a fixed number of SQL statements, whatever the number of endpoints, so a scraper
cannot make it dearer by adding endpoints; nor does it read the history whole, so a month of
10 million deliveries a day cannot either. Attempts are totals the scheduler keeps
(`attempt_totals`: counters, which retention does not lower) plus the last minutes' attempts;
rows by state are counted through an index where few (work still in flight), and estimated
where the table is large and the state is history. The figures are shown to whoever may
scrape (`app.web.metrics` decides that and renders them), not to an actor, so nothing here
takes one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis
from rq import Queue
from rq.job import Job
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from app.clock import utcnow
from app.config import Settings
from app.lifecycle import marks, policy, stats
from app.models import (
    DELIVERY_STATES,
    DL_STATES,
    INBOUND_STATUSES,
    DeadLetter,
    Delivery,
    Endpoint,
    InboundEvent,
)
from app.queues import ALL_QUEUES
from app.services import attempt_totals, endpoints, feed
from app.services.attempt_totals import LATENCY_BUCKETS_S, Attempts
from app.vocabulary import DeadLetterState
from sender.ordering import BlockedCount

__all__ = [
    "ESTIMATED_FROM",
    "LATENCY_BUCKETS_S",
    "Attempts",
    "Figures",
    "QueueStat",
    "database",
    "queue_stats",
]

# Rows from which a PostgreSQL table's finished states are estimated rather than counted.
ESTIMATED_FROM = stats.EXACT_BELOW


@dataclass(frozen=True)
class _States:
    """A table's state column: every value it takes, and those of rows still being worked
    on (few, found by an index, so always counted)."""

    column: Any
    values: tuple[str, ...]
    live: tuple[str, ...]


_DELIVERY_STATES = _States(
    Delivery.state,
    DELIVERY_STATES,
    tuple(s for s in DELIVERY_STATES if s not in policy.FINISHED_DELIVERY_STATES),
)
_LETTER_STATES = _States(DeadLetter.state, DL_STATES, (DeadLetterState.OPEN.value,))
_INBOUND_STATES = _States(
    InboundEvent.status,
    INBOUND_STATUSES,
    tuple(s for s in INBOUND_STATUSES if s not in policy.FINISHED_INBOUND_STATUSES),
)


@dataclass(frozen=True)
class QueueStat:
    name: str
    depth: int
    oldest_age_s: float | None  # None when the queue is empty


def queue_stats(connection: redis.Redis) -> list[QueueStat]:
    """Depth and oldest-job age of every Kurir queue (raises if Redis is unreachable)."""
    now = utcnow()
    found = []
    for name in ALL_QUEUES:
        queue = Queue(name, connection=connection)
        depth = queue.count
        age = None
        for job_id in queue.get_job_ids(0, 5):  # the head may have expired; look a bit on
            job = (
                Job.fetch(job_id, connection=connection)
                if connection.exists(f"rq:job:{job_id}")
                else None
            )
            if job is not None and job.enqueued_at is not None:
                age = max(0.0, (now - job.enqueued_at).total_seconds())
                break
        found.append(QueueStat(name, depth, age))
    return found


@dataclass(frozen=True)
class Figures:
    """What the database says at one scrape."""

    now: datetime  # when the lags were read
    deliveries: dict[str, int]  # by state
    attempts: Attempts
    dead_letters: dict[str, int]  # by state
    endpoints: dict[str, int]  # live endpoints, by state
    pull: list[feed.PullLag]  # every live pull endpoint's lag (three statements for all)
    blocked: list[BlockedCount]  # endpoints holding ordering keys (one statement)
    inbound: dict[str, int]  # received callbacks, by status
    retention: list[marks.Mark]  # per kind: rows purged, oldest row kept (one statement)


def _by(session: Session, states: _States, totals: dict[str, int] | None) -> dict[str, int]:
    """A table's rows by state. Counted where that is cheap; on PostgreSQL, once the table
    holds `stats.EXACT_BELOW` rows or more, only the live states are counted, and the others
    share the rest of the table's live rows as the statistics divide them: counting them
    would read the whole history at every scrape (the estimate is as recent as the last
    ANALYZE, which autovacuum keeps). `totals`: live rows per table (None on SQLite)."""
    column = states.column
    table, name = column.class_.__tablename__, column.key
    total = None if totals is None else totals.get(table, 0)
    if total is None or total < stats.EXACT_BELOW:
        rows = session.execute(select(column, func.count()).group_by(column))
        return {str(key): int(n) for key, n in rows}
    # The values spelt out, so that a partial index over exactly them answers.
    spelt = ", ".join(f"'{value}'" for value in states.live)
    counted = {
        str(key): int(n)
        for key, n in session.execute(
            text(
                f"SELECT {name}, count(*) FROM {table} "  # noqa: S608 - the model's names
                f"WHERE {name} IN ({spelt}) GROUP BY {name}"
            )
        )
    }
    # The rest, shared as the statistics see it; without any (never analyzed) the first
    # finished value, the history's bulk, is shown holding it all.
    finished = [value for value in states.values if value not in states.live]
    seen = stats.shares(session, table, name)
    weights = {value: seen.get(value, 0.0) for value in finished}
    if not any(weights.values()):
        weights[finished[0]] = 1.0
    rest, whole = max(0, total - sum(counted.values())), sum(weights.values())
    for value, weight in weights.items():
        counted[value] = round(rest * weight / whole)
    return counted


def database(session: Session, settings: Settings) -> Figures:
    """Every database figure, a fixed number of statements."""
    states = (_DELIVERY_STATES, _LETTER_STATES, _INBOUND_STATES)
    totals = stats.live_rows(session, [s.column.class_.__tablename__ for s in states])
    deliveries, letters, inbound = (_by(session, s, totals) for s in states)
    attempts = attempt_totals.read(session)
    live = {
        str(state): int(n)
        for state, n in session.execute(
            select(Endpoint.state, func.count())
            .where(Endpoint.deleted_at.is_(None))
            .group_by(Endpoint.state)
        ).all()
    }
    now = utcnow()
    lags = feed.pull_lags(session, settings, now)
    blocked = endpoints.blocked_key_counts(session)
    retention = marks.read(session)
    return Figures(now, deliveries, attempts, letters, live, lags, blocked, inbound, retention)
