"""Feed cursors: opaque to the consumer, a feed position and when it was handed out inside.

A cursor is refused once it is older than the retention period (410 `cursor_expired`): past
that, events after it may have been purged, so "every event exactly once" could no longer be
promised. Every answer hands out a fresh cursor, so a consumer that keeps polling never holds
an old one. The cursor is not signed: forging one only misleads its maker, and a position
beyond the feed's head is refused.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from app.errors import BadRequest, Gone

_FORMAT = re.compile(r"f1\.(\d{1,18})\.(\d{1,12})")


@dataclass(frozen=True)
class Cursor:
    seq: int
    issued_at: datetime


def encode(seq: int, issued_at: datetime) -> str:
    raw = f"f1.{seq}.{int(issued_at.timestamp())}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def invalid(message: str, cursor: str) -> BadRequest:
    return BadRequest(message, code="invalid_cursor", details={"cursor": cursor[:200]})


def decode(cursor: str, *, now: datetime, retention: timedelta) -> Cursor:
    """The position a cursor points after.

    Raises:
        BadRequest: `invalid_cursor`, not one of ours.
        Gone: `cursor_expired`, handed out longer ago than the retention period.
    """
    try:
        raw = base64.urlsafe_b64decode((cursor + "=" * (-len(cursor) % 4)).encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raw = ""
    match = _FORMAT.fullmatch(raw)
    if match is None:
        raise invalid("cursor is not a feed cursor (use the next_cursor of a feed answer)", cursor)
    seq, issued = int(match.group(1)), int(match.group(2))
    issued_at = datetime.fromtimestamp(issued, UTC)
    if issued_at < now - retention:
        raise Gone(
            "this cursor is older than the retention period: events after it may be "
            "gone; start again without a cursor (or from the endpoint's last "
            "acknowledgement)",
            code="cursor_expired",
            details={
                "issued_at": issued_at.isoformat().replace("+00:00", "Z"),
                "retention_days": retention.days,
            },
        )
    return Cursor(seq, issued_at)
