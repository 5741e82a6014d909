"""The endpoint ownership challenge: an endpoint created with `verify: true` is sent a signed
`kurir.endpoint.verify` event carrying a random `challenge`, and nothing else until it proves
it controls its URL by answering it.

It answers by echoing `{"challenge": "<the same>"}` in a 2xx body, or (a receiver that cannot
echo) by posting the challenge to `POST /v1/partners/{uid}/endpoints/{id}/verify`, which
`app.services.verification` checks with `matches`. Meanwhile its deliveries are written as
usual but *held*: `pending` with no `next_attempt_at`, so neither the queue nor the sweeper
ever offers them to the claim (which would not take them: the endpoint is not enabled). `accept`
enables the endpoint and `release_held` makes them due, in publish order.

The challenge goes out as the job `kurir.endpoint.send_challenge` (`send_challenge_job`):
one signed POST, like a delivery's (the endpoint's keys, custom headers, timeout and the SSRF
guard), outside the delivery engine, since the endpoint is not enabled. The job claims the
send with a compare-and-set on `challenge_next_at`, so a duplicate job sends nothing. A failed
send (no answer, not 2xx) is tried again after `RETRY_SCHEDULE_S` (the last step repeated):
the scheduler enqueues the sends that are due (`due_sends`). A 2xx that does not echo ends the
sends: the receiver got the challenge and is expected to post it. The challenge is stored as
its SHA-256 (checked against answers) and encrypted (sent again by retries).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app import runtime as runtime_mod
from app.clock import isoformat, utcnow
from app.crypto import SecretBox
from app.models import PENDING, RETRYING, Delivery, Endpoint, OperationalEvent, Partner
from app.net import guard
from app.net.http import Transport
from app.queues import DEFAULT, SEND_CHALLENGE, JobSpec
from app.runtime import Runtime
from app.vocabulary import EndpointState
from sender.deliver import attempt
from sender.dispatch import enqueue_now
from sender.engine.sql import chunks
from sender.engine.targets import TargetReader
from sender.engine.work import Unsendable

log = logging.getLogger(__name__)

EVENT_TYPE = "kurir.endpoint.verify"
EVENT_VERSION = 1
# How long an endpoint may stay unverified before it is disabled (reason `unverified`).
WINDOW = timedelta(hours=72)
# Seconds before each new try of a challenge that did not reach the endpoint; the last repeats.
RETRY_SCHEDULE_S: tuple[int, ...] = (10, 60, 300, 1800, 3600, 3 * 3600, 6 * 3600)
# A send's claim: long enough for the longest timeout; a send that died is tried again after.
SEND_LEASE_S = 90
CHALLENGE_BYTES = 24
UNVERIFIED = "unverified"
NO_ECHO = "answered 2xx without echoing the challenge: post it to the verify route"


def new_challenge() -> str:
    """A random challenge, URL-safe so it can be pasted anywhere."""
    return secrets.token_urlsafe(CHALLENGE_BYTES)


def challenge_hash(challenge: str) -> str:
    return hashlib.sha256(challenge.encode("utf-8")).hexdigest()


def matches(endpoint: Endpoint, challenge: Any) -> bool:
    """Whether `challenge` is the endpoint's current one (constant time)."""
    if not isinstance(challenge, str) or endpoint.challenge_hash is None:
        return False
    return hmac.compare_digest(challenge_hash(challenge), endpoint.challenge_hash)


def echoed(body: bytes, challenge: str) -> bool:
    """Whether a response body is JSON `{"challenge": challenge, ...}`."""
    try:
        answer = json.loads(body)
    except ValueError:
        return False
    value = answer.get("challenge") if isinstance(answer, dict) else None
    return isinstance(value, str) and hmac.compare_digest(
        value.encode("utf-8"), challenge.encode("utf-8")
    )


def next_try(tries: int, now: datetime) -> datetime:
    """When a challenge sent `tries` times without reaching the endpoint goes out again."""
    step = RETRY_SCHEDULE_S[min(max(tries, 1), len(RETRY_SCHEDULE_S)) - 1]
    return now + timedelta(seconds=step)


def send_specs(endpoint_ids: Sequence[str]) -> list[JobSpec]:
    """The send jobs, ids only; enqueue them after commit."""
    return [JobSpec(DEFAULT, SEND_CHALLENGE, (endpoint_id,)) for endpoint_id in endpoint_ids]


def issue(endpoint: Endpoint, box: SecretBox, now: datetime) -> None:
    """A fresh challenge, due to be sent now (the previous one no longer counts)."""
    challenge = new_challenge()
    endpoint.challenge_hash = challenge_hash(challenge)
    endpoint.challenge_encrypted = box.encrypt(challenge)
    endpoint.challenge_sent_at = None
    endpoint.challenge_attempts = 0
    endpoint.challenge_next_at = now
    endpoint.challenge_error = None


def begin(endpoint: Endpoint, box: SecretBox, now: datetime) -> None:
    """Put the endpoint in `pending_verification` with a fresh challenge and a fresh window
    (a new endpoint, a changed host, an unverified endpoint enabled again)."""
    endpoint.state = EndpointState.PENDING_VERIFICATION
    endpoint.disabled_reason = None
    endpoint.disabled_at = None
    endpoint.disabled_by = None
    endpoint.verified_at = None
    endpoint.verification_started_at = now
    issue(endpoint, box, now)


VERIFIED_EVENT = "endpoint.verified"


def accept(session: Session, endpoint: Endpoint, now: datetime, how: str) -> list[str]:
    """The endpoint answered (`how`: "echo" or "api"): enable it and release what waited for
    it. Returns the released delivery ids in publish order, to enqueue after commit
    (`sender.dispatch.job_specs`)."""
    endpoint.state = EndpointState.ENABLED
    endpoint.verified_at = now
    endpoint.challenge_hash = None
    endpoint.challenge_encrypted = None
    endpoint.challenge_next_at = None
    endpoint.challenge_error = None
    endpoint.consecutive_failures = 0
    endpoint.first_failure_at = None
    session.add(
        OperationalEvent(
            kind=VERIFIED_EVENT, subject_id=endpoint.id, created_at=now, data={"by": how}
        )
    )
    session.flush()
    return release_held(session, endpoint.id, now)


def release_held(session: Session, endpoint_id: str, now: datetime) -> list[str]:
    """Make the endpoint's held deliveries due now; their ids in publish order."""
    ids = list(
        session.scalars(
            select(Delivery.id)
            .where(
                Delivery.endpoint_id == endpoint_id,
                Delivery.state.in_((PENDING, RETRYING)),
                Delivery.next_attempt_at.is_(None),
            )
            .order_by(Delivery.id)
        )
    )
    for chunk in chunks(ids):
        session.execute(
            update(Delivery)
            .where(Delivery.id.in_(chunk), Delivery.next_attempt_at.is_(None))
            .values(next_attempt_at=now, lease_expires_at=None, updated_at=now)
            .execution_options(synchronize_session=False)
        )
    return ids


def stranded(session: Session, limit: int = 1000) -> list[str]:
    """Endpoints sent to again whose held deliveries were not released (a hold that raced a
    verification): the scheduler releases them."""
    return list(
        session.scalars(
            select(Delivery.endpoint_id)
            .join(Endpoint, Endpoint.id == Delivery.endpoint_id)
            .where(
                Delivery.state.in_((PENDING, RETRYING)),
                Delivery.next_attempt_at.is_(None),
                Endpoint.state == EndpointState.ENABLED,
            )
            .distinct()
            .limit(limit)
        )
    )


def due_sends(session: Session, now: datetime, limit: int = 1000) -> list[str]:
    """Endpoints waiting for verification whose challenge is due to be (re)sent."""
    return list(
        session.scalars(
            select(Endpoint.id)
            .where(
                Endpoint.state == EndpointState.PENDING_VERIFICATION,
                Endpoint.deleted_at.is_(None),
                Endpoint.challenge_next_at <= now,
            )
            .order_by(Endpoint.challenge_next_at)
            .limit(limit)
        )
    )


def expired(session: Session, now: datetime, limit: int = 1000) -> list[Endpoint]:
    """Endpoints still unverified when their window ended."""
    return list(
        session.scalars(
            select(Endpoint)
            .where(
                Endpoint.state == EndpointState.PENDING_VERIFICATION,
                Endpoint.deleted_at.is_(None),
                Endpoint.verification_started_at <= now - WINDOW,
            )
            .order_by(Endpoint.verification_started_at)
            .limit(limit)
        )
    )


# ---------------------------------------------------------------------------- the send


@dataclass(frozen=True)
class Sent:
    """What one send did: `verified` (echoed), `reached` (2xx without an echo), else failed."""

    endpoint_id: str
    verified: bool
    reached: bool
    status: int | None
    error: str | None
    released: tuple[str, ...] = ()


def body_of(
    event_id: str, partner_uid: str, endpoint_id: str, challenge: str, now: datetime
) -> bytes:
    """The envelope of every Kurir event, with the challenge in `data`."""
    return json.dumps(
        {
            "id": event_id,
            "type": EVENT_TYPE,
            "version": EVENT_VERSION,
            "occurred_at": isoformat(now),
            "partner": partner_uid,
            "resource": None,
            "correlation_id": None,
            "data": {"challenge": challenge, "endpoint": endpoint_id},
        },
        separators=(",", ":"),
    ).encode("utf-8")


def send(
    runtime: Runtime,
    endpoint_id: str,
    *,
    now: datetime | None = None,
    transport: Transport | None = None,
) -> Sent | None:
    """Send the endpoint's challenge once, if it is due, and record what came back; None when
    there was nothing to send (verified, disabled, not due, or claimed by another job)."""
    now = now or utcnow()
    settings = runtime.settings
    with runtime.db.begin() as session:
        endpoint = session.get(Endpoint, endpoint_id)
        if (
            endpoint is None
            or endpoint.deleted_at is not None
            or endpoint.state != EndpointState.PENDING_VERIFICATION
            or endpoint.challenge_encrypted is None
            or endpoint.challenge_next_at is None
            or endpoint.challenge_next_at > now
        ):
            return None
        claimed = session.execute(
            update(Endpoint)
            .where(
                Endpoint.id == endpoint_id,
                Endpoint.challenge_next_at == endpoint.challenge_next_at,
                Endpoint.challenge_hash == endpoint.challenge_hash,
            )
            .values(challenge_next_at=now + timedelta(seconds=SEND_LEASE_S))
            .returning(Endpoint.id)
            .execution_options(synchronize_session=False)
        ).first()
        if claimed is None:
            return None
        fence = endpoint.challenge_hash
        challenge = runtime.secret_box.decrypt(endpoint.challenge_encrypted)
        partner_uid = session.get_one(Partner, endpoint.partner_id).uid
        reader = TargetReader(lambda: runtime.secret_box, settings.default_timeout_s)
        found, unsendable = reader.read(session, {endpoint_id}, now)
    target = found.get(endpoint_id)
    problem: Unsendable | None = unsendable.get(endpoint_id)
    status: int | None = None
    error: str | None = None
    ok = verified = False
    sent_at = now
    if target is None or problem is not None:
        error = problem.detail if problem is not None else "endpoint not found"
    else:
        event_id = "evt_verify_" + (fence or "")[:24]
        body = body_of(event_id, partner_uid, endpoint_id, challenge, now)
        own = transport is None
        transport = transport or Transport(pool_maxsize=1, max_sessions=1, resolver_threads=1)
        try:
            result = attempt(
                transport,
                target,
                event_id,
                body,
                guard.policy_from(settings),
                connect_timeout_s=settings.connect_timeout_s,
            )
        finally:
            if own:
                transport.close()
        status, ok, sent_at = result.status, result.ok, result.started_at
        verified = ok and echoed(result.body, challenge)
        if not ok:
            error = result.error or f"HTTP {status}"
    return _record(runtime, endpoint_id, fence, now, sent_at, status, error, ok, verified)


def _record(
    runtime: Runtime,
    endpoint_id: str,
    fence: str | None,
    now: datetime,
    sent_at: datetime,
    status: int | None,
    error: str | None,
    ok: bool,
    verified: bool,
) -> Sent:
    released: list[str] = []
    with runtime.db.begin() as session:
        endpoint = session.get(Endpoint, endpoint_id, with_for_update=True)
        current = (
            endpoint is not None
            and endpoint.state == EndpointState.PENDING_VERIFICATION
            and endpoint.challenge_hash == fence
        )
        if endpoint is not None and current:
            endpoint.challenge_attempts = (endpoint.challenge_attempts or 0) + 1
            endpoint.challenge_sent_at = sent_at
            if verified:
                released = accept(session, endpoint, now, how="echo")
                log.info("endpoint verified by echo", extra={"endpoint_id": endpoint_id})
            elif ok:
                endpoint.challenge_next_at = None
                endpoint.challenge_error = NO_ECHO
            else:
                endpoint.challenge_next_at = next_try(endpoint.challenge_attempts, now)
                endpoint.challenge_error = (error or "failed")[:200]
                log.warning(
                    "verification challenge not delivered",
                    extra={"endpoint_id": endpoint_id, "status": status, "error": error},
                )
    if released:
        enqueue_now(runtime.redis, released, tag="v")
    return Sent(endpoint_id, verified, ok and not verified, status, error, tuple(released))


def send_challenge_job(endpoint_id: str) -> None:
    """RQ entry point (`kurir.endpoint.send_challenge`): ids only in."""
    send(runtime_mod.current(), endpoint_id)
