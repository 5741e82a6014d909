"""Kurir's error hierarchy, flat on purpose; the API maps each to `{"error": {...}}`.

KurirError (500 internal_error)
├── BadRequest            400 bad_request / invalid_json
├── Unauthorized          401 unauthorized
├── Forbidden             403 forbidden
├── NotFound              404 not_found
├── Conflict              409 conflict / idempotency_key_in_flight
├── Gone                  410 gone / cursor_expired
├── PayloadTooLarge       413 payload_too_large
├── UnsupportedMediaType  415 unsupported_media_type
├── ValidationFailed      422 validation_failed / idempotency_key_reused / ...
├── RateLimited           429 rate_limited
└── Unavailable           503 unavailable

An error that knows when trying again makes sense carries `retry_after_s`; the faces send it
as a `Retry-After` header.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any


class KurirError(Exception):
    """Base of every error the API turns into a JSON answer."""

    status = 500
    code = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        details: Any = None,
        status: int | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


class BadRequest(KurirError):
    status = 400
    code = "bad_request"


class Unauthorized(KurirError):
    status = 401
    code = "unauthorized"


class Forbidden(KurirError):
    status = 403
    code = "forbidden"


class NotFound(KurirError):
    status = 404
    code = "not_found"


class Conflict(KurirError):
    status = 409
    code = "conflict"


class Gone(KurirError):
    status = 410
    code = "gone"


class PayloadTooLarge(KurirError):
    status = 413
    code = "payload_too_large"

    @classmethod
    def over(cls, limit: int) -> PayloadTooLarge:
        """The one answer for every body over a limit, which it names."""
        return cls(f"request body exceeds the limit of {limit} bytes", details={"limit": limit})


class UnsupportedMediaType(KurirError):
    status = 415
    code = "unsupported_media_type"


class ValidationFailed(KurirError):
    status = 422
    code = "validation_failed"


class RateLimited(KurirError):
    status = 429
    code = "rate_limited"


class Unavailable(KurirError):
    status = 503
    code = "unavailable"


def reject_unknown_fields(
    body: Mapping[str, object], allowed: Collection[str], code: str = "unknown_field"
) -> None:
    """Refuse a request body that carries a field this operation does not know: a typo must
    be an error, not a silently ignored setting.

    Raises:
        ValidationFailed: `unknown_field` (or `code`), naming the fields.
    """
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise ValidationFailed(
            f"unknown field(s): {', '.join(unknown)}", code=code, details={"fields": unknown}
        )
