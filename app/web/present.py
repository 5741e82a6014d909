"""Turning stored rows into what an operator or a partner may see: secrets hidden, JSON made
readable. Both faces render through these, so neither can show more than the other."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from app import headers as header_rules
from app.clock import utcnow

if TYPE_CHECKING:
    from app.services.deliveries import Sent

HIDDEN = "•••••• (hidden)"


@dataclass(frozen=True)
class ShownHeader:
    name: str
    value: str
    hidden: bool


def shown_headers(headers: dict[str, object] | None) -> list[ShownHeader]:
    """Request headers as stored, minus the value of anything that could authenticate (rows
    stored before custom values became write-only may still hold one)."""
    out = []
    for name, value in (headers or {}).items():
        if header_rules.is_sensitive(name) or value == header_rules.REDACTED:
            out.append(ShownHeader(name, HIDDEN, True))
        else:
            out.append(ShownHeader(name, str(value), False))
    return out


def endpoint_headers(
    headers: dict[str, object] | None, public: list[str] | None
) -> list[ShownHeader]:
    """An endpoint's custom headers: every name, values only for the public ones."""
    return [
        ShownHeader(name, HIDDEN, True) if value is None else ShownHeader(name, str(value), False)
        for name, value in header_rules.redact_custom(headers or {}, public).items()
    ]


def pretty_json(raw: str | bytes | None) -> str:
    """Indented JSON when it parses, else the text as is (bytes decoded leniently)."""
    if raw is None:
        return ""
    text = (
        bytes(raw).decode("utf-8", errors="replace")
        if isinstance(raw, bytes | bytearray | memoryview)
        else raw
    )
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except (ValueError, TypeError):
        return text


@dataclass(frozen=True)
class BodyView:
    """A delivery's body as a page shows it: the exact text it sent (the bytes the endpoint
    received and checked the signature over, decoded, never re-serialised), and beside it an
    indented copy for reading, which is not what was sent."""

    version: int
    published_version: int
    raw: str | None  # None: the stored body is gone
    pretty: str
    size: int  # bytes


def body_view(sent: Sent) -> BodyView:
    body = sent.body
    # Bodies are stored as text and sent UTF-8 encoded, so decoding gives back that text.
    raw = None if body is None else body.decode("utf-8", errors="replace")
    return BodyView(
        sent.version,
        sent.published_version,
        raw,
        pretty_json(body),
        0 if body is None else len(body),
    )


def ago(moment: datetime | None, now: datetime | None = None) -> str:
    """'3 min ago' style, for scanning a list; the exact time goes in a tooltip."""
    if moment is None:
        return "never"
    delta = (now or utcnow()) - moment
    future = delta < timedelta(0)
    seconds = int(abs(delta.total_seconds()))
    if seconds < 60:
        text = f"{seconds} s"
    elif seconds < 3600:
        text = f"{seconds // 60} min"
    elif seconds < 86400:
        text = f"{seconds // 3600} h"
    else:
        text = f"{seconds // 86400} d"
    return f"in {text}" if future else f"{text} ago"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass(frozen=True)
class AttemptView:
    """One attempt as a page shows it: what was sent (minus credentials), what came back."""

    row: Any  # app.models.Attempt
    request_headers: list[ShownHeader]
    response_headers: list[ShownHeader] | None  # None: not kept for this attempt
    body: str

    @property
    def ok(self) -> bool:
        status = self.row.response_status
        return self.row.error is None and status is not None and 200 <= status <= 299


def attempt_views(attempts: Iterable[Any]) -> list[AttemptView]:
    return [
        AttemptView(
            a,
            shown_headers(a.request_headers),
            None if a.response_headers is None else shown_headers(a.response_headers),
            pretty_json(a.response_body),
        )
        for a in attempts
    ]
