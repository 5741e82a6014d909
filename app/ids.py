"""Prefixed, time-sortable identifiers (ULID layout) so that ids double as pagination cursors."""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford base32, sorts like the numbers
_lock = threading.Lock()
_last_ms = 0
_last_rand = 0


def _encode(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def ulid() -> str:
    """A 26-character ULID, monotonic within a process even inside one millisecond."""
    global _last_ms, _last_rand
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms <= _last_ms:
            now_ms = _last_ms
            _last_rand += 1
        else:
            _last_rand = int.from_bytes(os.urandom(10), "big") >> 1  # room to increment
        _last_ms = now_ms
        return _encode(now_ms, 10) + _encode(_last_rand & ((1 << 80) - 1), 16)


def new_id(prefix: str) -> str:
    return f"{prefix}_{ulid()}"


def id_floor(prefix: str, moment: datetime) -> str:
    """The smallest id created at `moment`: ids are ULIDs, so a time range is an id range
    (which the primary key answers, where `created_at` may have no index)."""
    millis = max(0, int(moment.timestamp() * 1000))
    return f"{prefix}_{_encode(millis, 10)}{'0' * 16}"


def id_at(prefix: str, moment: datetime) -> str:
    """A fresh id as if made at `moment` (loading history, and tests that need old rows)."""
    millis = max(0, int(moment.timestamp() * 1000))
    return f"{prefix}_{_encode(millis, 10)}{_encode(int.from_bytes(os.urandom(10), 'big'), 16)}"


def moment_of(identifier: str) -> datetime | None:
    """When an id was made (the inverse of `id_at`, to the millisecond); None when it is not
    one of ours."""
    _, _, body = identifier.rpartition("_")
    if len(body) != 26:
        return None
    millis = 0
    for char in body[:10].upper():
        digit = _ALPHABET.find(char)
        if digit < 0:
            return None
        millis = millis * 32 + digit
    return datetime.fromtimestamp(millis / 1000, UTC)
