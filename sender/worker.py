"""`kurir worker`: RQ's in-process worker in front of this process's delivery engine.

No fork per job (RQ's `SimpleWorker`): a delivery job only hands ids to the engine
(`sender.jobs`), whose lanes send with one pooled HTTP connection set per endpoint origin, so a
worker process costs one RQ dequeue per batch of deliveries, not per delivery. Start as many
processes as you like; they share nothing but PostgreSQL/SQLite and Redis.

A Redis outage does not end the worker: RQ retries its dequeue, and when RQ gives up the loop
here starts it again. Stopping (SIGTERM/SIGINT) finishes the current sends, hands back what
was not started and flushes every attempt record before the process exits.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
from rq import Queue, SimpleWorker
from rq.timeouts import TimerDeathPenalty

from app import runtime as runtime_mod
from app.queues import ALL_QUEUES
from app.runtime import Runtime
from sender.jobs import engine_for, shutdown_engine

log = logging.getLogger(__name__)

# RQ's blocking dequeue waits worker_ttl - 15 s; the socket timeout must be longer than that.
WORKER_TTL_S = 60
SOCKET_TIMEOUT_S = 75.0
RESTART_BACKOFF_MAX_S = 5.0
THREAD_POLL_S = 0.05


class KurirWorker(SimpleWorker):
    """SimpleWorker that also runs in a non-main thread (tests, embedded use).

    Signal handlers can only be installed from the main thread, and job timeouts there use a
    timer instead of SIGALRM.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        if threading.current_thread() is not threading.main_thread():
            self.death_penalty_class = TimerDeathPenalty

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            super()._install_signal_handlers()


def worker_connection(runtime: Runtime) -> redis.Redis:
    """A Redis client for blocking dequeues (the runtime's has a short socket timeout)."""
    url = runtime.settings.resolved_redis_url
    # Unix-socket connections (the embedded Redis of `kurir up`) take no TCP keepalive option.
    tcp = {} if url.startswith("unix://") else {"socket_keepalive": True}
    return redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=5.0,
                                health_check_interval=30, **tcp)


def run_worker(runtime: Runtime, *, burst: bool = False,
               queues: tuple[str, ...] = ALL_QUEUES,
               stop: threading.Event | None = None) -> bool:
    """Work the queues until stopped (or until empty with `burst`); True if any job ran.

    With `stop` (an Event), the worker polls in short bursts so that setting it ends the
    loop within a fraction of a second; used when the worker runs in a thread.
    """
    runtime_mod.install(runtime)
    engine = engine_for(runtime)
    connection = worker_connection(runtime)
    worked = False
    backoff = 0.5
    try:
        while True:
            worker = KurirWorker([Queue(name, connection=connection) for name in queues],
                                 connection=connection, worker_ttl=WORKER_TTL_S)
            polling = stop is not None
            try:
                worked |= bool(worker.work(burst=burst or polling, with_scheduler=False,
                                           logging_level="WARNING"))
            except (redis.RedisError, OSError) as exc:
                log.warning("worker lost Redis, restarting: %s", exc)
            if burst or worker._stop_requested or (stop is not None and stop.is_set()):
                break
            if polling:
                if stop is not None and stop.wait(THREAD_POLL_S):
                    break
                continue
            # work() returned without being asked to stop: Redis trouble. Start it again.
            time.sleep(backoff)
            backoff = min(backoff * 2, RESTART_BACKOFF_MAX_S)
        if burst:
            engine.wait_idle(timeout_s=120)
    finally:
        shutdown_engine()
        connection.close()
    return worked
