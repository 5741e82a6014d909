"""Vetting a URL our workers will call (an endpoint's, a source's pull API): one rule for all.

The SSRF verdict is made here, when the URL is configured, and again by the transport at every
request. A host that does not resolve (yet) is accepted, as Svix and Stripe do: DNS that is
not live yet or a resolver hiccup must not block a registration, and nothing can be sent to
it before a request resolves it and the guard vets the answer.
"""

from __future__ import annotations

import logging
from typing import Any

from app import headers as header_rules
from app.config import Settings
from app.errors import ValidationFailed
from app.net import guard

log = logging.getLogger(__name__)

MAX_URL_LENGTH = 2048


def _invalid(field: str, message: str, **details: Any) -> ValidationFailed:
    return ValidationFailed(message, code="invalid_url", details={"field": field, **details})


def check_outbound_url(
    value: Any,
    field: str,
    settings: Settings,
    resolver: guard.Resolver = guard.default_resolver,
    *,
    credentials_hint: str = "",
) -> str:
    """`value` if Kurir may call it; `field` names it in the refusal, `credentials_hint` says
    where credentials go instead (where the caller has such a place).

    Raises:
        ValidationFailed: `invalid_url` (not a string, longer than `MAX_URL_LENGTH`, carrying
            credentials, bad syntax or scheme, https required) or `blocked_address` (an
            internal target); `details.field` is `field`.
    """
    if not isinstance(value, str) or not value:
        raise _invalid(field, f"{field} is required and must be a string")
    if len(value) > MAX_URL_LENGTH:
        raise _invalid(field, f"{field} is longer than {MAX_URL_LENGTH} characters")
    if header_rules.has_userinfo(value):
        # It would be shown and stored wherever the URL is (attempts, logs); a header is not.
        raise _invalid(
            field,
            f"{field} must not carry credentials (user:password@host)"
            + (f": {credentials_hint}" if credentials_hint else ""),
            reason="userinfo",
        )
    try:
        guard.check_url(value, guard.policy_from(settings), resolver)
    except guard.InvalidURL as exc:
        raise _invalid(field, f"{field} is not acceptable: {exc}") from None
    except guard.BlockedAddress as exc:
        raise ValidationFailed(
            f"{field} targets a blocked address: {exc.reason}",
            code="blocked_address",
            details={"field": field, "reason": exc.reason},
        ) from None
    except guard.ResolutionError as exc:
        log.info("%s host does not resolve yet: %s", field, exc)
    return value
