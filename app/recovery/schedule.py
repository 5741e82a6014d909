"""When a failure-disabled endpoint is probed next: 5 min, 15 min, 1 h after each other, then
every 6 h, and never past `KURIR_PROBE_DAYS` after it was disabled."""

from __future__ import annotations

from datetime import datetime, timedelta

from app.config import PROBE_EVERY_S, PROBE_SCHEDULE


def delay_after(probes_sent: int) -> timedelta:
    """The wait before the next probe, once `probes_sent` have gone out (0: since the
    disable)."""
    if probes_sent < len(PROBE_SCHEDULE):
        return timedelta(seconds=PROBE_SCHEDULE[probes_sent])
    return timedelta(seconds=PROBE_EVERY_S)


def window_ends(disabled_at: datetime, probe_days: int) -> datetime:
    """The last moment a probe may be sent."""
    return disabled_at + timedelta(days=probe_days)


def next_probe_at(
    disabled_at: datetime, probes_sent: int, now: datetime, probe_days: int
) -> datetime | None:
    """When the next probe is due, counted from `now` (the last probe); None when that is
    past the window: the endpoint is probed no more and stays disabled."""
    at = now + delay_after(probes_sent)
    return at if at <= window_ends(disabled_at, probe_days) else None
