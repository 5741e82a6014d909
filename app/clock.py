"""The one place that reads the wall clock, so policies and tests can inject their own."""

from __future__ import annotations

import re
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


_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?"
    r"(?:[Zz]|[+-][0-9]{2}:[0-9]{2})"
)


def parse_rfc3339(text: str) -> datetime:
    """Parse a stored timestamp strictly: RFC 3339, offset required (none is not UTC, it is
    unknown).

    Raises:
        ValueError: anything else, including a date without a time or a time without offset.
    """
    if not _RFC3339.fullmatch(text):
        raise ValueError(f"not an RFC 3339 timestamp with an offset: {text!r}")
    fraction = re.search(r"\.([0-9]+)", text)
    if fraction and len(fraction.group(1)) > 6:  # Python keeps microseconds
        text = text.replace(fraction.group(0), fraction.group(0)[:7], 1)
    return parse_time(text)


def parse_time(text: str) -> datetime:
    """Parse RFC 3339 (with `Z` or an offset); naive input is taken as UTC.

    Raises:
        ValueError: when the text is not a timestamp.
    """
    value = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)
