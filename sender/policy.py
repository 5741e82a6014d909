"""Retry and outcome rules for deliveries, pure so they are tested on a fake clock."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Literal

from app.config import DEFAULT_RETRY_SCHEDULE

RETRY_AFTER_STATUSES = frozenset({429, 503})
# The longest Retry-After honoured: a partner may ask for a pause, not park a delivery for days.
MAX_RETRY_AFTER_S = 3600.0
GONE_STATUS = 410

_DELTA_SECONDS = re.compile(r"^[+-]?[0-9]+(?:\.[0-9]+)?$")

DecisionKind = Literal["succeeded", "retry", "dead", "disable"]


def _as_utc(moment: datetime) -> datetime:
    """Treat naive datetimes as UTC, since databases such as SQLite hand them back naive."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def is_success(status: int | None) -> bool:
    """Only 2xx counts as delivered; 3xx is a failure because redirects are not followed."""
    return status is not None and 200 <= status <= 299


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Turn a Retry-After header (seconds or HTTP-date) into seconds to wait, or None."""
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if _DELTA_SECONDS.fullmatch(text):
        return max(0.0, float(text))
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:
        return None
    return max(0.0, (_as_utc(when) - _as_utc(now)).total_seconds())


@dataclass(frozen=True)
class RetryPolicy:
    """The retry schedule and jitter, passed in so workers never read settings themselves."""

    schedule: tuple[int, ...] = DEFAULT_RETRY_SCHEDULE
    jitter: float = 0.2

    def __post_init__(self) -> None:
        """Reject nonsense early so a bad configuration cannot cause hot retry loops."""
        if not self.schedule:
            raise ValueError("retry schedule must have at least one step")
        if any(not isinstance(s, int) or isinstance(s, bool) or s <= 0 for s in self.schedule):
            raise ValueError("retry schedule steps must be positive integers")
        if not 0 <= self.jitter < 1:
            raise ValueError("jitter must be in [0, 1)")

    @property
    def max_attempts(self) -> int:
        """The first attempt is immediate, then one per schedule step."""
        return len(self.schedule) + 1

    def next_delay(
        self,
        attempts_made: int,
        status: int | None,
        retry_after: float | None,
        rng: random.Random,
    ) -> float | None:
        """Seconds to wait before the next attempt, or None when the schedule is exhausted.

        Jitter spreads the scheduled step. A `Retry-After` on 429/503 that asks for longer is
        honoured exactly (no jitter: the partner named the moment), up to MAX_RETRY_AFTER_S;
        a shorter one never brings the retry forward.
        """
        if attempts_made < 0:
            raise ValueError("attempts_made cannot be negative")
        if attempts_made == 0:
            return 0.0
        if attempts_made > len(self.schedule):
            return None
        step = float(self.schedule[attempts_made - 1])
        delay = step * rng.uniform(1 - self.jitter, 1 + self.jitter)
        if status in RETRY_AFTER_STATUSES and retry_after is not None and retry_after >= 0:
            delay = max(delay, min(retry_after, MAX_RETRY_AFTER_S))
        return delay


@dataclass(frozen=True)
class Decision:
    """What to do with a delivery after an attempt, and when to try again if at all."""

    kind: DecisionKind
    next_attempt_at: datetime | None = None


def decide(
    status: int | None,
    error: str | None,
    attempts_made: int,
    retry_after: float | None,
    policy: RetryPolicy,
    rng: random.Random,
    now: datetime,
) -> Decision:
    """Classify one attempt's outcome: success needs a 2xx and no transport error."""
    if error is None and is_success(status):
        return Decision("succeeded")
    if status == GONE_STATUS:
        return Decision("disable")
    delay = policy.next_delay(attempts_made, status, retry_after, rng)
    if delay is None:
        return Decision("dead")
    return Decision("retry", _as_utc(now) + timedelta(seconds=delay))


def should_auto_disable(
    consecutive_failures: int,
    last_success_at: datetime | None,
    first_failure_at: datetime | None,
    now: datetime,
    max_failures: int,
    max_seconds: int,
) -> bool:
    """Disable only when an endpoint fails both often and for long, so blips are tolerated."""
    if max_failures <= 0 or consecutive_failures < max_failures:
        return False
    since = last_success_at if last_success_at is not None else first_failure_at
    if since is None:
        return False
    return (_as_utc(now) - _as_utc(since)).total_seconds() >= max_seconds
