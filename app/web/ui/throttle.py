"""Sign-in throttling: failed passwords are counted per account and per client address.

Without it the login form is an unlimited password oracle. Two rules shape it:

- **Count first, check the password after.** Every attempt is counted, atomically, before the
  slow password hash runs, and un-counted when it succeeds. Checking a count and recording a
  failure only after the hash would let a concurrent burst through the check together
  (16 guesses per window with 2 processes × 8 threads, not 5).
- **Back off, do not lock.** The `MAX_FAILURES_PER_ACCOUNT`-th failure for one e-mail (or
  the `MAX_FAILURES_PER_CLIENT`-th from one address: password spraying) makes the next
  attempt wait `FIRST_DELAY_S`; each further failure doubles the wait — 2 s, 4 s … at most
  `MAX_DELAY_S`. An attempt refused while waiting is not counted and does not extend the
  wait, so someone who knows an operator's e-mail can slow that operator down by one short
  delay per guess they spend, but can no longer lock the account for a fixed 15 minutes.
  Counts are forgotten `FORGET_AFTER_S` after the last counted attempt; a successful sign-in
  clears the account's count.

The counters live in Redis, shared by every API process, and are disposable: when Redis is
unreachable sign-in still works (an operator must be able to get in to see why), and the
failure is logged.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import dataclass

import redis

log = logging.getLogger(__name__)

KEY_PREFIX = "kurir:login-backoff:"
MAX_FAILURES_PER_ACCOUNT = 5
MAX_FAILURES_PER_CLIENT = 50
FIRST_DELAY_S = 1.0
MAX_DELAY_S = 300.0
FORGET_AFTER_S = 900

_clock = time.time  # wall clock shared by every process; a test moves it instead of sleeping

# KEYS: counters (hashes: n = attempts counted, until = no attempt before this time).
# ARGV: now, first delay, max delay, forget-after, then each key's free attempts.
# Refuses (returns the wait) without counting while any key says wait; otherwise counts the
# attempt on every key, and a key at or past its free attempts sets its next wait.
_CLAIM = """
local now = tonumber(ARGV[1])
local first, most, forget = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local wait = 0
for _, key in ipairs(KEYS) do
  local later = tonumber(redis.call('HGET', key, 'until') or '0')
  if later - now > wait then wait = later - now end
end
if wait > 0 then return tostring(wait) end
for i, key in ipairs(KEYS) do
  local free = tonumber(ARGV[4 + i])
  local n = redis.call('HINCRBY', key, 'n', 1)
  local keep = forget
  if n >= free then
    local delay = math.min(first * 2 ^ (n - free), most)
    redis.call('HSET', key, 'until', tostring(now + delay))
    keep = keep + delay
  end
  redis.call('EXPIRE', key, math.ceil(keep))
end
return '0'
"""

# KEYS[1]: the account (forgotten), KEYS[2]: the client (this attempt un-counted).
_RELEASE = """
redis.call('DEL', KEYS[1])
if redis.call('HINCRBY', KEYS[2], 'n', -1) <= 0 then redis.call('DEL', KEYS[2]) end
return 1
"""


@dataclass(frozen=True)
class Limits:
    per_account: int = MAX_FAILURES_PER_ACCOUNT
    per_client: int = MAX_FAILURES_PER_CLIENT
    first_delay_s: float = FIRST_DELAY_S
    max_delay_s: float = MAX_DELAY_S
    forget_after_s: int = FORGET_AFTER_S


def _key(kind: str, value: str) -> str:
    # Hashed: the keyspace need not hold operators' e-mail addresses.
    digest = hashlib.sha256(value.strip().lower().encode()).hexdigest()[:32]
    return f"{KEY_PREFIX}{kind}:{digest}"


class LoginThrottle:
    """Counts sign-in attempts and says how long a refused one must wait."""

    def __init__(self, connection: redis.Redis, limits: Limits | None = None) -> None:
        self._redis = connection
        self._claim = connection.register_script(_CLAIM)
        self._release = connection.register_script(_RELEASE)
        self.limits = limits or Limits()

    def claim(self, email: str, client: str) -> int:
        """Count this attempt as a failure, before its password is checked, and return 0 —
        or return the seconds to wait, counting nothing, while this account or address must
        wait."""
        limits = self.limits
        try:
            reply = self._claim(
                keys=[_key("account", email), _key("client", client)],
                args=[
                    repr(_clock()),
                    limits.first_delay_s,
                    limits.max_delay_s,
                    limits.forget_after_s,
                    limits.per_account,
                    limits.per_client,
                ],
            )
        except redis.RedisError as exc:
            log.warning("sign-in throttle unavailable, not enforced: %s", exc)
            return 0
        wait = float(reply)
        return max(1, math.ceil(wait)) if wait > 0 else 0

    def succeeded(self, email: str, client: str) -> None:
        """The attempt was right after all: forget the account's count, un-count the
        address's."""
        try:
            self._release(keys=[_key("account", email), _key("client", client)])
        except redis.RedisError as exc:
            log.warning("sign-in throttle unavailable: %s", exc)
