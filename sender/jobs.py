"""The delivery job, and the one delivery engine each worker process runs.

`deliver_batch(delivery_ids)` is the RQ job; queued jobs name it as
`sender.jobs.deliver_batch`, so it stays here. It sends nothing itself: it hands the ids to
this process's `Engine` (`sender.engine`, whose docstring is the map of its stages) and
returns at once. The names other modules take from here are re-exported for them.
"""

from __future__ import annotations

import threading

from app import runtime as runtime_mod
from app.models import DEAD
from app.runtime import Runtime
from sender.engine import Engine
from sender.engine.errors import (
    ERROR_INTERNAL,
    ERROR_NO_SECRET,
    ERROR_WORKER_LOST,
    REASON_ENDPOINT_DISABLED,
    REASON_RETRIES_EXHAUSTED,
)
from sender.engine.recorder import record_attempts

_engine: Engine | None = None
_engine_lock = threading.Lock()


def engine_for(runtime: Runtime) -> Engine:
    """The process's engine for `runtime`, started on first use."""
    global _engine
    with _engine_lock:
        if _engine is None or _engine.runtime is not runtime or _engine.stopped:
            old = _engine
            _engine = Engine(runtime).start()
            if old is not None and not old.stopped:
                old.stop()
        return _engine


def current_engine() -> Engine | None:
    return _engine


def shutdown_engine(timeout_s: float = 40.0) -> None:
    """Stop the process's engine (worker shutdown, end of a test)."""
    global _engine
    with _engine_lock:
        engine, _engine = _engine, None
    if engine is not None:
        engine.stop(timeout_s)


def deliver_batch(delivery_ids: list[str]) -> int:
    """RQ job: hand a batch of delivery ids to this process's engine; safe to run twice."""
    return engine_for(runtime_mod.current()).submit(delivery_ids)


__all__ = [
    "DEAD",
    "ERROR_INTERNAL",
    "ERROR_NO_SECRET",
    "ERROR_WORKER_LOST",
    "Engine",
    "REASON_ENDPOINT_DISABLED",
    "REASON_RETRIES_EXHAUSTED",
    "current_engine",
    "deliver_batch",
    "engine_for",
    "record_attempts",
    "shutdown_engine",
]
