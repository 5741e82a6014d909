"""A lane hands work to the thread that went idle last, keeps what no thread waits for in
order, and gives back whatever was not handed out."""

from __future__ import annotations

import threading
from typing import Any

from sender.engine.lanes import Lane, _Idle
from tests.support.factories import wait_for


class _Thread:
    """A lane thread that records what it takes, until it takes None."""

    def __init__(self, lane: Lane, name: str, took: list[tuple[str, Any]]) -> None:
        self.waiter = _Idle()

        def loop() -> None:
            while True:
                item = lane.get(self.waiter)
                took.append((name, item))
                if item is None:
                    return

        self.thread = threading.Thread(target=loop, name=name, daemon=True)
        self.thread.start()


def _idle(lane: Lane, n: int) -> None:
    wait_for(lambda: len(lane._idle) == n, timeout_s=30)


def test_work_goes_to_the_thread_that_went_idle_last():
    lane = Lane()
    took: list[tuple[str, Any]] = []
    first = _Thread(lane, "first", took)
    _idle(lane, 1)
    second = _Thread(lane, "second", took)
    _idle(lane, 2)
    for n in range(3):
        lane.put(f"work-{n}")  # type: ignore[arg-type]
        wait_for(lambda n=n: len(took) == n + 1, timeout_s=30)
        _idle(lane, 2)  # back to waiting, on top again
    assert took == [("second", "work-0"), ("second", "work-1"), ("second", "work-2")]
    for thread in (second, first):  # the end, too, goes to the last idle
        lane.put(None)
        thread.thread.join(30)
        assert not thread.thread.is_alive()
    assert took[3:] == [("second", None), ("first", None)]


def test_work_no_thread_waits_for_is_kept_in_order_and_can_be_taken_back():
    lane = Lane()
    for n in range(4):
        lane.put(f"work-{n}")  # type: ignore[arg-type]
    waiter = _Idle()
    assert lane.get(waiter) == "work-0"  # there is work: no wait
    assert lane.take_all() == ["work-1", "work-2", "work-3"]
    assert lane.take_all() == []
