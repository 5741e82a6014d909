"""What moves between the engine's stages: claimed work, its outcome, and work handed back."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sender.deliver import AttemptResult, Target


@dataclass(frozen=True)
class Unsendable:
    """Why a delivery cannot be sent at all; `error` is the attempt's error class."""

    error: str
    detail: str


@dataclass
class Work:
    """One claimed delivery on its way to a lane thread."""

    delivery_id: str
    event_id: str
    target: Target
    body: bytes
    n: int
    run_n: int
    lease: datetime
    queued_at: float = 0.0
    # An ordered delivery's place in its key (sender.ordering); None when unordered.
    sequence: int | None = None
    previous_event_id: str | None = None
    # The W3C traceparent stored with its event (tracing on): the attempt's span joins it.
    trace_context: str | None = None


@dataclass
class Outcome:
    """One finished attempt, for the recorder."""

    work: Work
    result: AttemptResult
    finished_at: datetime


@dataclass
class Release:
    """A claimed delivery handed back unsent; `hold_until` None clears the lease."""

    work: Work
    hold_until: datetime | None
