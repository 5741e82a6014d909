"""One delivery attempt: sign at send time, POST through the guarded transport, report.

Everything here is per attempt: a fresh `webhook-timestamp` and signature every time, the same
`webhook-id` (the event id) every time, so receivers can deduplicate retries and resends.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from app import __version__
from app import headers as header_rules
from app.clock import utcnow
from app.net.guard import GuardPolicy
from app.net.http import HttpResult, Transport
from app.signing import build_headers

USER_AGENT = f"Kurir/{__version__}"

_BAD_VALUE = re.compile(r"[\r\n\x00]")


@dataclass(frozen=True)
class Target:
    """What is needed to send to one endpoint, read once per batch."""

    endpoint_id: str
    url: str
    secrets: tuple[str, ...]
    headers: Mapping[str, str] = field(default_factory=dict)
    # Custom headers whose values may be kept with attempts (the rest are write-only).
    public_headers: frozenset[str] = frozenset()
    timeout_s: float = 15.0
    rate_limit_per_s: int | None = None
    # Its attempts carry a `traceparent` header while tracing is on (an operator's opt-in).
    send_traceparent: bool = False


@dataclass(frozen=True)
class AttemptResult:
    """One attempt as it will be stored and judged by the retry policy."""

    started_at: datetime
    duration_ms: int
    status: int | None
    body: bytes
    error: str | None
    error_detail: str | None
    request_headers: dict[str, str]
    retry_after: str | None
    # The answer's headers as kept: bounded, credentials redacted (None: no answer).
    response_headers: dict[str, str] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status is not None and 200 <= self.status <= 299


# An answer's headers are kept for whoever reads the attempt, within these bounds: a partner
# that sends thousands of headers, or huge ones, costs the store nothing more.
MAX_KEPT_RESPONSE_HEADERS = 50
MAX_KEPT_HEADER_VALUE = 512
MAX_KEPT_HEADER_BYTES = 4096


def kept_response_headers(headers: Mapping[str, str] | None) -> dict[str, str] | None:
    """The partner's answer headers as stored with the attempt."""
    if not headers:
        return None
    kept: dict[str, str] = {}
    size = 0
    for name, value in header_rules.redact_response(headers).items():  # type: ignore[union-attr]
        value = value[:MAX_KEPT_HEADER_VALUE]
        size += len(name) + len(value)
        if len(kept) >= MAX_KEPT_RESPONSE_HEADERS or size > MAX_KEPT_HEADER_BYTES:
            break
        kept[name] = value
    return kept


def custom_headers(headers: Mapping[str, Any]) -> dict[str, str]:
    """The endpoint's own headers that may go out: never ours, never with CR/LF.

    The endpoints service refuses reserved names at creation; this second check keeps a stale
    or hand-edited row harmless.
    """
    out: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            continue
        if header_rules.is_reserved(name) or _BAD_VALUE.search(name + value):
            continue
        out[name] = value
    return out


def request_headers(
    event_id: str,
    body: bytes,
    secrets: Sequence[str],
    endpoint_headers: Mapping[str, Any],
    timestamp: int,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Custom headers first, then the signed protocol headers on top (they always win);
    `extra` are Kurir's own per-delivery headers (an ordered delivery's sequence)."""
    headers = custom_headers(endpoint_headers)
    headers.update(build_headers(event_id, timestamp, body, secrets, USER_AGENT))
    if extra:
        headers.update(extra)
    return headers


def attempt(
    transport: Transport,
    target: Target,
    event_id: str,
    body: bytes,
    policy: GuardPolicy,
    *,
    connect_timeout_s: float = 5.0,
    clock: Callable[[], datetime] = utcnow,
    unix_time: Callable[[], float] = time.time,
    extra_headers: Mapping[str, str] | None = None,
) -> AttemptResult:
    """Sign and POST once; network failures come back as values, never as exceptions."""
    started_at = clock()
    headers = request_headers(
        event_id, body, target.secrets, target.headers, int(unix_time()), extra_headers
    )
    result: HttpResult = transport.post(
        target.url,
        body,
        headers,
        float(target.timeout_s),
        policy,
        connect_timeout_s=connect_timeout_s,
    )
    return AttemptResult(
        started_at=started_at,
        duration_ms=result.duration_ms,
        status=result.status,
        body=result.body,
        error=result.error,
        error_detail=result.error_detail,
        request_headers=header_rules.redact_sent(
            result.request_headers or headers, target.headers, target.public_headers
        ),
        retry_after=result.retry_after,
        response_headers=kept_response_headers(result.response_headers),
    )
