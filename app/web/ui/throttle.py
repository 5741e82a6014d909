"""Sign-in throttling: failed passwords are counted per account and per client address.

Without it the login form is an unlimited password oracle. After `MAX_FAILURES_PER_ACCOUNT`
failures for one e-mail, or `MAX_FAILURES_PER_CLIENT` from one address (password spraying
across accounts), sign-ins are refused with 429 until the window that began with the first
failure ends; a successful sign-in clears the account's count.

The counters live in Redis, shared by every API process, and are disposable: when Redis is
unreachable sign-in still works (an operator must be able to get in to see why), and the
failure is logged.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import redis

log = logging.getLogger(__name__)

KEY_PREFIX = "kurir:login-failures:"
MAX_FAILURES_PER_ACCOUNT = 5
MAX_FAILURES_PER_CLIENT = 50
WINDOW_S = 900

# KEYS: counters; ARGV[1]: window. Counts one failure on each; the window starts at the first.
_COUNT = """
for _, key in ipairs(KEYS) do
  if redis.call('INCR', key) == 1 then redis.call('EXPIRE', key, ARGV[1]) end
end
return 1
"""


@dataclass(frozen=True)
class Limits:
    per_account: int = MAX_FAILURES_PER_ACCOUNT
    per_client: int = MAX_FAILURES_PER_CLIENT
    window_s: int = WINDOW_S


def _key(kind: str, value: str) -> str:
    # Hashed: the keyspace need not hold operators' e-mail addresses.
    digest = hashlib.sha256(value.strip().lower().encode()).hexdigest()[:32]
    return f"{KEY_PREFIX}{kind}:{digest}"


class LoginThrottle:
    """Counts failed sign-ins and says how long a refused one must wait."""

    def __init__(self, connection: redis.Redis, limits: Limits | None = None) -> None:
        self._redis = connection
        self._count = connection.register_script(_COUNT)
        self.limits = limits or Limits()

    def retry_after(self, email: str, client: str) -> int:
        """Seconds until this account and address may try again; 0 when they may now."""
        keys = (_key("account", email), _key("client", client))
        caps = (self.limits.per_account, self.limits.per_client)
        try:
            pipe = self._redis.pipeline(transaction=False)
            for key in keys:
                pipe.get(key)
                pipe.ttl(key)
            replies = pipe.execute()
        except redis.RedisError as exc:
            log.warning("sign-in throttle unavailable, not enforced: %s", exc)
            return 0
        wait = 0
        for i, cap in enumerate(caps):
            count, ttl = replies[2 * i], replies[2 * i + 1]
            if count is not None and int(count) >= cap:
                wait = max(wait, ttl if ttl > 0 else self.limits.window_s)
        return wait

    def failed(self, email: str, client: str) -> None:
        try:
            self._count(keys=[_key("account", email), _key("client", client)],
                        args=[self.limits.window_s])
        except redis.RedisError as exc:
            log.warning("sign-in throttle unavailable, failure not counted: %s", exc)

    def succeeded(self, email: str) -> None:
        try:
            self._redis.delete(_key("account", email))
        except redis.RedisError as exc:
            log.warning("sign-in throttle unavailable: %s", exc)
