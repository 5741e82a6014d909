"""Rate limits shared by every process: slots handed out by one Redis script.

Each limited subject (an endpoint's sends; a partner's endpoint creations or test events, see
`app.services.partner_bounds`) has one key holding its next free slot (a GCRA "theoretical
arrival time", in milliseconds). A caller reserves slots for what it is about to do; slots
are spaced 1/rate apart and may be taken up to `horizon_s` ahead, so no window of one second
sees more than `rate + 1` sends whichever workers make them. A delivery without a slot is
not dropped: it is held and tried later.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

KEY_PREFIX = "kurir:rl:"

# KEYS[1] slot key; ARGV: interval_ms, wanted, horizon_ms, now_ms (negative: use Redis TIME,
# one clock for every worker). Returns {granted, first_offset_ms, next_free_offset_ms}.
_RESERVE = """
local interval = tonumber(ARGV[1])
local wanted = tonumber(ARGV[2])
local horizon = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
local start = math.max(tat, now)
local granted = 0
if start - now <= horizon then
  granted = math.min(wanted, math.floor((now + horizon - start) / interval) + 1)
end
local next_free = start + granted * interval
if granted > 0 then
  redis.call('SET', KEYS[1], string.format('%.3f', next_free), 'PX',
             math.ceil(next_free - now) + 1000)
end
return {granted, string.format('%.3f', start - now), string.format('%.3f', next_free - now)}
"""


@dataclass(frozen=True)
class Reservation:
    """Slots granted to this worker: `granted` sends, the i-th at `offsets_s[i]` from now."""

    granted: int
    offsets_s: tuple[float, ...]
    # When the first slot not granted here comes free (seconds from now).
    next_free_s: float


class RateLimiter:
    """Hands out slots per subject (an endpoint id by default); safe to share between
    threads and processes."""

    def __init__(self, connection: redis.Redis, *, horizon_s: float = 1.0) -> None:
        self._redis = connection
        self._script = connection.register_script(_RESERVE)
        self.horizon_s = horizon_s

    def reserve(
        self, subject: str, rate_per_s: float, wanted: int, *, now_ms: float | None = None
    ) -> Reservation:
        """Reserve up to `wanted` slots starting within the horizon.

        Raises:
            redis.RedisError: when Redis is unreachable (the caller holds the deliveries).
        """
        if wanted <= 0:
            return Reservation(0, (), 0.0)
        interval_ms = 1000.0 / rate_per_s
        raw = self._script(
            keys=[KEY_PREFIX + subject],
            args=[
                repr(interval_ms),
                wanted,
                repr(self.horizon_s * 1000),
                -1 if now_ms is None else repr(float(now_ms)),
            ],
        )
        granted = int(raw[0])
        first_ms = float(raw[1])
        next_free_ms = float(raw[2])
        offsets = tuple((first_ms + i * interval_ms) / 1000.0 for i in range(granted))
        return Reservation(granted, offsets, next_free_ms / 1000.0)
