"""Retry schedule, Retry-After, outcome decisions and auto-disable, on a fixed clock."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.config import DEFAULT_RETRY_SCHEDULE, parse_schedule
from sender.policy import (
    MAX_RETRY_AFTER_S,
    Decision,
    RetryPolicy,
    decide,
    is_success,
    parse_retry_after,
    should_auto_disable,
)

NOW = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)
NO_JITTER = RetryPolicy(DEFAULT_RETRY_SCHEDULE, jitter=0.0)


def rng() -> random.Random:
    return random.Random(1234)


# ------------------------------------------------------------------------ schedule


def test_default_schedule_is_13_attempts_over_about_three_days() -> None:
    assert DEFAULT_RETRY_SCHEDULE == (5, 300, 1800, 7200, 18000) + (36000,) * 7
    assert RetryPolicy().max_attempts == 13
    assert 3.0 < sum(DEFAULT_RETRY_SCHEDULE) / 86400 < 3.3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5,300,1800", (5, 300, 1800)),
        (" 5 , 300 ,1800 ", (5, 300, 1800)),
        ("60", (60,)),
        (",".join(map(str, DEFAULT_RETRY_SCHEDULE)), DEFAULT_RETRY_SCHEDULE),
    ],
)
def test_parse_schedule(text: str, expected: tuple[int, ...]) -> None:
    assert parse_schedule(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("5,,300", "item 2"),
        ("5,300,", "item 3"),
        ("5,0", "item 2 must be positive"),
        ("5,-1", "item 2"),
        ("5s,300", "item 1"),
        ("1.5", "item 1"),
        ("5;300", "item 1"),
        ("+5", "item 1"),
        ("٥", "item 1"),
    ],
)
def test_parse_schedule_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_schedule(text)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"schedule": ()}, "at least one"),
        ({"schedule": (5, 0)}, "positive"),
        ({"schedule": (5, 1.5)}, "positive"),
        ({"schedule": (5,), "jitter": 1.0}, "jitter"),
        ({"schedule": (5,), "jitter": -0.1}, "jitter"),
    ],
)
def test_retry_policy_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**kwargs)


# ---------------------------------------------------------------------- next_delay


def test_without_jitter_delay_is_the_step_after_attempt_n() -> None:
    for n, step in enumerate(DEFAULT_RETRY_SCHEDULE, start=1):
        assert NO_JITTER.next_delay(n, 500, None, rng()) == step
    assert NO_JITTER.next_delay(13, 500, None, rng()) is None
    assert NO_JITTER.next_delay(99, 500, None, rng()) is None


def test_first_attempt_is_immediate() -> None:
    assert NO_JITTER.next_delay(0, None, None, rng()) == 0.0
    with pytest.raises(ValueError, match="negative"):
        NO_JITTER.next_delay(-1, None, None, rng())


def test_jitter_stays_within_twenty_percent_and_varies() -> None:
    policy = RetryPolicy(DEFAULT_RETRY_SCHEDULE)
    r = random.Random(7)
    delays = [policy.next_delay(2, 500, None, r) for _ in range(500)]
    assert all(d is not None and 240 <= d <= 360 for d in delays)
    assert len({round(d, 6) for d in delays if d is not None}) > 400
    assert min(delays) < 250 and max(delays) > 350  # type: ignore[type-var, operator]


def test_seeded_rng_is_reproducible() -> None:
    policy = RetryPolicy()
    assert policy.next_delay(3, None, None, rng()) == policy.next_delay(3, None, None, rng())


def test_retry_after_cap_is_one_hour() -> None:
    assert MAX_RETRY_AFTER_S == 3600.0


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_longer_than_the_step_is_waited_in_full(status: int) -> None:
    # step after attempt 2 is 300 s; after attempt 1, 5 s
    assert NO_JITTER.next_delay(2, status, 500.0, rng()) == 500.0
    assert NO_JITTER.next_delay(2, status, 3000.0, rng()) == 3000.0
    assert NO_JITTER.next_delay(1, status, 60.0, rng()) == 60.0
    short = RetryPolicy((1, 1, 1), jitter=0.0)
    assert short.next_delay(1, status, 3.0, rng()) == 3.0


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_capped_at_one_hour(status: int) -> None:
    assert NO_JITTER.next_delay(1, status, 10_000.0, rng()) == MAX_RETRY_AFTER_S
    assert NO_JITTER.next_delay(2, status, 1e9, rng()) == MAX_RETRY_AFTER_S
    # a step longer than the cap still wins: Retry-After never shortens the schedule
    assert NO_JITTER.next_delay(6, status, 10_000.0, rng()) == 36000.0


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_shorter_than_the_step_keeps_the_step(status: int) -> None:
    assert NO_JITTER.next_delay(2, status, 100.0, rng()) == 300.0
    assert NO_JITTER.next_delay(2, status, 0.0, rng()) == 300.0


@pytest.mark.parametrize("status", [429, 503])
def test_jitter_spreads_the_step_but_not_a_longer_retry_after(status: int) -> None:
    jittered = RetryPolicy(DEFAULT_RETRY_SCHEDULE, jitter=0.2)
    for seed in range(50):
        assert jittered.next_delay(1, status, 60.0, random.Random(seed)) == 60.0
        assert jittered.next_delay(1, status, 7200.0, random.Random(seed)) == MAX_RETRY_AFTER_S
        # a Retry-After inside the jitter band: the later of the two
        plain = jittered.next_delay(2, None, None, random.Random(seed))
        assert plain is not None
        assert jittered.next_delay(2, status, 300.0, random.Random(seed)) == max(plain, 300.0)


@pytest.mark.parametrize("status", [500, 502, 404, 410, None])
def test_retry_after_ignored_for_other_statuses(status: int | None) -> None:
    assert NO_JITTER.next_delay(2, status, 500.0, rng()) == 300.0


@given(
    n=st.integers(min_value=1, max_value=12),
    status=st.one_of(st.none(), st.integers(100, 599)),
    retry_after=st.one_of(st.none(), st.floats(0, 1e9)),
    seed=st.integers(0, 2**32),
)
def test_delay_bounds_property(
    n: int, status: int | None, retry_after: float | None, seed: int
) -> None:
    policy = RetryPolicy()
    step = DEFAULT_RETRY_SCHEDULE[n - 1]
    delay = policy.next_delay(n, status, retry_after, random.Random(seed))
    assert delay is not None
    assert step * 0.8 <= delay <= max(step * 1.2, MAX_RETRY_AFTER_S)
    if status in (429, 503) and retry_after is not None:
        assert delay >= min(retry_after, MAX_RETRY_AFTER_S)
    else:
        assert delay <= step * 1.2


# ----------------------------------------------------------------------- successes


@pytest.mark.parametrize(
    ("status", "ok"),
    [(200, True), (201, True), (204, True), (299, True), (199, False), (300, False),
     (302, False), (304, False), (400, False), (410, False), (500, False), (None, False)],
)  # fmt: skip
def test_is_success(status: int | None, ok: bool) -> None:
    assert is_success(status) is ok


# --------------------------------------------------------------------- Retry-After


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", 120.0),
        ("  120 ", 120.0),
        ("0", 0.0),
        ("-5", 0.0),
        ("1.5", 1.5),
        ("Wed, 02 Dec 2026 10:02:00 GMT", 120.0),
        ("Wednesday, 02-Dec-26 10:02:00 GMT", 120.0),
        ("Wed Dec  2 10:02:00 2026", 120.0),
        ("Wed, 02 Dec 2026 09:00:00 GMT", 0.0),
        ("Wed, 02 Dec 2026 11:00:00 +0100", 0.0),
        (None, None),
        ("", None),
        ("soon", None),
        ("12abc", None),
        ("inf", None),
        ("nan", None),
        ("Wed, 99 Foo 2026 10:02:00 GMT", None),
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, NOW) == expected


def test_parse_retry_after_accepts_naive_now_as_utc() -> None:
    naive = NOW.replace(tzinfo=None)
    assert parse_retry_after("Wed, 02 Dec 2026 10:00:30 GMT", naive) == 30.0


# ------------------------------------------------------------------------- decide


def test_decide_success() -> None:
    assert decide(200, None, 1, None, NO_JITTER, rng(), NOW) == Decision("succeeded", None)
    assert decide(204, None, 13, None, NO_JITTER, rng(), NOW).kind == "succeeded"


def test_decide_2xx_with_transport_error_is_not_success() -> None:
    d = decide(200, "timeout", 1, None, NO_JITTER, rng(), NOW)
    assert d == Decision("retry", NOW + timedelta(seconds=5))


@pytest.mark.parametrize("attempts", [1, 5, 13])
def test_decide_gone_disables(attempts: int) -> None:
    assert decide(410, None, attempts, None, NO_JITTER, rng(), NOW) == Decision("disable", None)


@pytest.mark.parametrize(
    ("status", "error"),
    [(500, None), (302, None), (404, None), (None, "timeout"), (None, "connection_error"),
     (None, "blocked_address"), (None, "tls_error")],
)  # fmt: skip
def test_decide_failure_retries_on_schedule(status: int | None, error: str | None) -> None:
    d = decide(status, error, 3, None, NO_JITTER, rng(), NOW)
    assert d == Decision("retry", NOW + timedelta(seconds=1800))


def test_decide_dead_when_exhausted() -> None:
    assert decide(500, None, 13, None, NO_JITTER, rng(), NOW) == Decision("dead", None)
    assert decide(None, "timeout", 2, None, RetryPolicy((5,)), rng(), NOW).kind == "dead"


def test_decide_honours_retry_after() -> None:
    d = decide(429, None, 2, 450.0, NO_JITTER, rng(), NOW)
    assert d == Decision("retry", NOW + timedelta(seconds=450))


def test_decide_with_jitter_is_within_bounds() -> None:
    d = decide(500, None, 4, None, RetryPolicy(), random.Random(3), NOW)
    assert d.kind == "retry" and d.next_attempt_at is not None
    assert NOW + timedelta(seconds=5760) <= d.next_attempt_at <= NOW + timedelta(seconds=8640)


def test_full_walk_of_the_default_schedule() -> None:
    """Thirteen failing attempts: twelve retries at the scheduled times, then dead."""
    policy, r, clock = RetryPolicy(), random.Random(42), NOW
    times = []
    for attempt in range(1, 14):
        d = decide(503, None, attempt, None, policy, r, clock)
        if attempt == 13:
            assert d.kind == "dead"
            break
        assert d.kind == "retry" and d.next_attempt_at is not None
        times.append(d.next_attempt_at)
        clock = d.next_attempt_at
    assert len(times) == 12
    total = (times[-1] - NOW).total_seconds()
    assert sum(DEFAULT_RETRY_SCHEDULE) * 0.8 <= total <= sum(DEFAULT_RETRY_SCHEDULE) * 1.2


# ------------------------------------------------------------------- auto-disable

DAY = 86400


@pytest.mark.parametrize(
    ("failures", "last_success", "first_failure", "expected"),
    [
        (8, NOW - timedelta(days=2), NOW - timedelta(days=1, seconds=1), True),
        (8, NOW - timedelta(seconds=DAY), None, True),
        (8, NOW - timedelta(seconds=DAY - 1), NOW - timedelta(hours=1), False),
        (7, NOW - timedelta(days=5), NOW - timedelta(days=4), False),
        (100, NOW - timedelta(hours=2), NOW - timedelta(hours=1), False),
        (8, None, NOW - timedelta(days=2), True),
        (8, None, NOW - timedelta(hours=23), False),
        (8, None, None, False),
        (0, None, NOW - timedelta(days=30), False),
    ],
)
def test_should_auto_disable(
    failures: int,
    last_success: datetime | None,
    first_failure: datetime | None,
    expected: bool,
) -> None:
    assert should_auto_disable(failures, last_success, first_failure, NOW, 8, DAY) is expected


def test_should_auto_disable_prefers_last_success_over_first_failure() -> None:
    # an old streak start does not matter while the last success is recent
    recent_success = NOW - timedelta(hours=1)
    old_first_failure = NOW - timedelta(days=3)
    assert not should_auto_disable(9, recent_success, old_first_failure, NOW, 8, DAY)


def test_should_auto_disable_accepts_naive_datetimes_as_utc() -> None:
    naive_success = (NOW - timedelta(days=2)).replace(tzinfo=None)
    assert should_auto_disable(8, naive_success, None, NOW, 8, DAY)
    assert should_auto_disable(8, naive_success, None, NOW.replace(tzinfo=None), 8, DAY)


def test_should_auto_disable_off_when_max_failures_not_positive() -> None:
    assert not should_auto_disable(50, None, NOW - timedelta(days=9), NOW, 0, DAY)
