"""The per-process TTL cache (`app.cache.TTLCache`), on a clock the test moves."""

from __future__ import annotations

import threading

import pytest

from app.cache import TTLCache


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_an_entry_is_served_for_its_ttl_then_read_again(clock: Clock) -> None:
    cache: TTLCache[str, int] = TTLCache(5.0, 10, clock=clock)
    loads: list[str] = []

    def load() -> int:
        loads.append("k")
        return len(loads)

    assert cache.get_or_load("k", load) == 1
    clock.now += 4.999
    assert cache.get_or_load("k", load) == 1 and cache.get("k") == 1
    clock.now += 0.001
    assert cache.get("k") is None and cache.lookup("k") is None
    assert cache.get_or_load("k", load) == 2
    assert loads == ["k", "k"]


def test_a_cached_none_is_a_hit(clock: Clock) -> None:
    cache: TTLCache[str, str | None] = TTLCache(1.0, 10, clock=clock)
    calls = []

    def load() -> str | None:
        calls.append(1)
        return None  # e.g. a key that does not exist

    assert cache.get_or_load("unknown", load) is None
    assert cache.lookup("unknown") == (None,)
    assert cache.get_or_load("unknown", lambda: "loaded") is None
    assert calls == [1]


def test_a_load_that_raises_caches_nothing(clock: Clock) -> None:
    cache: TTLCache[str, int] = TTLCache(5.0, 10, clock=clock)

    def fail() -> int:
        raise LookupError("no such source")

    with pytest.raises(LookupError):
        cache.get_or_load("gone", fail)
    assert len(cache) == 0


def test_freshness_counts_from_when_the_value_was_asked_for(clock: Clock) -> None:
    """What a slow load read may have changed meanwhile: it is not kept longer for that."""
    cache: TTLCache[str, str] = TTLCache(5.0, 10, clock=clock)

    def slow() -> str:
        clock.now += 3.0
        return "v"

    cache.get_or_load("k", slow)
    clock.now += 2.0
    assert cache.get("k") is None


def test_forget_drops_one_or_every_entry(clock: Clock) -> None:
    cache: TTLCache[str, int] = TTLCache(60.0, 10, clock=clock)
    for n, key in enumerate("abc"):
        cache.put(key, n)
    cache.forget("a")
    assert cache.get("a") is None and cache.get("b") == 1
    cache.forget()
    assert len(cache) == 0


def test_at_the_bound_the_cache_starts_over(clock: Clock) -> None:
    cache: TTLCache[int, int] = TTLCache(60.0, 3, clock=clock)
    for n in range(3):
        cache.put(n, n)
    cache.put(1, 10)  # replacing an entry does not grow the cache
    assert len(cache) == 3
    cache.put(3, 3)
    assert len(cache) == 1 and cache.get(3) == 3 and cache.get(0) is None


def test_threads_share_it_safely() -> None:
    cache: TTLCache[int, int] = TTLCache(60.0, 50)

    def work(offset: int) -> None:
        for n in range(2000):
            cache.get_or_load((n + offset) % 80, lambda n=n: n)
            if n % 97 == 0:
                cache.forget(n % 80)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(cache) <= 50
