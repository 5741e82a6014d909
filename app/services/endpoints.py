"""Endpoints: what every face may do to a partner's endpoint, validated and audited once.

The rules of a valid endpoint (URL and SSRF verdict, headers, subscriptions, limits, secrets)
live in `app.registry.endpoint_fields`, applied by `app.registry.endpoints`; this module
decides who may apply them, records every change in the audit trail, and writes the
operational events the operator pages build on (`endpoint.enabled` remembers when the endpoint
had been disabled, so its parked letters can be found again).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from app import operational, secret_ring
from app import runtime as runtime_mod
from app.clock import isoformat, parse_rfc3339, utcnow
from app.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    ValidationFailed,
    reject_unknown_fields,
)
from app.intake.kurir_test import send_test_event
from app.models import (
    DISABLED_BY_OPERATOR,
    DISABLED_BY_PARTNER,
    DL_OPEN,
    RETRYING,
    Attempt,
    DeadLetter,
    Delivery,
    Endpoint,
    EndpointProbe,
    EndpointSecret,
    OperationalEvent,
    Partner,
    ResendJob,
)
from app.pagination import paginate
from app.queues import enqueue_after_commit
from app.recovery import due as recovery_due
from app.recovery import jobs as recovery_jobs
from app.recovery import recover as recovery
from app.registry import endpoints as rules
from app.registry import keys as signing_keys
from app.runtime import Runtime
from app.services import audit, dead_letters, partner_bounds, partners, verification
from app.services.actor import Actor, shown_to
from app.vocabulary import EndpointMode, EndpointState, OnDead, OperationalEventType
from dlq.search import DeadLetterFilter
from sender import ordering
from sender.dispatch import job_specs

# The faces know these two words by these names (`app.vocabulary` is their home).
ENABLED, DISABLED = EndpointState.ENABLED, EndpointState.DISABLED
EndpointWithSecret = rules.EndpointWithSecret


def _not_found(endpoint_id: str) -> NotFound:
    return NotFound(f"endpoint {endpoint_id!r} does not exist", details={"endpoint": endpoint_id})


def _record(
    session: Session, actor: Actor, action: str, endpoint: Endpoint, **details: Any
) -> None:
    audit.record(
        session, actor, action, "endpoint", endpoint.id, partner_id=endpoint.partner_id, **details
    )


def _own(actor: Actor, endpoint: Endpoint, scope: str) -> None:
    """An action on an endpoint object: the actor's scope, and (bound actors) its partner."""
    actor.require(scope)
    if endpoint.deleted_at is not None or not actor.may_see_partner(endpoint.partner_id):
        raise _not_found(endpoint.id)


def live(
    session: Session, actor: Actor, uid: str, endpoint_id: str, scope: str = "read"
) -> Endpoint:
    """The live endpoint `endpoint_id` of partner `uid`, if the actor may touch it (a deleted
    one is not found here; `by_id` reads those too)."""
    partner = partners.visible(session, actor, uid, scope)
    return rules.get_endpoint(session, partner, endpoint_id)


def by_id(session: Session, actor: Actor, endpoint_id: str, scope: str = "read") -> Endpoint:
    """An endpoint by id alone (operator pages link them so), deleted ones included."""
    actor.require(scope)
    endpoint = session.get(Endpoint, endpoint_id)
    if endpoint is None or not actor.may_see_partner(endpoint.partner_id):
        raise _not_found(endpoint_id)
    return endpoint


def page(
    session: Session,
    actor: Actor,
    uid: str | None,
    *,
    state: str | None = None,
    limit: int,
    cursor: str | None,
) -> tuple[list[Endpoint], str | None]:
    """Live endpoints, newest first, of one partner (or of every visible one when `uid` is
    None)."""
    if uid is not None:
        partner = partners.visible(session, actor, uid)
        stmt = rules.live_endpoints_query(partner)
    else:
        actor.require("read")
        stmt = select(Endpoint).where(Endpoint.deleted_at.is_(None))
        if actor.partner_id is not None:
            stmt = stmt.where(Endpoint.partner_id == actor.partner_id)
    if state:
        stmt = stmt.where(Endpoint.state == state)
    return paginate(session, stmt, Endpoint.id, limit=limit, cursor=cursor)


def any_exist(session: Session, actor: Actor) -> bool:
    """Whether any endpoint was ever made (deleted ones count), to tell an empty install
    from a filter that matches nothing."""
    actor.require("read")
    stmt = select(Endpoint.id)
    if actor.partner_id is not None:
        stmt = stmt.where(Endpoint.partner_id == actor.partner_id)
    return session.scalar(stmt.limit(1)) is not None


def operational_events(
    session: Session, actor: Actor, endpoint: Endpoint, *, limit: int
) -> list[OperationalEvent]:
    """What happened to the endpoint (disabled, enabled, secret rotated...), newest first;
    a deleted endpoint's too."""
    actor.require("read")
    if not actor.may_see_partner(endpoint.partner_id):
        raise _not_found(endpoint.id)
    return list(
        session.scalars(
            select(OperationalEvent)
            .where(OperationalEvent.subject_id == endpoint.id)
            .order_by(OperationalEvent.id.desc())
            .limit(limit)
        )
    )


OPERATOR_ONLY_CODE = "operator_only_field"


def _trace_opt_in(actor: Actor, body: dict[str, Any], current: bool = False) -> None:
    """Sending the publisher's trace ids to a partner is its operators' decision: a partner's
    own credentials may not turn `send_traceparent` on (sending the value it has is fine).

    Raises:
        Forbidden: `operator_only_field`.
    """
    if actor.bound_to_partner and body.get("send_traceparent") is True and not current:
        raise Forbidden(
            "send_traceparent is set by the publisher's operators only",
            code=OPERATOR_ONLY_CODE,
            details={"field": "send_traceparent"},
        )


def create(
    session: Session, rt: Runtime, actor: Actor, uid: str, body: dict[str, Any]
) -> EndpointWithSecret:
    """A new endpoint with its first secret, within the partner's bounds.

    Raises:
        RateLimited: the partner's own credentials created endpoints too fast (429).
        ValidationFailed: `endpoint_limit` (the partner has as many as it may), or what
            the endpoint's rules refuse.
    """
    partner = partners.visible(session, actor, uid, "endpoints:write")
    _trace_opt_in(actor, body)
    partner_bounds.take(rt, actor, partner.id, partner_bounds.CREATES)
    partner_bounds.check_endpoint_room(session, rt.settings, partner)
    created = rules.create_endpoint(session, partner, body, rt.settings, rt.secret_box)
    endpoint = created.endpoint
    if endpoint.verify:
        # Nothing but the challenge is sent until it proves it controls its URL.
        verification.start(session, rt, endpoint)
    _record(
        session,
        actor,
        "endpoint.created",
        endpoint,
        url=endpoint.url,
        event_types=endpoint.event_types,
        headers=sorted(endpoint.headers or {}),
        signature=endpoint.signature,
        verify=endpoint.verify,
        filter=endpoint.filter,
    )
    return created


def update(
    session: Session, rt: Runtime, actor: Actor, uid: str, endpoint_id: str, body: dict[str, Any]
) -> Endpoint:
    endpoint = live(session, actor, uid, endpoint_id, "endpoints:write")
    _trace_opt_in(actor, body, endpoint.send_traceparent)
    old_url = endpoint.url
    rules.update_endpoint(session, endpoint, body, rt.settings)
    if "url" in body:
        verification.after_url_change(session, rt, actor, endpoint, old_url)
    changed = sorted(body)
    details: dict[str, Any] = {"fields": changed}
    if "url" in body:
        details["url"] = endpoint.url
    if "filter" in body:
        details["filter"] = endpoint.filter
    _record(session, actor, "endpoint.updated", endpoint, **details)
    if "on_dead" in body:
        # Keys held by a dead delivery that "skip" now lets go: send what waited at once.
        enqueue_after_commit(
            session, rt.redis, job_specs(ordering.released_at_endpoint(session, endpoint.id))
        )
    return endpoint


BlockedKey = ordering.BlockedKey


def blocked_keys(
    session: Session, actor: Actor, uid: str, endpoint_id: str, *, cursor: str | None, limit: int
) -> tuple[list[BlockedKey], str | None]:
    """The ordering keys this endpoint holds behind a dead delivery (`on_dead: "block"`), a
    page at a time; an operator releases one by resending or discarding its dead letter.

    Raises:
        BadRequest: a cursor this service did not hand out.
    """
    endpoint = live(session, actor, uid, endpoint_id)
    after = None
    if cursor:
        try:
            after = base64.b64decode(cursor.encode("ascii"), altchars=b"-_", validate=True).decode(
                "utf-8"
            )
        except (ValueError, UnicodeError):
            raise BadRequest(
                "cursor is not valid", code="invalid_parameter", details={"parameter": "cursor"}
            ) from None
    rows = ordering.blocked_keys(session, endpoint.id, after=after, limit=limit + 1)
    following = None
    if len(rows) > limit:
        rows = rows[:limit]
        following = base64.urlsafe_b64encode(rows[-1].ordering_key.encode()).decode("ascii")
    return rows, following


BlockedCount = ordering.BlockedCount


def blocked_key_counts(session: Session) -> list[BlockedCount]:
    """How many keys each endpoint holds, every partner's (for /metrics, which shows figures
    to whoever may scrape it, not to an actor): one statement."""
    return ordering.blocked_key_counts(session)


def delete(session: Session, actor: Actor, uid: str, endpoint_id: str) -> None:
    endpoint = live(session, actor, uid, endpoint_id, "endpoints:write")
    was_pending = verification.pending(endpoint)
    rules.delete_endpoint(session, endpoint)
    if was_pending:
        verification.park_held(session, endpoint)
    _record(session, actor, "endpoint.deleted", endpoint)


DISABLED_BY_OPERATOR_CODE = "disabled_by_operator"


def may_enable(actor: Actor, endpoint: Endpoint) -> bool:
    """Whether this actor may enable the endpoint: a partner's credentials may not undo an
    operator's disable (only the health monitor's, or the partner's own)."""
    return not (
        actor.bound_to_partner
        and endpoint.state == DISABLED
        and endpoint.disabled_by == DISABLED_BY_OPERATOR
    )


def enable(session: Session, actor: Actor, endpoint: Endpoint, rt: Runtime | None = None) -> bool:
    """Enable a disabled endpoint; False when it was enabled already (nothing recorded).

    A `verify` endpoint that never verified (disabled as unverified, or its host changed
    while disabled) is not enabled but made to verify again: a fresh challenge and window
    (sent through `rt`, the process runtime when not given).

    Raises:
        Conflict: `disabled_by_operator` when a partner's credentials try to enable an
            endpoint an operator disabled; `pending_verification` for an endpoint that
            waits for verification (it is enabled by answering its challenge).
    """
    _own(actor, endpoint, "endpoints:write")
    if endpoint.state == ENABLED:
        return False
    if verification.pending(endpoint):
        raise Conflict(
            "this endpoint waits for verification: it is enabled by answering its challenge "
            "(POST …/verify), and a new challenge is sent with POST …/verify/resend",
            code="pending_verification",
            details={"endpoint": endpoint.id},
        )
    if not may_enable(actor, endpoint):
        raise Conflict(
            "this endpoint was disabled by the publisher's operators; only they "
            "can enable it again: ask them",
            code=DISABLED_BY_OPERATOR_CODE,
            details={
                "endpoint": endpoint.id,
                "disabled_by": DISABLED_BY_OPERATOR,
                "disabled_reason": endpoint.disabled_reason,
            },
        )
    was = isoformat(endpoint.disabled_at)
    reason = endpoint.disabled_reason
    rules.enable_endpoint(session, endpoint)
    if endpoint.verify and endpoint.verified_at is None:
        verification.start(session, rt or runtime_mod.current(), endpoint)
    session.add(
        OperationalEvent(
            kind="endpoint.enabled",
            subject_id=endpoint.id,
            data={"actor": str(actor), "was_disabled_at": was, "was_disabled_because": reason},
        )
    )
    _record(session, actor, "endpoint.enabled", endpoint, was_disabled_at=was)
    return True


def disable(session: Session, actor: Actor, endpoint: Endpoint, reason: str | None = None) -> bool:
    """Disable by hand; False when it was disabled already (a new reason is still kept)."""
    _own(actor, endpoint, "endpoints:write")
    was_enabled = endpoint.state == ENABLED
    was_pending = verification.pending(endpoint)
    rules.disable_endpoint(
        session,
        endpoint,
        reason,
        by=DISABLED_BY_PARTNER if actor.bound_to_partner else DISABLED_BY_OPERATOR,
    )
    if was_pending:
        verification.park_held(session, endpoint)
    if was_enabled:
        operational.about_endpoint(
            session,
            OperationalEventType.ENDPOINT_DISABLED,
            endpoint,
            {
                "reason": endpoint.disabled_reason or "manual",
                "disabled_by": endpoint.disabled_by or DISABLED_BY_OPERATOR,
                "disabled_at": isoformat(endpoint.disabled_at),
            },
        )
    _record(session, actor, "endpoint.disabled", endpoint, reason=endpoint.disabled_reason)
    return was_enabled


def rotate_secret(
    session: Session,
    rt: Runtime,
    actor: Actor,
    endpoint: Endpoint,
    body: dict[str, Any] | None = None,
) -> str | None:
    """A new current key (of the kind `body` asks, default the endpoint's); the old ones
    keep signing for the configured overlap. The new HMAC secret, or None for an Ed25519
    key (its public key is then `public_key(endpoint)`)."""
    _own(actor, endpoint, "endpoints:write")
    was = endpoint.signature
    secret = rules.rotate_secret(session, endpoint, body or {}, rt.settings, rt.secret_box)
    details: dict[str, Any] = {"signature": endpoint.signature}
    if was != endpoint.signature:
        details["was_signature"] = was
    _record(
        session,
        actor,
        "endpoint.secret_rotated",
        endpoint,
        overlap_s=rt.settings.secret_rotation_overlap_seconds,
        **details,
    )
    # The endpoint's history (its operational events) shows rotations beside disables and
    # enables: when the partner's receiver must have the new secret by.
    session.add(
        OperationalEvent(
            kind="endpoint.secret_rotated",
            subject_id=endpoint.id,
            data={
                "actor": str(actor),
                "signature": endpoint.signature,
                "previous_signs_until": isoformat(previous_secret_expiry(endpoint)),
            },
        )
    )
    return secret


def read_secret(
    session: Session, rt: Runtime, actor: Actor, endpoint: Endpoint
) -> tuple[EndpointSecret, str]:
    """The current secret (a write scope is needed to read it); every reading is audited.

    Raises:
        Conflict: `no_shared_secret`: the endpoint signs with Ed25519, whose private key
            is never shown (`public_key` is what its partner verifies with).
    """
    _own(actor, endpoint, "endpoints:write")
    row, secret = rules.read_secret(endpoint, rt.secret_box)
    _record(session, actor, "endpoint.secret_revealed", endpoint, secret_id=row.id)
    return row, secret


SECRET_PREFIX_CHARS = 10  # "whsec_" and four characters: tells secrets apart, proves nothing


def secret_prefix(session: Session, rt: Runtime, actor: Actor, endpoint: Endpoint) -> str:
    """The first characters of the current secret, to tell which secret is which (not a
    reading of the secret: not audited, and `read` is enough)."""
    _own(actor, endpoint, "read")
    _, secret = rules.read_secret(endpoint, rt.secret_box)
    return secret[:SECRET_PREFIX_CHARS]


ENDPOINT_DISABLED = "endpoint_disabled"


def send_test(session: Session, rt: Runtime, actor: Actor, endpoint: Endpoint) -> Delivery:
    """A `kurir.test` event to this endpoint alone, through the normal delivery engine.

    A disabled endpoint is sent nothing, a test neither (`409 endpoint_disabled`): it may
    have been disabled because of where it points. A partner's own credentials send at
    most `KURIR_PARTNER_TEST_SENDS_PER_MINUTE` (see `partner_bounds`). The event names who
    sent it as its partner is shown them ("publisher" for an operator).

    Raises:
        Conflict: `pull_endpoint`, `endpoint_disabled`.
        RateLimited: too many test events from the partner's credentials (429).
        Unavailable: the rate limiter is unreachable and the actor is the partner's (503).
    """
    _own(actor, endpoint, "endpoints:write")
    if endpoint.mode == EndpointMode.PULL:
        raise Conflict(
            "a pull endpoint is sent nothing, a test event neither: its consumer reads the feed",
            code="pull_endpoint",
            details={"endpoint": endpoint.id},
        )
    if verification.pending(endpoint):
        raise Conflict(
            "this endpoint waits for verification and is sent nothing but its challenge: "
            "answer it first (POST …/verify)",
            code="pending_verification",
            details={"endpoint": endpoint.id},
        )
    if endpoint.state != ENABLED:
        raise Conflict(
            "this endpoint is disabled and is sent nothing, a test event neither: enable it first",
            code=ENDPOINT_DISABLED,
            details={"endpoint": endpoint.id, "disabled_by": endpoint.disabled_by},
        )
    partner_bounds.take(rt, actor, endpoint.partner_id, partner_bounds.TEST_SENDS)
    partner = session.get_one(Partner, endpoint.partner_id)
    delivery = send_test_event(
        session,
        rt.redis,
        partner,
        endpoint,
        sent_by=shown_to(endpoint.partner_id, str(actor), actor.partner_id),
    )
    _record(
        session,
        actor,
        "endpoint.test_sent",
        endpoint,
        event=delivery.event_id,
        delivery=delivery.id,
    )
    return delivery


NOT_PROBED_CODE = "endpoint_not_probed"


def probe_now(session: Session, rt: Runtime, actor: Actor, endpoint: Endpoint) -> None:
    """Queue a `kurir.endpoint.probe` to this endpoint now (after commit); the scheduled
    probes go on from it. Audited as `endpoint.probe_requested`.

    Raises:
        Conflict: `endpoint_not_probed` unless Kurir disabled the endpoint after failures
            and still probes it (enabled, disabled by someone, a 410, the window ended).
    """
    _own(actor, endpoint, "endpoints:write")
    if not recovery_due.is_probed(endpoint):
        raise Conflict(
            "only an endpoint Kurir disabled after failures, within its probe window, is "
            "probed: this one is not",
            code=NOT_PROBED_CODE,
            details={
                "endpoint": endpoint.id,
                "state": endpoint.state,
                "disabled_by": endpoint.disabled_by,
            },
        )
    enqueue_after_commit(
        session, rt.redis, [recovery_jobs.probe_spec(endpoint.id, endpoint.probe_count, now=True)]
    )
    _record(session, actor, "endpoint.probe_requested", endpoint)


def _window_bound(body: dict[str, Any], name: str, *, required: bool) -> datetime | None:
    raw = body.get(name)
    if raw is None and not required:
        return None
    if not isinstance(raw, str):
        raise ValidationFailed(
            f"{name} must be an RFC 3339 timestamp with an offset",
            code="invalid_field",
            details={"field": name},
        )
    try:
        return parse_rfc3339(raw)
    except ValueError:
        raise ValidationFailed(
            f"{name} must be an RFC 3339 timestamp with an offset",
            code="invalid_field",
            details={"field": name},
        ) from None


def recover_window(
    session: Session, rt: Runtime, actor: Actor, endpoint: Endpoint, body: dict[str, Any]
) -> ResendJob:
    """Resend once, in publish order and one after the other (so at the endpoint's rate),
    every delivery of this endpoint published in `[since, until)` that did not succeed:
    open dead letters and deliveries still retrying. One audited operation
    (`endpoint.recover_started`), with progress at GET /v1/operations/{id}.

    Raises:
        ValidationFailed: `since` missing or not a timestamp, `until` not after it.
        Conflict: `endpoint_disabled` (enable it first), `pull_endpoint`.
    """
    _own(actor, endpoint, "endpoints:write")
    actor.require("dlq:write")
    reject_unknown_fields(body, ("since", "until"))
    since = _window_bound(body, "since", required=True) or utcnow()  # required: never None
    until = _window_bound(body, "until", required=False)
    if until is not None and until <= since:
        raise ValidationFailed(
            "until must be after since", code="invalid_field", details={"field": "until"}
        )
    if endpoint.mode == EndpointMode.PULL:
        raise Conflict(
            "a pull endpoint is sent nothing: its consumer reads the feed",
            code="pull_endpoint",
            details={"endpoint": endpoint.id},
        )
    if endpoint.state != ENABLED:
        raise Conflict(
            "this endpoint is disabled and is sent nothing: enable it first",
            code=ENDPOINT_DISABLED,
            details={"endpoint": endpoint.id, "disabled_by": endpoint.disabled_by},
        )
    job = recovery.start_window(
        session,
        endpoint,
        since,
        until,
        actor=str(actor),
        redis=rt.redis,
        key_id=actor.key_id,
        actor_partner_id=actor.partner_id,
    )
    _record(
        session,
        actor,
        "endpoint.recover_started",
        endpoint,
        operation=job.id,
        since=isoformat(since),
        until=isoformat(until),
        items=job.total,
    )
    return job


def is_probed(endpoint: Endpoint) -> bool:
    """Whether Kurir probes this endpoint now (disabled after failures, window open)."""
    return recovery_due.is_probed(endpoint)


def probes(
    session: Session, actor: Actor, endpoint: Endpoint, *, limit: int = 20
) -> list[EndpointProbe]:
    """The endpoint's probe history, newest first."""
    actor.require("read")
    if not actor.may_see_partner(endpoint.partner_id):
        raise _not_found(endpoint.id)
    return list(
        session.scalars(
            select(EndpointProbe)
            .where(EndpointProbe.endpoint_id == endpoint.id)
            .order_by(EndpointProbe.at.desc(), EndpointProbe.id.desc())
            .limit(limit)
        )
    )


def public_key(endpoint: Endpoint, now: datetime | None = None) -> str | None:
    """An Ed25519 endpoint's current whpk_ public key (None for an HMAC endpoint): public,
    so shown to whoever may see the endpoint."""
    return signing_keys.current_public_key(endpoint, now or utcnow())


def public_keys(endpoint: Endpoint, now: datetime | None = None) -> list[EndpointSecret]:
    """The Ed25519 keys signing now, newest first (`.public_key`, `.created_at`,
    `.expires_at`): after a rotation the previous one too, until its overlap ends."""
    return signing_keys.live_public_keys(endpoint, now or utcnow())


def previous_secret_expiry(endpoint: Endpoint, now: datetime | None = None) -> datetime | None:
    """Until when the secrets before the current one still sign (after a rotation)."""
    return secret_ring.overlap_ends(endpoint.secrets, now or utcnow())


def parked_since(session: Session, endpoint: Endpoint) -> datetime | None:
    """When the endpoint was last disabled: now, or before its latest re-enable."""
    from app.clock import parse_time

    if endpoint.state == DISABLED and endpoint.disabled_at is not None:
        return endpoint.disabled_at
    latest = session.scalar(
        select(OperationalEvent)
        .where(
            OperationalEvent.subject_id == endpoint.id,
            OperationalEvent.kind.in_(("endpoint.enabled", "endpoint.disabled")),
        )
        .order_by(OperationalEvent.id.desc())
        .limit(1)
    )
    if latest is None:
        return None
    if latest.kind == "endpoint.enabled":
        raw = (latest.data or {}).get("was_disabled_at")
        return parse_time(raw) if raw else None
    return latest.created_at


@dataclass(frozen=True)
class Parked:
    """What an endpoint parked while it was last disabled and is still open."""

    since: datetime | None  # when it was disabled (None: never; then every open letter)
    letters: int
    # Under `on_dead: "block"` parked ordered deliveries hold their keys until resent.
    holds_keys: bool


def _parked_filter(endpoint: Endpoint, since: datetime | None) -> DeadLetterFilter:
    return DeadLetterFilter(endpoint=endpoint.id, state=DL_OPEN, since=since)


def parked(session: Session, actor: Actor, endpoint: Endpoint) -> Parked:
    """The open letters parked since the endpoint was last disabled (what re-enabling it
    offers to resend)."""
    _own(actor, endpoint, "read")
    since = parked_since(session, endpoint)
    letters = dead_letters.count_matching(session, actor, _parked_filter(endpoint, since))
    return Parked(since, letters, endpoint.on_dead == OnDead.BLOCK and letters > 0)


def resend_parked(
    session: Session, rt: Runtime, actor: Actor, endpoint: Endpoint
) -> tuple[bool, ResendJob]:
    """Enable the endpoint if it is disabled and resend, in the background, every letter
    parked since it was disabled; whether it was enabled now, and the resend job.

    Under `on_dead: "block"` this is how a disable window ends: every ordered key touched
    while the endpoint was disabled is held by its first parked letter until that is resent
    (the claim then sends each key in order, whatever order the job takes them in).
    Audited as `endpoint.enabled` (when it was disabled) and `endpoint.parked_resent`.
    """
    _own(actor, endpoint, "endpoints:write")
    actor.require("dlq:write")
    since = parked_since(session, endpoint)
    enabled = enable(session, actor, endpoint, rt)
    job = dead_letters.resend_matching(
        session, rt, actor, dead_letters.FilterForm(_parked_filter(endpoint, since))
    )
    _record(
        session,
        actor,
        "endpoint.parked_resent",
        endpoint,
        operation=job.id,
        letters=job.total,
        since=isoformat(since),
    )
    return enabled, job


def resend_letter_enabling(
    session: Session, rt: Runtime, actor: Actor, letter_id: str, *, force: bool = False
) -> tuple[bool, DeadLetter]:
    """Enable the letter's endpoint if it is disabled (and not deleted), then resend the
    letter; whether the endpoint was enabled now, and the letter.

    The one-letter counterpart of `resend_parked`. Audited as `endpoint.enabled` (when it
    was disabled) and on the letter as a resend.
    """
    letter, _ = dead_letters.get(session, actor, letter_id)
    endpoint = by_id(session, actor, letter.endpoint_id, "endpoints:write")
    enabled = endpoint.deleted_at is None and enable(session, actor, endpoint, rt)
    return enabled, dead_letters.resend_one(session, rt, actor, letter_id, force=force)


@dataclass(frozen=True)
class Health:
    """Attempts and 2xx answers of one endpoint over a window."""

    attempts: int
    successes: int

    @property
    def success_rate(self) -> float | None:
        return None if not self.attempts else self.successes / self.attempts


def health_of(session: Session, endpoint_ids: list[str], *, since: datetime) -> dict[str, Health]:
    """Attempts and 2xx answers per endpoint since `since` (ids the caller may see)."""
    if not endpoint_ids:
        return {}
    ok = case((Attempt.response_status.between(200, 299), 1), else_=0)
    rows = session.execute(
        select(Delivery.endpoint_id, func.count(Attempt.id), func.coalesce(func.sum(ok), 0))
        .join(Delivery, Delivery.id == Attempt.delivery_id)
        .where(Delivery.endpoint_id.in_(endpoint_ids), Attempt.started_at >= since)
        .group_by(Delivery.endpoint_id)
    )
    return {endpoint_id: Health(int(n), int(s)) for endpoint_id, n, s in rows}


def health(
    session: Session, actor: Actor, endpoints: list[Endpoint], *, since: datetime
) -> dict[str, Health]:
    """The health of the endpoints the actor may see among `endpoints`."""
    actor.require("read")
    return health_of(
        session, [e.id for e in endpoints if actor.may_see_partner(e.partner_id)], since=since
    )


# ------------------------------------------------------------------------------ health states

# Failures in a row after which an enabled endpoint is "failing" (red), long before the
# health monitor disables it; any failure in a row, or a success rate under AMBER_RATE,
# makes it "degraded" (amber).
FAILING_STREAK = 5
RED_RATE, AMBER_RATE = 0.5, 0.95
MIN_ATTEMPTS_FOR_RATE = 5

FAILING, DEGRADED, HEALTHY, IDLE = "failing", "degraded", "healthy", "idle"
# Worst first: the order of a list sorted by health.
_STATUS_RANK = {DISABLED.value: 0, FAILING: 1, DEGRADED: 2, HEALTHY: 3, IDLE: 4}


def health_status(endpoint: Endpoint, health: Health | None) -> str:
    """One word for how an endpoint is doing: disabled, failing (red), degraded (amber),
    healthy, or idle (nothing attempted in the window)."""
    if endpoint.state == DISABLED:
        return DISABLED.value
    streak = endpoint.consecutive_failures or 0
    rate = health.success_rate if health is not None else None
    enough = health is not None and health.attempts >= MIN_ATTEMPTS_FOR_RATE
    if streak >= FAILING_STREAK or (rate is not None and enough and rate < RED_RATE):
        return FAILING
    if streak > 0 or (rate is not None and rate < AMBER_RATE):
        return DEGRADED
    return IDLE if rate is None else HEALTHY


def health_statuses(endpoints: list[Endpoint], health: dict[str, Health]) -> dict[str, str]:
    return {e.id: health_status(e, health.get(e.id)) for e in endpoints}


def sort_by_health(endpoints: list[Endpoint], health: dict[str, Health]) -> list[Endpoint]:
    """Worst first: disabled, failing, degraded, healthy, idle; then the lower success rate,
    then the longer failure streak."""

    def key(e: Endpoint) -> tuple[int, float, int]:
        h = health.get(e.id)
        rate = h.success_rate if h is not None and h.success_rate is not None else 1.0
        return (_STATUS_RANK[health_status(e, h)], rate, -(e.consecutive_failures or 0))

    return sorted(endpoints, key=key)


HEALTH_SORT_LIMIT = 500


def worst_first(
    session: Session,
    actor: Actor,
    uid: str | None,
    *,
    state: str | None,
    since: datetime,
    limit: int = HEALTH_SORT_LIMIT,
) -> tuple[list[Endpoint], dict[str, Health]]:
    """Live endpoints sorted by health, worst first (at most `limit`, the ones with the
    longest failure streaks), with their health since `since`."""
    if uid is not None:
        partner = partners.visible(session, actor, uid)
        stmt = rules.live_endpoints_query(partner)
    else:
        actor.require("read")
        stmt = select(Endpoint).where(Endpoint.deleted_at.is_(None))
        if actor.partner_id is not None:
            stmt = stmt.where(Endpoint.partner_id == actor.partner_id)
    if state:
        stmt = stmt.where(Endpoint.state == state)
    rows = list(
        session.scalars(
            stmt.order_by(None)
            .order_by(Endpoint.consecutive_failures.desc(), Endpoint.id.desc())
            .limit(limit)
        )
    )
    found = health(session, actor, rows, since=since)
    return sort_by_health(rows, found), found


@dataclass(frozen=True)
class Failing:
    """An enabled endpoint that keeps failing, and what waits for it."""

    endpoint: Endpoint
    partner_uid: str
    retrying: int


FAILING_SHOWN = 20


def failing(session: Session, actor: Actor, *, limit: int = FAILING_SHOWN) -> list[Failing]:
    """Enabled live endpoints with at least FAILING_STREAK failures in a row, the longest
    streak first (what the dashboard shows before the health monitor disables them)."""
    actor.require("read")
    stmt = select(Endpoint).where(
        Endpoint.deleted_at.is_(None),
        Endpoint.state == ENABLED,
        Endpoint.consecutive_failures >= FAILING_STREAK,
    )
    if actor.partner_id is not None:
        stmt = stmt.where(Endpoint.partner_id == actor.partner_id)
    rows = list(session.scalars(stmt.order_by(Endpoint.consecutive_failures.desc()).limit(limit)))
    uids = partners.uids(session, {e.partner_id for e in rows})
    waiting = retrying_counts(session, actor, [e.id for e in rows])
    return [Failing(e, uids.get(e.partner_id, ""), waiting.get(e.id, 0)) for e in rows]


def retrying_counts(session: Session, actor: Actor, endpoint_ids: list[str]) -> dict[str, int]:
    """Endpoint id -> its deliveries waiting for a retry (those with none are left out)."""
    actor.require("read")
    if not endpoint_ids:
        return {}
    stmt = (
        select(Delivery.endpoint_id, func.count())
        .where(Delivery.endpoint_id.in_(endpoint_ids), Delivery.state == RETRYING)
        .group_by(Delivery.endpoint_id)
    )
    if actor.partner_id is not None:
        stmt = stmt.join(Endpoint, Endpoint.id == Delivery.endpoint_id).where(
            Endpoint.partner_id == actor.partner_id
        )
    return {endpoint_id: int(n) for endpoint_id, n in session.execute(stmt)}


# ------------------------------------------------------------------------------ success chart

CHART_RANGES = {"24h": (timedelta(hours=1), 24), "7d": (timedelta(days=1), 7)}


@dataclass(frozen=True)
class Bucket:
    start: datetime
    attempts: int
    successes: int

    @property
    def success_rate(self) -> float | None:
        return None if not self.attempts else self.successes / self.attempts


@dataclass(frozen=True)
class SuccessSeries:
    """An endpoint's attempts and 2xx answers per hour (24 h) or per day (7 d), oldest
    first, UTC buckets."""

    range: str
    step: timedelta
    buckets: list[Bucket]

    @property
    def attempts(self) -> int:
        return sum(b.attempts for b in self.buckets)

    @property
    def successes(self) -> int:
        return sum(b.successes for b in self.buckets)

    @property
    def success_rate(self) -> float | None:
        return None if not self.attempts else self.successes / self.attempts


def chart_range(raw: str | None) -> str:
    """The chart range asked for, `24h` unless `7d`."""
    return raw if raw in CHART_RANGES else "24h"


def _bucket(session: Session, column: Any, step: timedelta) -> Any:
    day = step >= timedelta(days=1)
    if session.get_bind().dialect.name == "postgresql":
        return func.date_trunc("day" if day else "hour", column)
    return func.strftime("%Y-%m-%d 00:00:00" if day else "%Y-%m-%d %H:00:00", column)


def _as_bucket(value: Any, step: timedelta) -> datetime:
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    moment = moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return moment.replace(hour=0) if step >= timedelta(days=1) else moment


def success_series(
    session: Session,
    actor: Actor,
    endpoint: Endpoint,
    range_: str = "24h",
    now: datetime | None = None,
) -> SuccessSeries:
    """The endpoint's success over the last 24 hours (hourly) or 7 days (daily)."""
    actor.require("read")
    if not actor.may_see_partner(endpoint.partner_id):
        raise _not_found(endpoint.id)
    range_ = chart_range(range_)
    step, count_ = CHART_RANGES[range_]
    latest = _as_bucket(now or utcnow(), step)
    start = latest - step * (count_ - 1)
    ok = case((Attempt.response_status.between(200, 299), 1), else_=0)
    bucket = _bucket(session, Attempt.started_at, step).label("bucket")
    rows = session.execute(
        select(bucket, func.count(Attempt.id), func.coalesce(func.sum(ok), 0))
        .join(Delivery, Delivery.id == Attempt.delivery_id)
        .where(Delivery.endpoint_id == endpoint.id, Attempt.started_at >= start)
        .group_by(bucket)
    )
    found = {_as_bucket(b, step): (int(n), int(s)) for b, n, s in rows}
    buckets = [
        Bucket(start + step * i, *found.get(start + step * i, (0, 0))) for i in range(count_)
    ]
    return SuccessSeries(range_, step, buckets)


def labels(session: Session, actor: Actor, endpoint_ids: set[str]) -> dict[str, str]:
    """Endpoint id -> how a list names it: its URL (a pull endpoint: "pull"), and its
    description when it has one; for the endpoints the actor may see."""
    actor.require("read")
    if not endpoint_ids:
        return {}
    rows = session.scalars(select(Endpoint).where(Endpoint.id.in_(endpoint_ids)))
    return {
        e.id: (e.url or "pull") + (f" — {e.description}" if e.description else "")
        for e in rows
        if actor.may_see_partner(e.partner_id)
    }


# When the secrets a rotation superseded stop signing, as a partner may choose (a leaked
# secret must not keep signing for the whole overlap).
EXPIRE_PREVIOUS = {"now": 0, "1h": 3600}


def expire_previous_secrets(
    session: Session, actor: Actor, endpoint: Endpoint, when: str, now: datetime | None = None
) -> datetime:
    """Bring forward the end of the overlap: the previous secrets (or Ed25519 keys) stop
    signing `now` or in `1h` (never later than they would have); returns when.

    Raises:
        BadRequest: `when` is neither `now` nor `1h`.
        Conflict: `no_previous_secret`: nothing but the current secret signs.
    """
    _own(actor, endpoint, "endpoints:write")
    if when not in EXPIRE_PREVIOUS:
        raise BadRequest(
            "when must be now or 1h", code="invalid_parameter", details={"parameter": "when"}
        )
    now = now or utcnow()
    live_now = secret_ring.live(endpoint.secrets, now)
    until = now + timedelta(seconds=EXPIRE_PREVIOUS[when])
    changed = [s for s in live_now[1:] if s.expires_at is None or s.expires_at > until]
    if len(live_now) < 2:
        raise Conflict(
            "only the current secret signs: there is no previous one to expire",
            code="no_previous_secret",
            details={"endpoint": endpoint.id},
        )
    for secret in changed:
        secret.expires_at = until
    _record(session, actor, "endpoint.previous_secret_expired", endpoint, until=isoformat(until))
    session.add(
        OperationalEvent(
            kind="endpoint.previous_secret_expired",
            subject_id=endpoint.id,
            data={"actor": str(actor), "until": isoformat(until)},
        )
    )
    return until
