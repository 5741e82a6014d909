"""`kurir worker`: RQ's in-process worker in front of this process's delivery engine.

No fork per job, and no RQ bookkeeping per job on the busy queues: the delivery queue is read
by `DeliveryConsumer`, which takes many delivery jobs per Redis round trip and hands their ids
to the engine (`sender.jobs`), whose lanes send with one pooled HTTP connection set per
endpoint origin; the inbound queue by `app.inbound.consumer.InboundConsumer`, which processes
the events of many jobs as one batch. The default queue (rare operator jobs) runs under RQ's
`SimpleWorker`. Start as many processes as you like; they share nothing but
PostgreSQL/SQLite and Redis.

A Redis outage does not end the worker: RQ retries its dequeue, and when RQ gives up the loop
here starts it again. Stopping (SIGTERM/SIGINT) finishes the current sends, hands back what
was not started and flushes every attempt record before the process exits.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from typing import Any

import redis
from rq import Queue, SimpleWorker
from rq.job import Job
from rq.timeouts import TimerDeathPenalty

from app import redis_client
from app import runtime as runtime_mod
from app.inbound.consumer import InboundConsumer
from app.queues import (
    ALL_QUEUES,
    DELIVER_BATCH,
    DELIVERIES,
    INBOUND,
    BatchConsumer,
    KurirJob,
    exchange,
    job_function,
    job_name,
    pop_job_ids,
    take_calls,
)
from app.runtime import Runtime
from sender.dispatch import inline_ids
from sender.jobs import Engine, engine_for, shutdown_engine

log = logging.getLogger(__name__)

# RQ's blocking dequeue waits worker_ttl - 15 s; the socket timeout must be longer than that.
WORKER_TTL_S = 60
SOCKET_TIMEOUT_S = 75.0
RESTART_BACKOFF_MAX_S = 5.0
THREAD_POLL_S = 0.05
LISTENER_WAKE_S = 0.5


class KurirWorker(SimpleWorker):
    """SimpleWorker that finds a job's function by its stable name (`app.queues.JOBS`) and
    also runs in a non-main thread (tests, embedded use).

    Signal handlers can only be installed from the main thread, and job timeouts there use a
    timer instead of SIGALRM.
    """

    job_class = KurirJob

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        if threading.current_thread() is not threading.main_thread():
            self.death_penalty_class = TimerDeathPenalty

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            super()._install_signal_handlers()

    def subscribe(self) -> None:
        """RQ's command listener (`rq` shutdown / kill-horse commands), waking every
        `LISTENER_WAKE_S` instead of RQ 3's 60 s: redis-py 8.2 joins the listener thread when
        it stops, so with RQ's wait every worker stop (and every polling burst of a worker in
        a thread) took up to a minute."""
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]
            sleep_time=LISTENER_WAKE_S,
            daemon=True,
            exception_handler=self._pubsub_exception_handler,
        )


class DeliveryConsumer(BatchConsumer):
    """Takes delivery jobs off RQ's queue many at a time: one Redis round trip per batch.

    RQ's worker spends ~50 Redis commands (and ~3 ms of CPU) on the bookkeeping of each job;
    a delivery job is only a list of ids whose outcome lives in the database, so this loop pops
    up to `batch_jobs` of them at once and hands the union of their ids to the engine. A job
    popped by a worker that then dies is found again by the sweeper, exactly as with RQ's own
    worker.

    At a trickle every batch is one job of one delivery, and what a round trip costs is paid
    per delivery. So the pop is `BLMPOP` (Redis 7: it waits for the queue and takes up to a
    batch at once), and a small job names its deliveries in its id
    (`sender.dispatch.inline_ids`): its hash need not be read, and is deleted in the same
    pipeline as the next pop. One round trip per batch, where a blocking pop and a pipeline to
    read and delete the job were two. Larger jobs' calls are read and deleted in one more
    (`app.queues.take_calls`). Before Redis 7 the pop is LPOP, else BLPOP (`pop_job_ids`).
    """

    name = "delivery consumer"

    def __init__(
        self,
        engine: Engine,
        connection: redis.Redis,
        stop: threading.Event,
        *,
        queue: str = DELIVERIES,
        batch_jobs: int = 20,
        block_s: float = 1.0,
    ) -> None:
        self.engine = engine
        self.connection = connection
        self.stop = stop
        self.key = Queue(queue, connection=connection).key
        self.batch_jobs = batch_jobs
        self.block_s = block_s
        self.jobs = 0
        # Hashes of jobs taken by their id alone, to delete with the next pop.
        self._spent: list[str] = []
        self._blmpop = True
        # The pool's connection the pops go over, kept out of the pool while this consumer
        # runs: a checkout per pop costs a trickle more than the pop's own exchange.
        self._link: Any = None

    def run(self) -> None:
        try:
            super().run()
        finally:
            self.close()

    def close(self) -> None:
        """Delete the hashes of the jobs taken last (a Redis outage leaves them behind:
        harmless, as a job re-enqueued under the same id starts from a clean hash)."""
        if self._spent:
            with contextlib.suppress(redis.RedisError, OSError):
                self.connection.delete(*self._spent)
            self._spent = []
        link, self._link = self._link, None
        if link is not None:
            self.connection.connection_pool.release(link)

    def step(self) -> int:
        """Pop, read and submit one batch of jobs; returns how many jobs it took."""
        job_ids = self._pop()
        if not job_ids:
            self.engine.rest()
            return 0
        delivery_ids: list[str] = []
        others: list[str] = []
        for job_id in job_ids:
            named = inline_ids(job_id)
            if named is None:
                others.append(job_id)
            else:
                delivery_ids.extend(named)
                self._spent.append(Job.key_for(job_id))
        for func, args, kwargs in take_calls(self.connection, others) if others else []:
            if job_name(func) == DELIVER_BATCH:
                delivery_ids.extend(args[0])
            else:
                job_function(func)(*args, **kwargs)
        if delivery_ids:
            self.engine.submit(delivery_ids)
        self.jobs += len(job_ids)
        return len(job_ids)

    def _pop(self) -> list[str]:
        """Up to `batch_jobs` job ids, distinct, waiting up to `block_s` for the first; the
        spent hashes are deleted in the same round trip."""
        if not self._blmpop:
            self.close()
            return pop_job_ids(self.connection, self.key, self.batch_jobs, self.block_s)
        commands: list[tuple[Any, ...]] = []
        if self._spent:
            commands.append(("DEL", *self._spent))
        commands.append(("BLMPOP", self.block_s, 1, self.key, "LEFT", "COUNT", self.batch_jobs))
        if self._link is None:
            self._link = self.connection.connection_pool.get_connection()
        replies = exchange(self.connection, commands, self._link)
        self._spent = []
        popped = replies[-1]
        if isinstance(popped, redis.ResponseError):
            if "unknown command" not in str(popped).lower():
                raise popped
            log.info("Redis before 7.0 (no BLMPOP): delivery jobs are popped in two steps")
            self._blmpop = False
            return self._pop()
        for reply in replies[:-1]:
            if isinstance(reply, Exception):
                raise reply
        if not popped:
            return []
        return list(dict.fromkeys(_text(r) for r in popped[1]))


def _text(raw: object) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def worker_connection(runtime: Runtime) -> redis.Redis:
    """A Redis client for blocking dequeues (the runtime's has a short socket timeout)."""
    return redis_client.connect(
        runtime.settings.resolved_redis_url,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=5.0,
        health_check_interval=30,
        keepalive=True,
        client_name=runtime.name,
    )


def run_worker(
    runtime: Runtime,
    *,
    burst: bool = False,
    queues: tuple[str, ...] = ALL_QUEUES,
    stop: threading.Event | None = None,
) -> bool:
    """Work the queues until stopped (or until empty with `burst`); True if any job ran.

    With `stop` (an Event), the worker polls in short bursts so that setting it ends the
    loop within a fraction of a second; used when the worker runs in a thread.
    """
    runtime_mod.install(runtime)
    engine = engine_for(runtime)
    log.info("worker started", extra={"queues": ",".join(queues), "burst": burst})
    connection = worker_connection(runtime)
    worked = False
    backoff = 0.5
    consumer_stop = threading.Event()
    consumer: DeliveryConsumer | None = None
    consumer_thread: threading.Thread | None = None
    rq_queues = tuple(q for q in queues if q not in (DELIVERIES, INBOUND))
    if DELIVERIES in queues:
        # In a thread (tests, embedded use) it polls briefly so that stopping is quick.
        consumer = DeliveryConsumer(
            engine,
            worker_connection(runtime),
            consumer_stop,
            block_s=0.2 if stop is not None else 1.0,
        )
        if burst:
            while consumer.step():
                worked = True
            consumer.close()
        else:
            consumer_thread = threading.Thread(
                target=consumer.run, name="kurir-consumer", daemon=True
            )
            consumer_thread.start()
    inbound: InboundConsumer | None = None
    inbound_thread: threading.Thread | None = None
    if INBOUND in queues:
        inbound = InboundConsumer(
            runtime,
            worker_connection(runtime),
            consumer_stop,
            block_s=0.2 if stop is not None else 1.0,
        )
        if burst:
            while inbound.step():
                worked = True
        else:
            inbound_thread = threading.Thread(target=inbound.run, name="kurir-inbound", daemon=True)
            inbound_thread.start()
    try:
        while rq_queues:
            worker = KurirWorker(
                [Queue(name, connection=connection) for name in rq_queues],
                connection=connection,
                worker_ttl=WORKER_TTL_S,
            )
            polling = stop is not None
            try:
                worked |= bool(
                    worker.work(
                        burst=burst or polling, with_scheduler=False, logging_level="WARNING"
                    )
                )
            except (redis.RedisError, OSError) as exc:
                log.warning("worker lost Redis, restarting: %s", exc)
            # A SIGTERM/SIGINT while idle makes RQ return from work() without setting
            # _stop_requested; the shutdown date is what both paths record.
            signalled = worker._stop_requested or worker._shutdown_requested_date is not None
            if burst or signalled or (stop is not None and stop.is_set()):
                break
            if polling:
                if stop is not None and stop.wait(THREAD_POLL_S):
                    break
                continue
            # work() returned without being asked to stop: Redis trouble. Start it again.
            time.sleep(backoff)
            backoff = min(backoff * 2, RESTART_BACKOFF_MAX_S)
        if not rq_queues and not burst:
            _wait_for_stop(stop)
        if burst:
            engine.wait_idle(timeout_s=120)
    finally:
        consumer_stop.set()
        if consumer_thread is not None:
            consumer_thread.join(10)
        if inbound_thread is not None:
            inbound_thread.join(10)
        worked |= bool(consumer and consumer.jobs) or bool(inbound and inbound.jobs)
        shutdown_engine()
        if consumer is not None:
            consumer.connection.close()
        if inbound is not None:
            inbound.connection.close()
        connection.close()
    return worked


def _wait_for_stop(stop: threading.Event | None) -> None:
    """Only the delivery consumer runs: wait for the stop event, or SIGTERM/SIGINT."""
    done = stop or threading.Event()
    if stop is None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: done.set())
        signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
