"""The inbound queue's reader in `kurir worker`: many jobs per Redis round trip, one batch.

Each callback is enqueued as its own RQ job (``process_event(id)``), so any RQ worker can run
it. RQ's own worker spends ~50 Redis commands and ~3 ms of CPU on the bookkeeping of each job,
more than the processing itself; this loop pops up to ``batch_jobs`` ids at once, reads their
calls and deletes them in one pipeline, and processes every event among them as one batch
(:func:`app.inbound.batch.process_batch`). When fewer than a batch are waiting, it lingers
20 ms for more: a little latency for much less CPU per event at moderate rates. Other jobs
on the queue (reconciliation pulls) run one by one, as RQ would run them.

A job popped by a worker that then dies is not lost: its event is still ``received`` (or
``processing`` with a lease) in the database, and the inbound sweeper enqueues it again.
"""

from __future__ import annotations

import logging
import threading

import redis
from rq import Queue
from rq.utils import import_attribute

from app.inbound.batch import process_batch
from app.inbound.process import PROCESS_JOB
from app.queues import INBOUND, BatchConsumer, pop_job_ids, take_calls
from app.runtime import Runtime

log = logging.getLogger(__name__)

BATCH_JOBS = 100
LINGER_S = 0.02


class InboundConsumer(BatchConsumer):
    """Pops inbound jobs in batches and processes their events together."""

    name = "inbound consumer"

    def __init__(
        self,
        runtime: Runtime,
        connection: redis.Redis,
        stop: threading.Event,
        *,
        queue: str = INBOUND,
        batch_jobs: int = BATCH_JOBS,
        block_s: float = 1.0,
        linger_s: float = LINGER_S,
    ) -> None:
        self.runtime = runtime
        self.connection = connection
        self.stop = stop
        self.key = Queue(queue, connection=connection).key
        self.batch_jobs = batch_jobs
        self.block_s = block_s
        self.linger_s = linger_s
        self.jobs = 0
        self.events = 0

    def step(self) -> int:
        """Pop, read and process one batch of jobs; returns how many jobs it took."""
        job_ids = pop_job_ids(self.connection, self.key, self.batch_jobs, self.block_s)
        if not job_ids:
            return 0
        if len(job_ids) < self.batch_jobs and self.linger_s > 0:
            # A trickle: wait a moment for more, or every event would pay a batch's fixed
            # cost (two transactions, ~2 ms of CPU) alone. Under load batches fill at once.
            self.stop.wait(self.linger_s)
            more = self.connection.lpop(self.key, self.batch_jobs - len(job_ids)) or []
            job_ids = list(
                dict.fromkeys(
                    [*job_ids, *(r.decode() if isinstance(r, bytes) else str(r) for r in more)]
                )
            )
        event_ids: list[str] = []
        others = []
        for func, args, kwargs in take_calls(self.connection, job_ids):
            if func == PROCESS_JOB and len(args) == 1 and not kwargs:
                event_ids.append(str(args[0]))
            else:
                others.append((func, args, kwargs))
        if event_ids:
            process_batch(self.runtime, event_ids)
        for func, args, kwargs in others:
            try:
                import_attribute(func)(*args, **kwargs)
            except Exception:
                # As RQ would fail it; what the job was for is recorded in the database and
                # its periodic pass tries again.
                log.exception("inbound queue job failed", extra={"job_func": func})
        self.jobs += len(job_ids)
        self.events += len(event_ids)
        return len(job_ids)
