"""A rotating secret ring: the one rule for endpoint signing secrets and inbound source secrets.

A secret is live while its `expires_at` is unset or still ahead. Rotating adds a new secret
and caps every other one at now + the overlap, so both ends of a webhook can switch without a
window in which nothing verifies. The newest live secret is the current one (it signs, and
is tried first); ties on `created_at` are broken by id. The rows are `RotatingSecret`s
(`app.models`); these functions read and change only their lifetimes.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Protocol, TypeVar


class Secret(Protocol):
    """What the ring needs of a stored secret."""

    id: str
    created_at: datetime
    expires_at: datetime | None


S = TypeVar("S", bound=Secret)


def is_live(expires_at: datetime | None, now: datetime) -> bool:
    """A secret with this expiry still signs (or verifies) at `now`."""
    return expires_at is None or expires_at > now


def newest_first(secrets: Iterable[S]) -> list[S]:
    return sorted(secrets, key=lambda s: (s.created_at, s.id), reverse=True)


def live(secrets: Iterable[S], now: datetime) -> list[S]:
    """The secrets live at `now`, newest (the current one) first."""
    return newest_first(s for s in secrets if is_live(s.expires_at, now))


def cap(secrets: Iterable[Secret], now: datetime, overlap_s: int) -> datetime:
    """A rotation: every secret still live past now + `overlap_s` expires then; returns when.

    Secrets that expire sooner keep their earlier end; the caller adds the new secret.
    """
    expires = now + timedelta(seconds=overlap_s)
    for secret in secrets:
        if is_live(secret.expires_at, expires):
            secret.expires_at = expires
    return expires


def overlap_ends(secrets: Iterable[Secret], now: datetime) -> datetime | None:
    """Until when the secrets a rotation superseded are still live (None: no overlap now)."""
    ends = [s.expires_at for s in secrets if s.expires_at is not None and s.expires_at > now]
    return max(ends) if ends else None
