"""Idempotency keys: a publish retried with its key gets the first answer, never a second event.

The key, the request's hash and the answer are written first in the publish's own transaction
(`app.intake.publish.publish_in_transaction`), so a concurrent twin waits on the unique index
and then reads the answer; the same key with another body or partner is refused. Keys are
forgotten after their lifetime by the scheduler (`purge_expired`).
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, delete, select
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from app import event_types
from app.clock import utcnow
from app.errors import BadRequest, ValidationFailed
from app.intake.envelope import PublishResult
from app.models import IdempotencyKey
from app.runtime import Runtime

MAX_IDEMPOTENCY_KEY = 255
# How long a keyed request waits behind an unfinished twin (PostgreSQL) before answering 409.
IN_FLIGHT_WAIT_MS = 5000
_PG_LOCK_NOT_AVAILABLE = "55P03"
_PG_UNIQUE_VIOLATION = "23505"


IDEMPOTENCY_KEYS = cast(Table, IdempotencyKey.__table__)


def request_hash(partner_uid: str, body: dict[str, Any]) -> str:
    """Same key + same (canonical) body + same partner is a retry; anything else is reuse."""
    material = partner_uid + "\n" + event_types.canonical_json(body)
    return hashlib.sha256(material.encode()).hexdigest()


def check_idempotency_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not key or len(key) > MAX_IDEMPOTENCY_KEY:
        raise BadRequest(
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters",
            code="invalid_idempotency_key",
        )
    return key


def stored_response(
    session: Session, api_key_id: str, key: str, digest: str, now: datetime
) -> PublishResult | None:
    row = session.execute(
        select(
            IdempotencyKey.request_hash,
            IdempotencyKey.response_status,
            IdempotencyKey.response_body,
            IdempotencyKey.expires_at,
            IdempotencyKey.id,
        ).where(IdempotencyKey.api_key_id == api_key_id, IdempotencyKey.key == key)
    ).first()
    if row is None:
        return None
    stored_hash, status, body, expires_at, row_id = row
    if expires_at <= now:
        session.execute(delete(IdempotencyKey).where(IdempotencyKey.id == row_id))
        return None
    if stored_hash != digest:
        raise ValidationFailed(
            "this Idempotency-Key was already used for a different request (another body or "
            "another partner)",
            code="idempotency_key_reused",
            details={"idempotency_key": key},
        )
    return PublishResult(status=status, body=body, replayed=True)


def lock_timed_out(exc: Exception) -> bool:
    return isinstance(exc, OperationalError) and (
        getattr(exc.orig, "sqlstate", None) == _PG_LOCK_NOT_AVAILABLE
    )


def unique_violation(exc: Exception) -> bool:
    if not isinstance(exc, IntegrityError):
        return False
    return getattr(
        exc.orig, "sqlstate", None
    ) == _PG_UNIQUE_VIOLATION or "UNIQUE constraint failed" in str(exc.orig)


def purge_expired(runtime: Runtime) -> int:
    """Forget idempotency keys past their ≥ 24 h lifetime."""
    with runtime.db.begin() as session:
        result = session.execute(delete(IdempotencyKey).where(IdempotencyKey.expires_at < utcnow()))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]
