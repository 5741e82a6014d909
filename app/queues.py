"""Names of the RQ queues and how work is put on them: ids only, after commit, pipelined.

Redis carries work, never truth: a job that is lost here is found again by the sweeper,
and a job that runs twice is stopped by the guard at the top of every job.
"""

from __future__ import annotations

import logging
import pickle
import uuid
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
from redis.typing import EncodableT, FieldT
from rq import Queue
from rq.job import Job

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


def job_fields(spec: JobSpec, enqueued_at: str) -> dict[FieldT, EncodableT]:
    """The hash of a queued RQ job: RQ's own serialisation of the call, and the fields its
    workers read; everything else RQ keeps per job is optional and left out.
    """
    call: tuple[Any, ...] = (spec.func, None, spec.args, {})
    return {
        "data": zlib.compress(pickle.dumps(call, protocol=pickle.HIGHEST_PROTOCOL)),
        "origin": spec.queue, "description": spec.func, "status": "queued",
        "created_at": enqueued_at, "enqueued_at": enqueued_at, "timeout": spec.timeout_s,
        "result_ttl": RESULT_TTL_S, "failure_ttl": FAILURE_TTL_S,
    }


def enqueue_many(connection: redis.Redis, specs: Iterable[JobSpec]) -> int:
    """Enqueue every spec in one Redis round trip; returns how many were sent.

    The jobs are ordinary RQ jobs (any RQ worker runs them), written directly: RQ's own
    enqueue saves ~25 fields per job inside MULTI/EXEC and costs the publish path ~0.25 ms of
    CPU per job, this ~0.08 ms. No transaction is needed: each hash is written before its id
    is pushed, and a half-sent pipeline leaves at most a job the sweeper re-enqueues anyway.
    A job id that is reused (a deterministic one) starts from a clean hash.
    """
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    pipe = connection.pipeline(transaction=False)
    queues: set[str] = set()
    sent = 0
    for spec in specs:
        job_id = spec.job_id or str(uuid.uuid4())  # what RQ itself would pick
        key = Job.key_for(job_id)
        pipe.delete(key)
        pipe.hset(key, mapping=job_fields(spec, stamp))
        queue_key = Queue.redis_queue_namespace_prefix + spec.queue
        pipe.rpush(queue_key, job_id)
        queues.add(queue_key)
        sent += 1
    if queues:
        pipe.sadd(Queue.redis_queues_keys, *queues)
        pipe.execute()
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
