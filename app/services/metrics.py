"""The figures `/metrics` shows, read from the stores at scrape time (read-only).

The database is the truth, so the figures come from it: deliveries by state, attempts by
outcome with a latency histogram built from `attempts.duration_ms` in one pass, dead letters,
endpoints and inbound events by state, pull endpoints' lag, blocked ordering keys, and what
retention purged per kind of history (its persisted marks). Queue
depth and the age of the oldest waiting job come from RQ.

A reading is a fixed number of SQL statements, whatever the number of endpoints, so a scraper
cannot make it dearer by adding endpoints. The figures are shown to whoever may scrape
(`app.web.metrics` decides that and renders them), not to an actor, so nothing here takes one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis
from rq import Queue
from rq.job import Job
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from app.clock import utcnow
from app.config import Settings
from app.lifecycle import marks
from app.models import Attempt, DeadLetter, Delivery, Endpoint, InboundEvent
from app.queues import ALL_QUEUES
from app.services import endpoints, feed
from sender.ordering import BlockedCount

# Upper bounds (seconds) of the attempt-duration histogram's buckets.
LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0)


@dataclass(frozen=True)
class QueueStat:
    name: str
    depth: int
    oldest_age_s: float | None  # None when the queue is empty


def queue_stats(connection: redis.Redis) -> list[QueueStat]:
    """Depth and oldest-job age of every Kurir queue (raises if Redis is unreachable)."""
    now = utcnow()
    stats = []
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
        stats.append(QueueStat(name, depth, age))
    return stats


@dataclass(frozen=True)
class Attempts:
    """Every attempt recorded, by outcome, and how many ended within each latency bucket."""

    total: int
    duration_ms: int  # summed
    success: int  # a 2xx answer
    network_error: int  # no answer at all: timeout, refused, blocked
    within: tuple[int, ...]  # per bound of LATENCY_BUCKETS_S: attempts that took no longer

    @property
    def http_error(self) -> int:
        """Any answer but a 2xx."""
        return self.total - self.success - self.network_error


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


def _by(session: Session, column: Any, model: Any) -> dict[str, int]:
    rows = session.execute(select(column, func.count()).select_from(model).group_by(column))
    return {str(key): int(n) for key, n in rows}


def _attempts(session: Session) -> Attempts:
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
    row = session.execute(select(*columns).select_from(Attempt)).one()
    total, sum_ms, success, network = (int(v) for v in row[:4])
    return Attempts(total, sum_ms, success, network, tuple(int(v) for v in row[4:]))


def database(session: Session, settings: Settings) -> Figures:
    """Every database figure, a fixed number of statements."""
    deliveries = _by(session, Delivery.state, Delivery)
    attempts = _attempts(session)
    letters = _by(session, DeadLetter.state, DeadLetter)
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
    inbound = _by(session, InboundEvent.status, InboundEvent)
    retention = marks.read(session)
    return Figures(now, deliveries, attempts, letters, live, lags, blocked, inbound, retention)
