"""Admission: how many of an endpoint's claimed deliveries this process takes on now.

A healthy endpoint takes the whole batch into its local queue, up to what its threads can
start within `MAX_LOCAL_WAIT_S` at its recent speed. An endpoint that recently timed out,
refused connections or answered slowly ("slow", here or in another worker: a flag in Redis)
takes only what its small slow-lane cap can start now. A rate-limited endpoint takes only the
send slots Redis grants it. The rest is *held*: given back with a timer, never dropped.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import threading
import time
from datetime import datetime, timedelta
from typing import Any

import redis

from app.net.http import ERROR_CONNECTION, ERROR_TIMEOUT
from sender.deliver import AttemptResult, Target
from sender.engine.ledger import Ledger, Room
from sender.ratelimit import RateLimiter

log = logging.getLogger(__name__)

# A claimed delivery waits at most this long in a local queue before it is handed back.
MAX_LOCAL_WAIT_S = 3.0
# An endpoint that timed out, refused a connection or answers this slowly on average is "slow"
# for SLOW_WINDOW_S, or until it answers fast again.
SLOW_WINDOW_S = 30.0
SLOW_DURATION_MS = 2000
FAST_ANSWER_MS = 500
SLOW_ERRORS = frozenset({ERROR_TIMEOUT, ERROR_CONNECTION})
SLOW_KEY_PREFIX = "kurir:slow:"
# Other workers' slow flags are read at most this often.
FLAGS_EVERY_S = 1.0
# Room for an endpoint not yet heard from: the whole batch, into its local queue...
UNKNOWN_ROOM = 10_000
# ...but only this many sent at once until its first answer: an endpoint that hangs or
# trickles on first contact must not take a fast lane's threads from the healthy ones for a
# whole timeout before the engine has learnt it is slow.
FIRST_CONTACT_CAP = 1


class Admission:
    """Decides, per endpoint, what to send now and what to hold; keeps each room's speed."""

    def __init__(
        self,
        ledger: Ledger,
        connection: redis.Redis,
        limiter: RateLimiter,
        rng: random.Random,
        *,
        fast_cap: int,
        slow_cap: int,
    ) -> None:
        self.ledger = ledger
        self.redis = connection
        self.limiter = limiter
        self.rng = rng
        self.fast_cap = fast_cap
        self.slow_cap = slow_cap
        self._flags_lock = threading.Lock()
        self._flags_checked_at = 0.0

    def admit(
        self, rows: list[Any], targets: dict[str, Target], now: datetime
    ) -> tuple[list[tuple[Any, float]], list[tuple[str, datetime]]]:
        """Split claimed rows into (row, start offset) to send and (id, until) to give back."""
        by_endpoint: dict[str, list[Any]] = {}
        for row in rows:
            by_endpoint.setdefault(row.endpoint_id, []).append(row)
        flagged = self._slow_flags(sorted(by_endpoint))
        mono = time.monotonic()
        admitted: list[tuple[Any, float]] = []
        held: list[tuple[str, datetime]] = []
        for endpoint_id, items in by_endpoint.items():
            target = targets[endpoint_id]
            with self.ledger.lock:
                room = self.ledger.room(endpoint_id)
                if endpoint_id in flagged and room.slow_until < mono:
                    room.slow_until = mono + SLOW_WINDOW_S / 2
                space = self.space(room, mono)
                wait_s = self.estimated_wait(room, target, mono)
            take = items[: max(space, 0)]
            rest = items[max(space, 0) :]
            offsets = [0.0] * len(take)
            if target.rate_limit_per_s and take:
                try:
                    grant = self.limiter.reserve(
                        endpoint_id, float(target.rate_limit_per_s), len(take)
                    )
                except (redis.RedisError, OSError):
                    log.warning(
                        "rate limiter unavailable; holding deliveries",
                        extra={"endpoint_id": endpoint_id},
                    )
                    grant = None
                if grant is None:
                    rest = take + rest
                    take, offsets = [], []
                    wait_s = max(wait_s, 1.0)
                else:
                    rest = take[grant.granted :] + rest
                    take = take[: grant.granted]
                    offsets = list(grant.offsets_s)
                    wait_s = max(wait_s, grant.next_free_s)
            admitted.extend(zip(take, offsets, strict=True))
            if rest:
                until = now + timedelta(seconds=max(wait_s, 0.2) * (0.9 + 0.2 * self.rng.random()))
                held.extend((item.id, until) for item in rest)
        return admitted, held

    def cap(self, room: Room, mono: float) -> int:
        """How many of the endpoint's deliveries may be sent at once."""
        if room.is_slow(mono):
            return self.slow_cap
        return FIRST_CONTACT_CAP if room.ewma_ms <= 0 else self.fast_cap

    def space(self, room: Room, mono: float) -> int:
        """How many more deliveries this endpoint may take into the process now."""
        if room.is_slow(mono):
            return max(0, self.slow_cap - room.busy)
        if room.ewma_ms <= 0:
            return UNKNOWN_ROOM
        # Enough to keep its threads busy for MAX_LOCAL_WAIT_S at its recent speed.
        per_s = self.fast_cap * 1000.0 / max(room.ewma_ms, 1.0)
        return max(self.fast_cap, int(per_s * MAX_LOCAL_WAIT_S)) - room.busy

    def estimated_wait(self, room: Room, target: Target, mono: float) -> float:
        """Seconds until this endpoint could take one more delivery, roughly."""
        slow = room.is_slow(mono)
        per_send = max(room.ewma_ms / 1000.0, target.timeout_s if slow else 0.05)
        rounds = math.ceil((room.busy + 1) / self.cap(room, mono))
        return min(max(per_send * rounds, 0.5), 30.0)

    def observe(self, room: Room, result: AttemptResult, mono: float) -> bool:
        """Learn the endpoint's speed from one attempt (lock held); True if it is slow now."""
        room.ewma_ms = (
            result.duration_ms
            if room.ewma_ms <= 0
            else 0.8 * room.ewma_ms + 0.2 * result.duration_ms
        )
        room.failures = 0 if result.ok else room.failures + 1
        if result.error in SLOW_ERRORS or room.ewma_ms >= SLOW_DURATION_MS:
            room.slow_until = mono + SLOW_WINDOW_S
            return True
        if result.error is None and result.duration_ms < FAST_ANSWER_MS:
            # Answering quickly again: back to the fast lane without waiting out the window.
            room.slow_until = 0.0
        return False

    def flag_slow(self, endpoint_id: str) -> None:
        """Tell the other workers (best effort): they admit it to their slow lanes too."""
        with contextlib.suppress(redis.RedisError, OSError):
            self.redis.set(SLOW_KEY_PREFIX + endpoint_id, b"1", ex=int(SLOW_WINDOW_S))

    def _slow_flags(self, endpoint_ids: list[str]) -> set[str]:
        """Endpoints another worker found slow recently (one MGET, at most once a second)."""
        mono = time.monotonic()
        with self._flags_lock:
            if mono - self._flags_checked_at < FLAGS_EVERY_S:
                return set()
            self._flags_checked_at = mono
        if not endpoint_ids:
            return set()
        try:
            values = self.redis.mget([SLOW_KEY_PREFIX + e for e in endpoint_ids])
        except (redis.RedisError, OSError):
            return set()
        return {e for e, v in zip(endpoint_ids, values, strict=True) if v is not None}
