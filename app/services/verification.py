"""Endpoint ownership verification: who may answer or renew a challenge, when an endpoint must
verify (again), and what happens to one that never does.

The mechanism (the challenge, the send, holding and releasing deliveries) is
`sender.verification`. The rules here:

- an endpoint created with `verify` (default `KURIR_VERIFY_ENDPOINTS`) starts in
  `pending_verification` and is sent its challenge;
- the challenge is answered by an echo (the send job) or posted by the partner's own
  credentials, its portal or an operator (`confirm`); a wrong one is refused (422
  `challenge_mismatch`) and changes nothing;
- `resend` sends a fresh challenge (the old one stops counting), within the same window;
- a change of the URL's host needs a new verification; a change of path, query or port does
  not (`needs_reverification`);
- an endpoint still unverified `sender.verification.WINDOW` (72 h) after it started is disabled
  with reason `unverified` by `verification_failed`, the one place that decides a verification
  failed (the scheduler's `tick` calls it);
- enabling an endpoint that never verified (disabled as unverified, say) starts a fresh
  verification instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy.orm import Session

from app import operational
from app.clock import isoformat, utcnow
from app.errors import Conflict, ValidationFailed, reject_unknown_fields
from app.models import Endpoint
from app.queues import enqueue_after_commit, try_enqueue_many
from app.registry import endpoints as rules
from app.runtime import Runtime
from app.services import audit, partner_bounds, partners
from app.services.actor import Actor
from app.vocabulary import DisabledBy, EndpointState, OperationalEventType
from sender import health
from sender import verification as mechanism
from sender.dispatch import enqueue_now, job_specs

log = logging.getLogger(__name__)

PENDING_VERIFICATION = EndpointState.PENDING_VERIFICATION
UNVERIFIED = mechanism.UNVERIFIED
WINDOW = mechanism.WINDOW
MISMATCH_CODE = "challenge_mismatch"
NOT_PENDING_CODE = "not_pending_verification"
MAX_CHALLENGE = 200


def _record(
    session: Session, actor: Actor, action: str, endpoint: Endpoint, **details: Any
) -> None:
    audit.record(
        session, actor, action, "endpoint", endpoint.id, partner_id=endpoint.partner_id, **details
    )


def pending(endpoint: Endpoint) -> bool:
    return endpoint.state == PENDING_VERIFICATION


def expires_at(endpoint: Endpoint) -> datetime | None:
    """When a pending endpoint is disabled as unverified (None unless it is pending)."""
    if not pending(endpoint) or endpoint.verification_started_at is None:
        return None
    return endpoint.verification_started_at + WINDOW


@dataclass(frozen=True)
class Status:
    """Where a pending endpoint's challenge stands, for every face."""

    started_at: datetime | None
    expires_at: datetime | None
    challenge_sent_at: datetime | None
    challenge_attempts: int
    next_send_at: datetime | None
    last_error: str | None


def status(endpoint: Endpoint) -> Status | None:
    """None unless the endpoint waits for verification."""
    if not pending(endpoint):
        return None
    return Status(
        started_at=endpoint.verification_started_at,
        expires_at=expires_at(endpoint),
        challenge_sent_at=endpoint.challenge_sent_at,
        challenge_attempts=endpoint.challenge_attempts or 0,
        next_send_at=endpoint.challenge_next_at,
        last_error=endpoint.challenge_error,
    )


def start(session: Session, rt: Runtime, endpoint: Endpoint, now: datetime | None = None) -> None:
    """Wait for verification from now: a fresh challenge, sent once the caller commits."""
    mechanism.begin(endpoint, rt.secret_box, now or utcnow())
    session.flush()
    enqueue_after_commit(session, rt.redis, mechanism.send_specs([endpoint.id]))


def needs_reverification(old_url: str, new_url: str) -> bool:
    """A new host is a new owner to prove; a new path, query or port on the same host is not."""
    return (urlsplit(old_url).hostname or "").lower() != (urlsplit(new_url).hostname or "").lower()


def after_url_change(
    session: Session, rt: Runtime, actor: Actor, endpoint: Endpoint, old_url: str
) -> bool:
    """Start a new verification when a `verify` endpoint's host changed; whether it did.

    A disabled endpoint stays disabled but loses its verification: enabling it starts one.
    """
    if not endpoint.verify or not needs_reverification(old_url, endpoint.url):
        return False
    if endpoint.state == EndpointState.DISABLED:
        endpoint.verified_at = None
        return True
    start(session, rt, endpoint)
    _record(session, actor, "endpoint.verification_started", endpoint, because="host_changed")
    return True


def _endpoint(session: Session, actor: Actor, uid: str, endpoint_id: str) -> Endpoint:
    partner = partners.visible(session, actor, uid, "endpoints:write")
    return rules.get_endpoint(session, partner, endpoint_id)


def _require_pending(endpoint: Endpoint) -> None:
    if not pending(endpoint):
        raise Conflict(
            f"endpoint {endpoint.id} is not waiting for verification (state {endpoint.state})",
            code=NOT_PENDING_CODE,
            details={"endpoint": endpoint.id, "state": endpoint.state},
        )


def confirm(
    session: Session, rt: Runtime, actor: Actor, uid: str, endpoint_id: str, body: dict[str, Any]
) -> Endpoint:
    """The partner proves control by posting the challenge it received: the endpoint is
    enabled and what waited for it is sent, in publish order.

    Raises:
        Conflict: `not_pending_verification`.
        ValidationFailed: `challenge_mismatch` (not the current challenge), `invalid_field`.
    """
    endpoint = _endpoint(session, actor, uid, endpoint_id)
    reject_unknown_fields(body, ("challenge",))
    challenge = body.get("challenge")
    if not isinstance(challenge, str) or not challenge or len(challenge) > MAX_CHALLENGE:
        raise ValidationFailed(
            "challenge must be the string sent in the kurir.endpoint.verify event's data",
            code="invalid_field",
            details={"field": "challenge"},
        )
    _require_pending(endpoint)
    if not mechanism.matches(endpoint, challenge):
        raise ValidationFailed(
            "this is not the endpoint's current challenge: post the one from the latest "
            "kurir.endpoint.verify event, or ask for a new one (POST …/verify/resend)",
            code=MISMATCH_CODE,
            details={"endpoint": endpoint.id},
        )
    now = utcnow()
    released = mechanism.accept(session, endpoint, now, how="api")
    _record(session, actor, "endpoint.verified", endpoint, released=len(released))
    enqueue_after_commit(session, rt.redis, job_specs(released, tag="v"))
    return endpoint


def resend(session: Session, rt: Runtime, actor: Actor, uid: str, endpoint_id: str) -> Endpoint:
    """A fresh challenge, sent now; the window does not restart. A partner's own credentials
    count it as a test event (`KURIR_PARTNER_TEST_SENDS_PER_MINUTE`).

    Raises:
        Conflict: `not_pending_verification`.
        RateLimited: too many from the partner's credentials (429).
    """
    endpoint = _endpoint(session, actor, uid, endpoint_id)
    _require_pending(endpoint)
    partner_bounds.take(rt, actor, endpoint.partner_id, partner_bounds.TEST_SENDS)
    mechanism.issue(endpoint, rt.secret_box, utcnow())
    session.flush()
    _record(session, actor, "endpoint.challenge_resent", endpoint)
    enqueue_after_commit(session, rt.redis, mechanism.send_specs([endpoint.id]))
    return endpoint


def verification_failed(
    session: Session, endpoint: Endpoint, reason: str = UNVERIFIED, now: datetime | None = None
) -> None:
    """An endpoint failed to verify in time: disabled with `reason` (recorded as disabled by
    "verification", which other features tell from a failure or an operator), and what
    waited for it parked as dead letters (`endpoint_disabled`), resendable once it is
    enabled and verified. The one place every verification failure goes through.
    """
    now = now or utcnow()
    started = isoformat(endpoint.verification_started_at)
    endpoint.state = EndpointState.DISABLED
    endpoint.disabled_reason = reason
    endpoint.disabled_at = now
    endpoint.disabled_by = DisabledBy.VERIFICATION
    endpoint.challenge_next_at = None
    session.flush()
    parked = health.park_waiting(session, endpoint.id)
    operational.about_endpoint(
        session,
        OperationalEventType.ENDPOINT_DISABLED,
        endpoint,
        {
            "reason": reason,
            "disabled_by": DisabledBy.VERIFICATION.value,
            "disabled_at": isoformat(now),
            "parked_deliveries": parked,
        },
        now=now,
    )
    operational.about_endpoint(
        session,
        OperationalEventType.ENDPOINT_VERIFICATION_FAILED,
        endpoint,
        {"reason": reason, "requested_at": started, "failed_at": isoformat(now)},
        now=now,
    )
    _record(session, Actor.system(), "endpoint.disabled", endpoint, reason=reason)
    log.warning(
        "endpoint disabled: verification failed",
        extra={"endpoint_id": endpoint.id, "reason": reason, "parked": parked},
    )


def park_held(session: Session, endpoint: Endpoint) -> int:
    """What waited for a pending endpoint that is disabled or deleted becomes dead letters."""
    return health.park_waiting(session, endpoint.id)


def tick(rt: Runtime, now: datetime | None = None) -> dict[str, int]:
    """The scheduler's pass: disable what stayed unverified past its window, enqueue the
    challenges due (first sends Redis lost, retries), release deliveries a race left held."""
    now = now or utcnow()
    with rt.db.begin() as session:
        expired = mechanism.expired(session, now)
        for endpoint in expired:
            verification_failed(session, endpoint, UNVERIFIED, now)
    with rt.db.begin() as session:
        due = mechanism.due_sends(session, now)
        released: list[str] = []
        for endpoint_id in mechanism.stranded(session):
            released += mechanism.release_held(session, endpoint_id, now)
    enqueue_now(rt.redis, released, tag="v")
    if due:
        try_enqueue_many(rt.redis, mechanism.send_specs(due))
    return {"expired": len(expired), "sent": len(due), "released": len(released)}
