"""What this process holds right now, counted under one lock.

Every stage moves deliveries through the same counts, so `idle()` and the backpressure on new
jobs are exact: a delivery is *waiting* from its claim until a lane thread takes it (in its
endpoint's local queue, on a start timer or in a lane's queue), *in flight* while it is sent,
and *unflushed* until the recorder has written its outcome or its release. A count moves from
one to the next under the lock, so no reader sees a delivery in none of them.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from sender.engine.work import Work

# An endpoint whose last this many attempts failed sends on the slow lane (at its usual cap)
# until one succeeds: a partner answering errors, however quickly, must not take the fast
# lane's threads from the healthy ones when a burst of its deliveries comes due at once.
FAILING_STREAK = 5
# Rooms kept for endpoints with nothing here: past this many, the idle ones are forgotten
# (what they knew — recent speed, slowness — is learnt again, or read from the Redis flag).
MAX_ROOMS = 50_000

COUNTERS = ("jobs", "claimed", "held", "released", "not_due", "unsendable", "attempts", "flushes")


@dataclass
class Room:
    """One endpoint's share of this process: its local queue, its sends, its recent speed."""

    queue: deque[Work] = field(default_factory=deque)
    inflight: int = 0
    slow_until: float = 0.0  # time.monotonic() until which it counts as slow
    ewma_ms: float = 0.0  # recent answer time, 0 until the first answer
    failures: int = 0  # attempts failed in a row (any error or non-2xx answer)

    @property
    def busy(self) -> int:
        return self.inflight + len(self.queue)

    def is_slow(self, mono: float) -> bool:
        return self.slow_until > mono

    @property
    def failing(self) -> bool:
        return self.failures >= FAILING_STREAK


class Ledger:
    """The lock, the counts and the rooms every stage shares."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.rooms: dict[str, Room] = {}
        # Claimed here and not yet finished or handed back: a duplicate job skips these.
        self.local: set[str] = set()
        self.waiting = 0
        self.inflight = 0
        self.unflushed = 0
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        # While a job waits under backpressure: the count of waiting deliveries that wakes it.
        self._wake_below = 0

    def room(self, endpoint_id: str) -> Room:
        """The endpoint's room (lock held), made on first use."""
        room = self.rooms.get(endpoint_id)
        if room is None:
            if len(self.rooms) >= MAX_ROOMS:
                self.forget_idle_rooms(MAX_ROOMS // 2)
            room = self.rooms[endpoint_id] = Room()
        return room

    def forget_idle_rooms(self, keep: int) -> None:
        """Drop the oldest rooms with nothing queued or in flight until `keep` remain (lock
        held): a worker that meets a million endpoints must not keep a room for each."""
        excess = len(self.rooms) - keep
        for endpoint_id in [e for e, r in self.rooms.items() if r.busy == 0][: max(excess, 0)]:
            del self.rooms[endpoint_id]

    def count(self, **amounts: int) -> None:
        with self.lock:
            for name, amount in amounts.items():
                self.counters[name] += amount

    def _idle(self) -> bool:
        return self.waiting == 0 and self.inflight == 0 and self.unflushed == 0

    def idle(self) -> bool:
        with self.lock:
            return self._idle()

    def wait_idle(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while not self._idle():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.changed.wait(min(remaining, 0.1))
        return True

    def taken(self) -> None:
        """A lane thread took one waiting delivery (lock held).

        Wakes a job held by backpressure only when the count crosses its mark: a wake-up per
        delivery would be a thread handoff per delivery. (Idleness is reached when a record is
        flushed, and the recorder wakes waiters then.)
        """
        self.waiting -= 1
        if self.waiting < self._wake_below:
            self._wake_below = 0
            self.changed.notify_all()

    def wait_below(self, high_water: int, timeout_s: float) -> None:
        """Backpressure: wait (at most `timeout_s`) while `high_water` deliveries wait."""
        with self.changed:
            deadline = time.monotonic() + timeout_s
            while self.waiting >= high_water and time.monotonic() < deadline:
                self._wake_below = high_water
                self.changed.wait(0.05)
