"""Endpoint health decisions on a fixed clock: tally, thresholds, the reset by one success."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sender.health import Health, Thresholds, should_disable, tally

T0 = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_failures_after_the_last_success_are_all_that_count():
    result = tally([(at(3), False), (at(1), False), (at(2), True), (at(4), False)])
    assert result.failures == 2
    assert result.last_success_at == at(2)
    assert result.first_failure_at == at(3) and result.last_failure_at == at(4)
    assert result.reset


def test_one_success_at_the_end_resets_the_run():
    result = tally([(at(1), False), (at(2), False), (at(3), True)])
    assert result.failures == 0 and result.reset and result.first_failure_at is None


def test_only_failures_add_up_without_a_reset():
    result = tally([(at(1), False), (at(2), False)])
    assert result.failures == 2 and not result.reset
    assert result.first_failure_at == at(1) and result.last_failure_at == at(2)


def _health(
    failures: int,
    last_success: datetime | None,
    first_failure: datetime | None,
    state: str = "enabled",
) -> Health:
    return Health("ep_1", state, failures, last_success, first_failure)


LIMITS = Thresholds(failures=8, seconds=86400)


def test_disable_needs_both_many_failures_and_a_long_time_without_success():
    long_ago = at(0)
    day_later = at(86400)
    assert not should_disable(_health(7, long_ago, at(10)), LIMITS, day_later)
    assert not should_disable(_health(8, long_ago, at(10)), LIMITS, at(86399))
    assert should_disable(_health(8, long_ago, at(10)), LIMITS, day_later)


def test_a_never_successful_endpoint_counts_from_its_first_failure():
    assert not should_disable(_health(20, None, at(100)), LIMITS, at(86400))
    assert should_disable(_health(20, None, at(100)), LIMITS, at(86500))


def test_a_disabled_endpoint_is_not_disabled_again():
    assert not should_disable(_health(50, None, at(0), state="disabled"), LIMITS, at(10**6))
