"""The one place that reads the wall clock, so policies and tests can inject their own."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(UTC)


def isoformat(value: datetime | None) -> str | None:
    """RFC 3339 UTC with a `Z`, the only time format the API speaks."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def parse_time(text: str) -> datetime:
    """Parse RFC 3339 (with `Z` or an offset); naive input is taken as UTC.

    Raises:
        ValueError: when the text is not a timestamp.
    """
    value = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)
