"""Local timers and the housekeeper that fires them.

Two kinds of timer share one heap: a delivery id due soon (a retry within
`recorder.LOCAL_TIMER_MAX_S`, a held delivery, one due within the claim's lookahead), which
is claimed again when it fires; and admitted work waiting for its rate-limit slot, which is
put in its endpoint's queue when it fires. The housekeeper ticks every `TICK_S`: it fires what
is due and hands back what waited too long in a local queue. Timers are precise to about one
tick; what is further off is left to the sweeper.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from sender.engine.ledger import Ledger
from sender.engine.work import Work

log = logging.getLogger(__name__)

TICK_S = 0.05


class Timers:
    """The heap of local timers; every method but `hold` expects the ledger's lock held."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._heap: list[tuple[float, int, str, Any]] = []
        self._seq = itertools.count()
        # Delivery ids with a live timer, and when it fires (time.monotonic()).
        self._timed: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._timed)

    def hold(self, items: Iterable[tuple[str, datetime]], now: datetime) -> None:
        """Claim each delivery id again at its datetime (one timer per id)."""
        mono = time.monotonic()
        with self.ledger.lock:
            for delivery_id, at in items:
                if delivery_id in self._timed:
                    continue
                fire = mono + max(0.0, (at - now).total_seconds())
                self._timed[delivery_id] = fire
                heapq.heappush(self._heap, (fire, next(self._seq), "ids", delivery_id))

    def defer(self, work: Work, fire: float) -> None:
        """Start admitted work at `fire` (time.monotonic()): its rate-limit slot."""
        heapq.heappush(self._heap, (fire, next(self._seq), "work", work))

    def cancel(self, delivery_id: str) -> None:
        """Claimed already (a manual retry, say): its timer, if any, need not fire."""
        self._timed.pop(delivery_id, None)

    def pop_due(self, mono: float) -> tuple[list[Work], list[str]]:
        """What is due: work to start now, and delivery ids to claim again."""
        works: list[Work] = []
        ids: list[str] = []
        while self._heap and self._heap[0][0] <= mono:
            _, _, kind, payload = heapq.heappop(self._heap)
            if kind == "work":
                works.append(payload)
            elif self._timed.pop(payload, None) is not None:
                ids.append(payload)
        return works, ids

    def drain(self) -> tuple[list[Work], list[str]]:
        """Stopping: every deferred work and every timed delivery id, timers cleared."""
        works = [payload for _, _, kind, payload in self._heap if kind == "work"]
        ids = list(self._timed)
        self._timed.clear()
        self._heap.clear()
        return works, ids


class Housekeeper:
    """Calls `tick` every TICK_S until `stopping` is set; a failing tick is logged, not fatal."""

    def __init__(self, tick: Callable[[], None], stopping: threading.Event) -> None:
        self.tick = tick
        self.stopping = stopping

    def run(self) -> None:
        while not self.stopping.wait(TICK_S):
            try:
                self.tick()
            except Exception:
                log.exception("delivery housekeeping failed")
