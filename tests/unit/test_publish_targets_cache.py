"""The publish hot path's targets cache stays bounded by the endpoints it holds."""

from __future__ import annotations

from app.intake.targets import Targets, TargetsCache


def _targets(endpoints: int) -> Targets:
    return Targets(
        "ptn_1", [(f"ep_{i}", "enabled", None) for i in range(endpoints)], None, digest="d"
    )


def test_it_forgets_everything_rather_than_hold_more_endpoints_than_allowed():
    cache = TargetsCache(max_endpoints=25)
    cache.put(("a", "t", 1), _targets(10))
    cache.put(("b", "t", 1), _targets(10))
    assert cache.get(("a", "t", 1)) is not None and cache.get(("b", "t", 1)) is not None
    cache.put(("c", "t", 1), _targets(10))  # 33 > 25
    assert cache.get(("a", "t", 1)) is None and cache.get(("b", "t", 1)) is None
    assert cache.get(("c", "t", 1)) is not None


def test_replacing_and_dropping_entries_gives_their_room_back():
    cache = TargetsCache(max_endpoints=25)
    for _ in range(5):
        cache.put(("a", "t", 1), _targets(10))  # the same key: no growth
    cache.put(("b", "t", 1), _targets(10))
    cache.drop(("b", "t", 1))
    cache.put(("c", "t", 1), _targets(10))
    assert cache.get(("a", "t", 1)) is not None and cache.get(("c", "t", 1)) is not None
    assert cache.get(("b", "t", 1)) is None
