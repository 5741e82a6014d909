"""Every list of header names Kurir keeps, in one place, so no two of them can disagree.

- **Reserved**: what Kurir sets on each webhook (the Standard Webhooks headers, the user agent,
  the W3C trace context) and HTTP framing. An endpoint's custom headers may never set or
  override them; the endpoints service refuses them, and the sender drops them again from a
  stale or hand-edited row.
- **Sensitive**: names that carry credentials by convention (`Authorization`, cookies, API
  keys, tokens...). Their values are never shown from stored rows whose origin we do not know
  (old attempt records), whatever an endpoint says.
- **Inbound redacted**: what is not kept with a received callback: the credentials of the
  caller and the scheme's signature header (a stored signature with its stored body would be a
  request anyone reading the event could replay).

Endpoint custom header values are write-only unless their creator listed them as public; see
`redact_custom`. Credentials written into a URL (`user:password@host`) are the same kind of
secret in another place: `redact_url` hides them wherever a URL is shown.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REDACTED = "[redacted]"

# What an ordered endpoint's deliveries carry besides the Standard Webhooks headers: the
# delivery's place in its key (gap-free from 1) and the webhook-id of the one before it.
SEQUENCE_HEADER = "webhook-sequence"
PREVIOUS_ID_HEADER = "webhook-previous-id"

# Set by Kurir on every webhook, or framing that a custom header must not touch.
RESERVED = frozenset(
    {
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "user-agent",
        "content-type",
        "content-length",
        "host",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "expect",
        # W3C trace context: Kurir's own, sent only to endpoints with `send_traceparent`.
        "traceparent",
        "tracestate",
    }
)
RESERVED_PREFIXES = ("webhook-",)

# Credentials by exact name, or by a telling part of the name.
SENSITIVE_NAMES = frozenset(
    {"authorization", "proxy-authorization", "cookie", "set-cookie", "webhook-signature"}
)
SENSITIVE_PARTS = (
    "auth",
    "token",
    "secret",
    "signature",
    "password",
    "passwd",
    "key",
    "session",
    "cookie",
    "credential",
    "bearer",
)

# Never kept with an inbound callback, whatever its source.
INBOUND_CREDENTIALS = frozenset({"authorization", "proxy-authorization", "cookie"})
# The header each inbound scheme signs with.
SCHEME_SIGNATURES: dict[str, frozenset[str]] = {
    "standard-webhooks": frozenset({"webhook-signature", "svix-signature"}),
    "stripe": frozenset({"stripe-signature"}),
    "github": frozenset({"x-hub-signature-256", "x-hub-signature"}),
    "shopify": frozenset({"x-shopify-hmac-sha256"}),
}


def is_reserved(name: str) -> bool:
    lower = name.lower()
    return lower in RESERVED or lower.startswith(RESERVED_PREFIXES)


def is_sensitive(name: str) -> bool:
    lower = name.strip().lower()
    return lower in SENSITIVE_NAMES or any(part in lower for part in SENSITIVE_PARTS)


def inbound_redacted(scheme: str | None) -> frozenset[str]:
    """Lower-case names whose values are not stored with a callback of this scheme."""
    return INBOUND_CREDENTIALS | SCHEME_SIGNATURES.get(scheme or "", frozenset())


def public_names(names: Iterable[Any] | None) -> frozenset[str]:
    return frozenset(str(n).lower() for n in names or ())


def redact_custom(headers: Mapping[str, Any], public: Iterable[Any] | None) -> dict[str, Any]:
    """An endpoint's custom headers as a reader may see them: a value is shown only when its
    creator listed the header as public; otherwise the name is kept and the value is None.
    """
    shown = public_names(public)
    return {
        name: (value if name.lower() in shown else None) for name, value in (headers or {}).items()
    }


def redact_sent(
    headers: Mapping[str, str], custom: Iterable[str], public: Iterable[Any] | None
) -> dict[str, str]:
    """The request headers of an attempt as stored: the endpoint's custom header values are
    write-only unless public; Kurir's own headers are kept (they hold no credential: the
    signature is per attempt, and the secret never leaves the worker).
    """
    custom_names = public_names(custom)
    shown = public_names(public)
    return {
        name: (REDACTED if name.lower() in custom_names and name.lower() not in shown else value)
        for name, value in headers.items()
    }


def has_userinfo(url: str) -> bool:
    """Whether the URL names a user or password (`https://user:pw@host/`)."""
    try:
        return "@" in (urlsplit(url).netloc or "")
    except ValueError:
        return False


def redact_url(url: str | None) -> str | None:
    """The URL with any `user:password@` replaced by the redaction mark."""
    if not url or not has_userinfo(url):
        return url
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{REDACTED}@{host}"))


def redact_response(headers: Mapping[str, Any] | None) -> dict[str, str] | None:
    """A partner's answer headers as anyone may see them: a value that could authenticate
    (`Set-Cookie`, tokens...) is replaced by the redaction mark."""
    if headers is None:
        return None
    return {
        str(name): (REDACTED if is_sensitive(str(name)) else str(value))
        for name, value in headers.items()
    }
