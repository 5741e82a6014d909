"""Since/until as people enter them, turned into what the services read (RFC 3339 UTC).

Every list's time filter is a pair of `datetime-local` inputs with presets (last 1 h,
24 h, 7 d). The page renders them in UTC; the page's script shows them in the browser's
own time and sends its offset from UTC (`tz`, minutes as `Date.getTimezoneOffset` gives
them), so a time typed in local time reaches the service as the same moment in UTC.
Without the script everything stays UTC. A preset button sends `last` (`1h`, `24h`, `7d`):
since that long ago, until now. What cannot be read is passed on as typed, for the service
to refuse on its field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from app.clock import isoformat, parse_time, utcnow

PRESETS = (("1h", "Last 1 h"), ("24h", "Last 24 h"), ("7d", "Last 7 d"))
_PRESET = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7)}
_LOCAL = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d+)?)?$")
MAX_OFFSET_MIN = 16 * 60


def _offset(raw: str | None) -> int:
    try:
        minutes = int(raw or "0")
    except ValueError:
        return 0
    return minutes if abs(minutes) <= MAX_OFFSET_MIN else 0


def to_utc(raw: str, offset_min: int) -> str:
    """A local `datetime-local` value (no zone) as RFC 3339 UTC; anything else as typed."""
    text = raw.strip()
    if not _LOCAL.match(text):
        return text
    local = datetime.fromisoformat(text).replace(tzinfo=UTC)
    return isoformat(local + timedelta(minutes=offset_min)) or text


def normalise(args: Mapping[str, str], now: datetime | None = None) -> dict[str, str]:
    """The query with `since` and `until` in RFC 3339 UTC (a preset fills `since`)."""
    out = {key: str(value) for key, value in args.items()}
    offset = _offset(args.get("tz"))
    preset = _PRESET.get(args.get("last") or "")
    if preset is not None:
        out["since"] = isoformat((now or utcnow()) - preset) or ""
        out["until"] = ""
    for key in ("since", "until"):
        if out.get(key):
            out[key] = to_utc(out[key], offset)
    out.pop("last", None)
    out.pop("tz", None)
    return out


def input_value(raw: str | None) -> str:
    """What a `datetime-local` input shows for an RFC 3339 value: its UTC wall time to the
    second ("" for what does not parse)."""
    if not raw:
        return ""
    try:
        moment = parse_time(raw)
    except ValueError:
        return ""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


def shown(moment: datetime | None) -> str:
    """An absolute time for people: to the second, UTC, no microseconds (the script shows
    it in local time)."""
    if moment is None:
        return ""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
