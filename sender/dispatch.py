"""Putting deliveries on the queue: ids only, in batch jobs with deterministic ids.

Inside a transaction, hand `job_specs(ids)` to `app.queues.enqueue_after_commit`, so that no
worker looks for a delivery before it is committed.

A lost enqueue is never fatal: the sweeper finds every due delivery in the database. A double
enqueue is never harmful: the job's guard re-reads the delivery and skips what is not due.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import redis

from app import telemetry
from app.queues import DELIVER_BATCH, DELIVERIES, JobSpec, try_enqueue_many

BATCH_SIZE = 50
# A job of at most this many deliveries (a trickle's job: an event and its fan-out) names
# them in its id.
INLINE_IDS_MAX = 10
# Between the tag and the ids: RQ allows only letters, digits, "_" and "-" in a job id, and
# neither a tag nor a delivery id holds a "-".
_INLINE = "--"


def _job_id(ids: Sequence[str], tag: str) -> str:
    """Deterministic: the same batch is the same job. A small batch's id is its deliveries
    (`deliver-p--dlv_…-dlv_…`), which the worker reads without reading the job
    (`inline_ids`); a larger one's is a digest of them."""
    if len(ids) <= INLINE_IDS_MAX:
        return f"deliver-{tag}{_INLINE}{'-'.join(ids)}"
    digest = hashlib.sha1("|".join(ids).encode(), usedforsecurity=False).hexdigest()[:20]
    return f"deliver-{tag}-{digest}"


def inline_ids(job_id: str) -> list[str] | None:
    """The delivery ids a job's id names (see `_job_id`), or None when it names none."""
    head, sep, ids = job_id.partition(_INLINE)
    if not sep or not head.startswith("deliver-"):
        return None
    named = ids.split("-")
    return named if all(named) else None


def job_specs(delivery_ids: Sequence[str], tag: str = "p") -> list[JobSpec]:
    """Chunk ids into batch jobs with deterministic ids, so re-enqueueing a batch is a no-op."""
    ids = list(dict.fromkeys(delivery_ids))
    chunks = [ids[i : i + BATCH_SIZE] for i in range(0, len(ids), BATCH_SIZE)]
    return [
        JobSpec(DELIVERIES, DELIVER_BATCH, (chunk,), job_id=_job_id(chunk, tag)) for chunk in chunks
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
