"""A small per-process cache whose entries expire: what a hot path reads on every request
(an API key, an inbound source's configuration) without a query each time.

An entry is served for `ttl_s` seconds after it was stored, so a change made in another
process is seen within that time; the process that makes a change `forget`s the entry and
sees it at once. At `max_entries` the cache is emptied rather than evicting one by one: the
bound only guards memory, and refilling costs one read per key. Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    """Values by key, each served for `ttl_s` seconds of `clock` after it was stored."""

    def __init__(
        self, ttl_s: float, max_entries: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._entries: dict[K, tuple[float, V]] = {}
        self._lock = threading.Lock()

    def lookup(self, key: K) -> tuple[V] | None:
        """`(value,)` while the entry is fresh, None otherwise (so a cached None is a hit)."""
        with self._lock:
            hit = self._entries.get(key)
        if hit is None or self.clock() - hit[0] >= self.ttl_s:
            return None
        return (hit[1],)

    def get(self, key: K) -> V | None:
        """The fresh value, or None when there is none."""
        found = self.lookup(key)
        return None if found is None else found[0]

    def put(self, key: K, value: V, stored_at: float | None = None) -> None:
        """Store `value`, fresh from `stored_at` (default: now)."""
        stamp = self.clock() if stored_at is None else stored_at
        with self._lock:
            if len(self._entries) >= self.max_entries and key not in self._entries:
                self._entries.clear()
            self._entries[key] = (stamp, value)

    def get_or_load(self, key: K, load: Callable[[], V]) -> V:
        """The fresh value, else `load()`'s, stored as of the moment it was asked for (what
        `load` read may have changed while it ran). Nothing is stored if `load` raises."""
        found = self.lookup(key)
        if found is not None:
            return found[0]
        asked_at = self.clock()
        value = load()
        self.put(key, value, stored_at=asked_at)
        return value

    def forget(self, key: K | None = None) -> None:
        """Drop one entry, or every entry."""
        with self._lock:
            if key is None:
                self._entries.clear()
            else:
                self._entries.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
