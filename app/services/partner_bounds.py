"""What one partner can cause, bounded: how many endpoints it has, and how fast its own
credentials create endpoints and send test events.

Every publish writes one delivery and sends one signed POST per endpoint, so a partner that
may add endpoints without end, or send test events without end, makes Kurir write and send
without end — to wherever the partner points. Three bounds:

- **Endpoints per partner** (`KURIR_MAX_ENDPOINTS_PER_PARTNER`): live endpoints, whoever
  creates them; one more is `422 endpoint_limit`. The count is taken under a lock on the
  partner's row (`SELECT … FOR NO KEY UPDATE` on PostgreSQL, which does not wait for
  publishes that merely reference the partner; SQLite's `BEGIN IMMEDIATE` already runs one
  writer at a time), so concurrent creations cannot overshoot.
- **Creations and test events a minute** (`KURIR_PARTNER_ENDPOINT_CREATES_PER_MINUTE`,
  `KURIR_PARTNER_TEST_SENDS_PER_MINUTE`), per partner, over every API process: slots from
  `sender.ratelimit` (the script that paces deliveries), a burst of N then one every 60/N s;
  one more is `429 rate_limited` with `Retry-After`. Only the partner's own credentials (its
  keys, its portal) are limited: an operator acting for a partner is not slowed by it.
- **When Redis is down**: a creation goes ahead (fail open: it sends nothing, and the
  endpoint cap, kept in the database, still holds); a test event is refused with
  `503 unavailable` (fail closed: each one is a POST to a URL the partner chose).
"""

from __future__ import annotations

import logging
import math

import redis
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.errors import RateLimited, Unavailable, ValidationFailed
from app.models import Endpoint, Partner
from app.runtime import Runtime
from app.services.actor import Actor
from sender.ratelimit import RateLimiter

log = logging.getLogger(__name__)

ENDPOINT_LIMIT = "endpoint_limit"
CREATES, TEST_SENDS = "endpoint-creates", "test-sends"
# What a refused test event is told to wait while Redis is unreachable.
UNAVAILABLE_RETRY_S = 5
_WHAT = {CREATES: "endpoint creations", TEST_SENDS: "test events"}


def check_endpoint_room(session: Session, settings: Settings, partner: Partner) -> None:
    """Refuse one endpoint more than the partner may have; holds the partner's row locked
    until the caller's transaction ends, so that two creations cannot both fit the last place.

    Raises:
        ValidationFailed: `endpoint_limit`.
    """
    session.execute(
        select(Partner.id).where(Partner.id == partner.id).with_for_update(key_share=True)
    )
    live = (
        session.scalar(
            select(func.count())
            .select_from(Endpoint)
            .where(Endpoint.partner_id == partner.id, Endpoint.deleted_at.is_(None))
        )
        or 0
    )
    limit = settings.max_endpoints_per_partner
    if live >= limit:
        raise ValidationFailed(
            f"partner {partner.uid!r} has reached the most endpoints one partner may have "
            f"({limit}); delete one it no longer uses before adding another",
            code=ENDPOINT_LIMIT,
            details={"limit": limit, "endpoints": live},
        )


def _per_minute(settings: Settings, kind: str) -> int:
    if kind == CREATES:
        return settings.partner_endpoint_creates_per_minute
    return settings.partner_test_sends_per_minute


def wait_s(
    connection: redis.Redis,
    kind: str,
    partner_id: str,
    per_minute: int,
    *,
    now_ms: float | None = None,
) -> float:
    """Take one slot of `kind` for the partner: 0 when granted, else the seconds until one
    comes free. `now_ms` stands in for Redis's clock (tests).

    Raises:
        redis.RedisError: Redis is unreachable (the caller decides: open or closed).
    """
    interval_s = 60.0 / per_minute
    # Slots may be taken this far ahead: a burst of `per_minute` (1 ms of slack for the
    # script's rounding), then one every `interval_s`.
    limiter = RateLimiter(connection, horizon_s=60.0 - interval_s + 0.001)
    grant = limiter.reserve(f"partner:{kind}:{partner_id}", per_minute / 60.0, 1, now_ms=now_ms)
    if grant.granted:
        return 0.0
    return max(grant.next_free_s - limiter.horizon_s, 0.001)


def take(rt: Runtime, actor: Actor, partner_id: str, kind: str) -> None:
    """Count one endpoint creation or test event against the acting partner's rate.

    Raises:
        RateLimited: `rate_limited` (429), with the seconds to wait.
        Unavailable: a test event while Redis is unreachable (503).
    """
    if not actor.bound_to_partner:
        return
    per_minute = _per_minute(rt.settings, kind)
    try:
        wait = wait_s(rt.redis, kind, partner_id, per_minute)
    except redis.RedisError as exc:
        if kind == CREATES:
            log.warning("partner rate limit unavailable, endpoint creation allowed: %s", exc)
            return
        log.warning("partner rate limit unavailable, test event refused: %s", exc)
        raise Unavailable(
            "test events cannot be counted right now (the rate limiter is "
            "unreachable), so none is sent; try again shortly",
            retry_after_s=UNAVAILABLE_RETRY_S,
        ) from None
    if wait:
        after = max(1, math.ceil(wait))
        raise RateLimited(
            f"too many {_WHAT[kind]}: at most {per_minute} a minute per "
            f"partner; try again in {after} s",
            details={"limit_per_minute": per_minute, "retry_after_s": after},
            retry_after_s=after,
        )
