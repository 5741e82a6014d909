"""Names of the RQ queues and how work is put on them: ids only, after commit, pipelined.

Redis carries work, never truth: a job that is lost here is found again by the sweeper,
and a job that runs twice is stopped by the guard at the top of every job.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis
from rq import Queue

log = logging.getLogger(__name__)

DELIVERIES = "kurir-deliveries"
INBOUND = "kurir-inbound"
DEFAULT = "kurir-default"
ALL_QUEUES = (DELIVERIES, INBOUND, DEFAULT)

# Jobs record only ids; results are not needed, failures mean a bug and are kept a week.
RESULT_TTL_S = 60
FAILURE_TTL_S = 7 * 86400
JOB_TIMEOUT_S = 300


@dataclass(frozen=True)
class JobSpec:
    """One job to enqueue: a dotted function path, primitive args and a deterministic id."""

    queue: str
    func: str
    args: tuple[Any, ...]
    job_id: str | None = None
    timeout_s: int = JOB_TIMEOUT_S


def enqueue_many(connection: redis.Redis, specs: Iterable[JobSpec]) -> int:
    """Enqueue every spec in one Redis pipeline per queue; returns how many were sent."""
    by_queue: dict[str, list[JobSpec]] = {}
    for spec in specs:
        by_queue.setdefault(spec.queue, []).append(spec)
    sent = 0
    for name, group in by_queue.items():
        queue = Queue(name, connection=connection)
        queue.enqueue_many([
            Queue.prepare_data(
                spec.func, args=spec.args, job_id=spec.job_id, timeout=spec.timeout_s,
                result_ttl=RESULT_TTL_S, failure_ttl=FAILURE_TTL_S,
            )
            for spec in group
        ])
        sent += len(group)
    return sent


def try_enqueue_many(connection: redis.Redis, specs: list[JobSpec]) -> bool:
    """Enqueue, but let a Redis outage pass: the sweeper re-enqueues from the database."""
    if not specs:
        return True
    try:
        enqueue_many(connection, specs)
    except (redis.RedisError, OSError) as exc:
        log.warning("redis unavailable, %d job(s) left to the sweeper: %s", len(specs), exc)
        return False
    return True
