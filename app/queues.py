"""Names of the RQ queues and jobs, and how work is put on them: ids only, after commit,
pipelined.

Redis carries work, never truth: a job that is lost here is found again by the sweeper,
and a job that runs twice is stopped by the guard at the top of every job.

A queued job names its function by a stable name from `JOBS` (`kurir.deliver_batch`), not
by the function's import path, so moving a function between modules never strands the jobs
already in Redis. `kurir worker` resolves the name through the table (`job_function`, used
by its consumers and by `KurirJob` for RQ's own worker); jobs queued under the import paths
of earlier releases (`LEGACY_NAMES`) still run.
"""

from __future__ import annotations

import logging
import pickle
import threading
import uuid
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import hiredis
import redis
from redis.typing import EncodableT, FieldT
from rq import Queue
from rq.job import Job
from rq.utils import import_attribute
from sqlalchemy.orm import Session

from app import telemetry
from app.db import after_commit

log = logging.getLogger(__name__)

DELIVERIES = "kurir-deliveries"
INBOUND = "kurir-inbound"
DEFAULT = "kurir-default"
ALL_QUEUES = (DELIVERIES, INBOUND, DEFAULT)

# The stable names of Kurir's jobs, and where each function lives now. Core cannot import the
# pipelines, so the table holds import paths, resolved when a worker runs the job.
DELIVER_BATCH = "kurir.deliver_batch"
INBOUND_PROCESS = "kurir.inbound.process"
INBOUND_RECONCILE = "kurir.inbound.reconcile"
DLQ_BULK_RESEND = "kurir.dlq.bulk_resend"
ENDPOINT_PROBE = "kurir.endpoint.probe"
SEND_CHALLENGE = "kurir.endpoint.send_challenge"
OPERATIONAL_PUBLISH = "kurir.operational.publish"
JOBS: dict[str, str] = {
    DELIVER_BATCH: "sender.jobs.deliver_batch",
    INBOUND_PROCESS: "app.inbound.process.process_event",
    INBOUND_RECONCILE: "app.inbound.reconcile.run_request",
    DLQ_BULK_RESEND: "dlq.resend.run_bulk_job",
    ENDPOINT_PROBE: "app.recovery.jobs.run_probe_job",
    SEND_CHALLENGE: "sender.verification.send_challenge_job",
    OPERATIONAL_PUBLISH: "app.intake.operational.run_job",
}
# What jobs were named by before the stable names: the import paths of that time. Jobs
# queued then (a worker upgraded while Redis held work) are run under their stable name.
LEGACY_NAMES: dict[str, str] = {
    "sender.jobs.deliver_batch": DELIVER_BATCH,
    "app.inbound.process.process_event": INBOUND_PROCESS,
    "app.inbound.reconcile.run_request": INBOUND_RECONCILE,
    "dlq.resend.run_bulk_job": DLQ_BULK_RESEND,
}
# Jobs that had their stable name from the start: no job was ever queued under their path.
BORN_STABLE: frozenset[str] = frozenset({OPERATIONAL_PUBLISH, ENDPOINT_PROBE, SEND_CHALLENGE})

# Jobs record only ids; results are not needed, failures mean a bug and are kept a week.
RESULT_TTL_S = 60
FAILURE_TTL_S = 7 * 86400
JOB_TIMEOUT_S = 300


def job_name(func_name: str) -> str:
    """The stable name of a queued job's function (an old import path maps to its name)."""
    return LEGACY_NAMES.get(func_name, func_name)


def job_function(func_name: str) -> Callable[..., Any]:
    """The function a queued job names: through `JOBS`, else imported as RQ would."""
    name = job_name(func_name)
    return import_attribute(JOBS.get(name, name))


class KurirJob(Job):
    """An RQ job whose function is found by its stable name (RQ itself would import it)."""

    @property
    def func(self) -> Callable[..., Any] | None:
        func_name = self.func_name
        if func_name is None or self.instance:
            return super().func
        return job_function(func_name)


@dataclass(frozen=True)
class JobSpec:
    """One job to enqueue: a job name from `JOBS` (or a dotted function path), primitive
    args and a deterministic id."""

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
        "origin": spec.queue,
        "description": spec.func,
        "status": "queued",
        "created_at": enqueued_at,
        "enqueued_at": enqueued_at,
        "timeout": spec.timeout_s,
        "result_ttl": RESULT_TTL_S,
        "failure_ttl": FAILURE_TTL_S,
    }


def enqueue_many(connection: redis.Redis, specs: Iterable[JobSpec]) -> int:
    """Enqueue every spec in one Redis round trip; returns how many were sent.

    The jobs are ordinary RQ jobs (any RQ worker with `KurirJob` runs them), written
    directly: RQ's own enqueue saves ~25 fields per job inside MULTI/EXEC and costs the
    publish path ~0.25 ms of CPU per job; a redis-py pipeline of the same commands ~0.12 ms
    (it encodes each of the ~28 arguments in Python); packed here by hiredis in one call,
    less than half that. No transaction is needed: each hash is written before its id is
    pushed, and a half-sent batch leaves at most a job the sweeper re-enqueues anyway. A
    job id that is reused (a deterministic one) starts from a clean hash.
    """
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    commands: list[tuple[Any, ...]] = []
    queues: set[str] = set()
    sent = 0
    for spec in specs:
        job_id = spec.job_id or str(uuid.uuid4())  # what RQ itself would pick
        key = Job.key_for(job_id)
        fields = job_fields(spec, stamp)
        commands.append(("DEL", key))
        commands.append(("HSET", key, *[item for pair in fields.items() for item in pair]))
        queue_key = Queue.redis_queue_namespace_prefix + spec.queue
        commands.append(("RPUSH", queue_key, job_id))
        queues.add(queue_key)
        sent += 1
    if not queues:
        return 0
    commands.append(("SADD", Queue.redis_queues_keys, *sorted(queues)))
    send_pipelined(connection, commands)
    return sent


def send_pipelined(client: redis.Redis, commands: list[tuple[Any, ...]]) -> None:
    """`exchange` for commands whose replies are not needed: the first error reply is raised
    once every reply has been read.

    Raises:
        redis.RedisError: a connection that stayed down, or an error reply.
    """
    for reply in exchange(client, commands):
        if isinstance(reply, redis.ResponseError):
            raise reply


def exchange(
    client: redis.Redis, commands: list[tuple[Any, ...]], held: Any | None = None
) -> list[Any]:
    """Send `commands` in one write and read every reply, as a redis-py pipeline without a
    transaction would, minus its per-argument encoding and per-call bookkeeping (at a
    trickle, a delivery's pop is one such exchange): the connection's retry policy covers a
    dropped connection (a Redis restart, a Sentinel failover). An error reply comes back in
    its place as `redis.ResponseError`, as with `execute(raise_on_error=False)`.

    `held`: a connection of `client`'s pool that the caller keeps checked out (one reader
    that exchanges again and again), used instead of a checkout per call; a failure
    disconnects it, and its next use connects again.

    Raises:
        redis.RedisError: a connection that stayed down.
    """
    packed = b"".join(hiredis.pack_command(command) for command in commands)
    pool = client.connection_pool
    conn = held if held is not None else pool.get_connection()

    def send() -> list[Any]:
        conn.send_packed_command([packed])
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except redis.ResponseError as exc:
                replies.append(exc)
        return replies

    try:
        return conn.retry.call_with_retry(send, lambda _error: conn.disconnect())
    except BaseException:
        conn.disconnect()  # replies may be left unread: never reuse it
        raise
    finally:
        if held is None:
            pool.release(conn)


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


def enqueue_after_commit(
    session: Session, connection: redis.Redis, specs: Iterable[JobSpec]
) -> None:
    """Enqueue once the session's transaction has committed, never if it rolls back: a
    worker must find the rows its job names. Redis being down then is survivable (see
    `try_enqueue_many`)."""
    pending = list(specs)
    if pending:
        after_commit(session, lambda: _enqueue_traced(connection, pending))


def _enqueue_traced(connection: redis.Redis, specs: list[JobSpec]) -> bool:
    """With tracing on, the `kurir.enqueue` span (a child of whatever committed the work)."""
    deliveries = sum(len(spec.args[0]) for spec in specs if spec.func == DELIVER_BATCH)
    attributes: dict[str, Any] = {"kurir.jobs": len(specs)}
    if deliveries:
        attributes["kurir.deliveries"] = deliveries
    with telemetry.span("kurir.enqueue", kind=telemetry.PRODUCER, attributes=attributes) as span:
        sent = try_enqueue_many(connection, specs)
        if not sent:
            telemetry.failed(span, "redis unavailable: left to the sweeper")
        return sent


def pop_job_ids(connection: redis.Redis, queue_key: str, count: int, block_s: float) -> list[str]:
    """Up to ``count`` job ids off an RQ queue in one round trip (LPOP with a count), or,
    when it is empty, wait up to ``block_s`` for the next; distinct, in queue order.

    A popped job is the caller's: if it dies before the work is recorded, the database
    still says the work is undone and the sweeper enqueues it again.
    """
    raw = connection.lpop(queue_key, count)
    if not raw:
        popped = connection.blpop([queue_key], timeout=block_s)
        if not popped:
            return []
        raw = (
            [popped[1], *(connection.lpop(queue_key, count - 1) or [])]
            if count > 1
            else [popped[1]]
        )
    return list(dict.fromkeys(r.decode() if isinstance(r, bytes) else str(r) for r in raw))


class BatchConsumer:
    """The loop of a reader that pops many jobs per round trip (deliveries, inbound events).

    It runs `step()` until `stop` is set. Losing Redis is expected (a restart, a failover):
    the loop waits, doubling up to `BACKOFF_MAX_S`, and goes on. Any other failure is logged
    and the loop goes on too: what a failed step had popped is still undone in the
    database, and the sweeper enqueues it again.
    """

    BACKOFF_MAX_S = 5.0
    name = "batch consumer"

    stop: threading.Event

    def step(self) -> int:
        """Pop and handle one batch; returns how many jobs it took."""
        raise NotImplementedError

    def run(self) -> None:
        backoff = 0.5
        while not self.stop.is_set():
            try:
                self.step()
                backoff = 0.5
            except (redis.RedisError, OSError) as exc:
                log.warning("%s lost Redis, retrying in %.1fs: %s", self.name, backoff, exc)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, self.BACKOFF_MAX_S)
            except Exception:
                log.exception("%s failed; the sweeper covers what it popped", self.name)
                self.stop.wait(backoff)


Call = tuple[str, tuple[Any, ...], dict[str, Any]]
"""A job's function (its stable name, see `JOBS`), positional and keyword arguments."""


def take_calls(connection: redis.Redis, job_ids: list[str]) -> list[Call]:
    """Read the calls of popped jobs and delete the jobs, in one round trip.

    The call is RQ's own serialisation (see :func:`job_fields`); a job whose hash is gone
    (a duplicate entry of one that already ran) is skipped. Deleting at once is safe: the
    database, not the job, says whether the work is done.
    """
    pipe = connection.pipeline(transaction=False)
    for job_id in job_ids:
        key = Job.key_for(job_id)
        pipe.hget(key, "data")
        pipe.delete(key)
    replies = pipe.execute()
    return [call for call in map(unpack_call, replies[::2]) if call is not None]


def unpack_call(data: bytes | None) -> Call | None:
    """The call a job's `data` field holds; None for a job that is gone or unreadable."""
    if not data:
        return None
    try:
        func, _instance, args, kwargs = pickle.loads(zlib.decompress(data))  # noqa: S301
    except Exception:  # a job written by something else: RQ would fail it too
        log.exception("unreadable job on a Kurir queue; dropped")
        return None
    return (str(func), tuple(args), dict(kwargs or {}))
