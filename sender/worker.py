"""`kurir worker`: an RQ worker that runs jobs in-process (no fork per job)."""

from __future__ import annotations

import logging

from rq import Queue, SimpleWorker

from app import runtime as runtime_mod
from app.queues import ALL_QUEUES
from app.runtime import Runtime

log = logging.getLogger(__name__)


def run_worker(runtime: Runtime, *, burst: bool = False,
               queues: tuple[str, ...] = ALL_QUEUES) -> bool:
    """Work the queues until stopped (or until empty with `burst`); True if any job ran."""
    runtime_mod.install(runtime)
    connection = runtime.redis
    worker = SimpleWorker([Queue(name, connection=connection) for name in queues],
                          connection=connection)
    return bool(worker.work(burst=burst, with_scheduler=False, logging_level="WARNING"))
