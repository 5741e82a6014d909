"""`/metrics` in the Prometheus text format, read from the stores at scrape time.

The database is the truth, so the figures come from it: deliveries by state, attempts by
outcome and a latency histogram built from `attempts.duration_ms` in one pass, dead letters
and inbound events by state. Queue depth and the age of the oldest waiting job come from RQ.
A store that does not answer is reported as `kurir_<store>_up 0`, never as a failed scrape.
Counts shrink when retention purges old rows; they are exposed as gauges for that reason.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass
from typing import Any

import redis
from flask import Blueprint, Response, request
from rq import Queue
from rq.job import Job
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from app.clock import utcnow
from app.errors import Unauthorized
from app.models import (
    DELIVERY_STATES,
    DL_STATES,
    INBOUND_STATUSES,
    Attempt,
    DeadLetter,
    Delivery,
    Endpoint,
    InboundEvent,
)
from app.queues import ALL_QUEUES
from app.services import feed
from app.web.context import runtime

log = logging.getLogger(__name__)

blueprint = Blueprint("metrics", __name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
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
            job = Job.fetch(job_id, connection=connection) if connection.exists(
                f"rq:job:{job_id}") else None
            if job is not None and job.enqueued_at is not None:
                age = max(0.0, (now - job.enqueued_at).total_seconds())
                break
        stats.append(QueueStat(name, depth, age))
    return stats


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float, **labels: str) -> None:
        label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        number = repr(float(value)) if isinstance(value, float) else str(int(value))
        self.lines.append(f"{name}{{{label_text}}} {number}" if label_text
                          else f"{name} {number}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _by(session: Session, column: Any, model: Any) -> dict[str, int]:
    rows = session.execute(select(column, func.count()).select_from(model).group_by(column))
    return {str(key): int(n) for key, n in rows}


def _database_metrics(out: _Writer, session: Session) -> None:
    deliveries = _by(session, Delivery.state, Delivery)
    out.family("kurir_deliveries", "gauge", "Deliveries in the database, by state.")
    for state in sorted(set(DELIVERY_STATES) | set(deliveries)):
        out.sample("kurir_deliveries", deliveries.get(state, 0), state=state)

    ok = Attempt.response_status.between(200, 299)
    columns = [
        func.count(),
        func.coalesce(func.sum(Attempt.duration_ms), 0),
        func.coalesce(func.sum(case((ok, 1), else_=0)), 0),
        func.coalesce(func.sum(case((Attempt.response_status.is_(None), 1), else_=0)), 0),
    ] + [func.coalesce(func.sum(case((Attempt.duration_ms <= bound * 1000, 1), else_=0)), 0)
         for bound in LATENCY_BUCKETS_S]
    row = session.execute(select(*columns).select_from(Attempt)).one()
    total, sum_ms, success, network = (int(v) for v in row[:4])
    buckets = [int(v) for v in row[4:]]
    out.family("kurir_attempts", "gauge",
               "Delivery attempts recorded, by outcome (success = 2xx answer, http_error = "
               "any other answer, network_error = no answer: timeout, refused, blocked).")
    out.sample("kurir_attempts", success, outcome="success")
    out.sample("kurir_attempts", total - success - network, outcome="http_error")
    out.sample("kurir_attempts", network, outcome="network_error")
    out.family("kurir_attempt_duration_seconds", "histogram",
               "Duration of delivery attempts, from sending to the end of the response.")
    for bound, n in zip(LATENCY_BUCKETS_S, buckets, strict=True):
        out.sample("kurir_attempt_duration_seconds_bucket", n, le=repr(bound))
    out.sample("kurir_attempt_duration_seconds_bucket", total, le="+Inf")
    out.sample("kurir_attempt_duration_seconds_sum", sum_ms / 1000.0)
    out.sample("kurir_attempt_duration_seconds_count", total)

    letters = _by(session, DeadLetter.state, DeadLetter)
    out.family("kurir_dead_letters", "gauge", "Dead letters, by state (open = needs an operator).")
    for state in DL_STATES:
        out.sample("kurir_dead_letters", letters.get(state, 0), state=state)

    endpoints = dict(session.execute(
        select(Endpoint.state, func.count()).where(Endpoint.deleted_at.is_(None))
        .group_by(Endpoint.state)).all())
    out.family("kurir_endpoints", "gauge", "Endpoints, by state.")
    for state in sorted({"enabled", "disabled"} | set(endpoints)):
        out.sample("kurir_endpoints", int(endpoints.get(state, 0)), state=state)

    _feed_metrics(out, session)

    inbound = _by(session, InboundEvent.status, InboundEvent)
    out.family("kurir_inbound_events", "gauge", "Received partner callbacks, by status.")
    for status in sorted(set(INBOUND_STATUSES) | set(inbound)):
        out.sample("kurir_inbound_events", inbound.get(status, 0), status=status)


def _feed_metrics(out: _Writer, session: Session) -> None:
    """Per pull endpoint: what its consumer has not acknowledged, and how old the oldest is."""
    now = utcnow()
    lags = feed.pull_lags(session, runtime().settings, now)
    out.family("kurir_pull_endpoint_lag_events", "gauge",
               "Events a pull endpoint's consumer has not acknowledged yet.")
    for endpoint, uid, lag in lags:
        out.sample("kurir_pull_endpoint_lag_events", lag.events, endpoint=endpoint.id,
                   partner=uid)
    out.family("kurir_pull_endpoint_lag_seconds", "gauge",
               "Age of the oldest event a pull endpoint's consumer has not acknowledged "
               "(0 when none).")
    for endpoint, uid, lag in lags:
        age = 0.0 if lag.oldest_at is None else max(0.0, (now - lag.oldest_at).total_seconds())
        out.sample("kurir_pull_endpoint_lag_seconds", float(age), endpoint=endpoint.id,
                   partner=uid)


def render() -> str:
    rt = runtime()
    out = _Writer()
    database_up = 1
    try:
        with rt.db.begin() as session:
            _database_metrics(out, session)
    except Exception:
        log.warning("metrics: database query failed", exc_info=True)
        database_up = 0
    out.family("kurir_database_up", "gauge", "1 if the database answered this scrape.")
    out.sample("kurir_database_up", database_up)
    redis_up = 1
    try:
        stats = queue_stats(rt.redis)
    except (redis.RedisError, OSError):
        log.warning("metrics: redis unavailable", exc_info=True)
        stats, redis_up = [], 0
    if stats:
        out.family("kurir_queue_depth", "gauge", "Jobs waiting in each RQ queue.")
        for stat in stats:
            out.sample("kurir_queue_depth", stat.depth, queue=stat.name)
        out.family("kurir_queue_oldest_job_age_seconds", "gauge",
                   "Age of the oldest job waiting in each queue (0 when empty).")
        for stat in stats:
            out.sample("kurir_queue_oldest_job_age_seconds", float(stat.oldest_age_s or 0.0),
                       queue=stat.name)
    out.family("kurir_redis_up", "gauge", "1 if Redis answered this scrape.")
    out.sample("kurir_redis_up", redis_up)
    return out.text()


@blueprint.get("/metrics")
def metrics() -> Response:
    _require_scrape_token(runtime().settings.metrics_token)
    return Response(render(), content_type=CONTENT_TYPE)


def _require_scrape_token(token: str | None) -> None:
    """With KURIR_METRICS_TOKEN set, a scrape must bear it (Prometheus `authorization`):
    the figures name partners' queues and volumes, and each scrape costs database work.
    """
    if token is None:
        return
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                             token.encode()):
        raise Unauthorized("/metrics needs Authorization: Bearer <KURIR_METRICS_TOKEN>")
