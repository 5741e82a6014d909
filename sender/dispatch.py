"""Putting deliveries on the queue: ids only, only after commit, in one pipeline.

A lost enqueue is never fatal: the sweeper finds every due delivery in the database. A double
enqueue is never harmful: the job's guard re-reads the delivery and skips what is not due.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import redis
from sqlalchemy.orm import Session

from app import telemetry
from app.db import after_commit
from app.queues import DELIVERIES, JobSpec, try_enqueue_many

BATCH_SIZE = 50
DELIVER_JOB = "sender.jobs.deliver_batch"


def _job_id(ids: Sequence[str], tag: str) -> str:
    digest = hashlib.sha1("|".join(ids).encode(), usedforsecurity=False).hexdigest()[:20]
    return f"deliver-{tag}-{digest}"


def job_specs(delivery_ids: Sequence[str], tag: str = "p") -> list[JobSpec]:
    """Chunk ids into batch jobs with deterministic ids, so re-enqueueing a batch is a no-op."""
    ids = list(dict.fromkeys(delivery_ids))
    chunks = [ids[i : i + BATCH_SIZE] for i in range(0, len(ids), BATCH_SIZE)]
    return [
        JobSpec(DELIVERIES, DELIVER_JOB, (chunk,), job_id=_job_id(chunk, tag)) for chunk in chunks
    ]


def enqueue_now(connection: redis.Redis, delivery_ids: Sequence[str], tag: str = "p") -> bool:
    """Enqueue immediately; False when Redis is down (the sweeper will pick them up).

    With tracing on, the `kurir.enqueue` span (a child of the publish, or of whatever enqueues).
    """
    if not delivery_ids:
        return True
    with telemetry.span(
        "kurir.enqueue",
        kind=telemetry.PRODUCER,
        attributes={"kurir.deliveries": len(delivery_ids), "kurir.enqueue.tag": tag},
    ) as span:
        sent = try_enqueue_many(connection, job_specs(delivery_ids, tag))
        if not sent:
            telemetry.failed(span, "redis unavailable: left to the sweeper")
        return sent


def enqueue_after_commit(
    session: Session, connection: redis.Redis, delivery_ids: Sequence[str], tag: str = "p"
) -> None:
    """Enqueue once the transaction that created or re-armed these deliveries has committed."""
    ids = list(delivery_ids)
    if ids:
        after_commit(session, lambda: enqueue_now(connection, ids, tag))
