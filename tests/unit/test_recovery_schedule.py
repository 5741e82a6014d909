"""The probe backoff of a failure-disabled endpoint: 5 min, 15 min, 1 h, then every 6 h,
within KURIR_PROBE_DAYS of the disable."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.recovery.schedule import delay_after, next_probe_at

T0 = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)


def test_the_backoff_is_5_min_15_min_1_h_then_every_6_h() -> None:
    minutes = [delay_after(n) / timedelta(minutes=1) for n in range(6)]
    assert minutes == [5, 15, 60, 360, 360, 360]


def test_no_probe_past_the_window() -> None:
    last = T0 + timedelta(days=7) - timedelta(hours=6)
    assert next_probe_at(T0, 10, last, 7) == T0 + timedelta(days=7)
    assert next_probe_at(T0, 10, last + timedelta(seconds=1), 7) is None
    assert next_probe_at(T0, 0, T0, 7) == T0 + timedelta(minutes=5)
