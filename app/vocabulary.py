"""Kurir's vocabulary: every fixed set of words it stores, answers or acts on, in one place.

Each set is a `StrEnum`, so a member *is* its text: it compares equal to the stored string,
is written to the database and to JSON as that string, and a value read back as a plain
`str` matches it. Pipelines, services and faces import these rather than spelling the words,
so a list offered to a user (a filter, an API description) cannot drift from what the code
writes.
"""

from __future__ import annotations

from enum import StrEnum


def values(words: type[StrEnum]) -> tuple[str, ...]:
    """The words of a set as plain strings, in declaration order (for messages and docs)."""
    return tuple(member.value for member in words)


# ---------------------------------------------------------------------------- endpoints


class EndpointState(StrEnum):
    """Whether Kurir sends to an endpoint; a disabled one has its deliveries parked, one
    pending verification has them wait until it proves it controls its URL."""

    ENABLED = "enabled"
    DISABLED = "disabled"
    PENDING_VERIFICATION = "pending_verification"


class EndpointMode(StrEnum):
    """How a partner gets its events: Kurir POSTs them, or the partner reads its feed."""

    PUSH = "push"
    PULL = "pull"


class DisabledBy(StrEnum):
    """Who disabled an endpoint: a partner may not undo an operator's decision."""

    OPERATOR = "operator"  # the UI, an admin key, the CLI
    PARTNER = "partner"  # its keys, its portal
    HEALTH = "health"  # Kurir, after failures
    VERIFICATION = "verification"  # Kurir, when the ownership challenge went unanswered


class SignatureKind(StrEnum):
    """How webhooks to an endpoint are signed (Standard Webhooks): `v1` with a shared HMAC
    secret, or `v1a` with an Ed25519 key pair whose private half never leaves Kurir."""

    HMAC = "hmac"
    ED25519 = "ed25519"


class Ordering(StrEnum):
    """Whether an endpoint gets one ordering key's events one at a time, in commit order."""

    NONE = "none"
    KEY = "key"


class OnDead(StrEnum):
    """What an ordered key does when one of its deliveries dies: go on, or wait for it."""

    SKIP = "skip"
    BLOCK = "block"


# ---------------------------------------------------------------------------- deliveries


class DeliveryState(StrEnum):
    """Where a delivery is in its life; `succeeded` and `dead` are final."""

    PENDING = "pending"
    DELIVERING = "delivering"
    SUCCEEDED = "succeeded"
    RETRYING = "retrying"
    DEAD = "dead"


FINAL_DELIVERY_STATES = (DeliveryState.SUCCEEDED, DeliveryState.DEAD)


# ---------------------------------------------------------------------------- dead letters


class DeadLetterState(StrEnum):
    """An open letter waits for an operator; resent and discarded ones are closed."""

    OPEN = "open"
    RESENT = "resent"
    DISCARDED = "discarded"


class DeadLetterReason(StrEnum):
    """Why a delivery was parked: exactly the reasons `sender.park.park` is ever given."""

    RETRIES_EXHAUSTED = "retries_exhausted"
    ENDPOINT_DISABLED = "endpoint_disabled"


class OperationalEventType(StrEnum):
    """Kurir's own event types, about its endpoints, deliveries and contracts: registered by
    Kurir (never by publishers), published by Kurir and delivered like any event."""

    ENDPOINT_DISABLED = "endpoint.disabled"
    ENDPOINT_RECOVERED = "endpoint.recovered"
    ENDPOINT_VERIFICATION_FAILED = "endpoint.verification_failed"
    DELIVERY_EXHAUSTED = "delivery.exhausted"
    ORDERING_KEY_BLOCKED = "ordering.key_blocked"
    EVENT_TYPE_SUNSET_PASSED = "event_type.sunset_passed"


class ResendSkip(StrEnum):
    """Why a resend left a letter alone (also the API error codes of a single resend)."""

    NOT_FOUND = "not_found"
    NOT_OPEN = "dead_letter_not_open"
    ENDPOINT_DISABLED = "endpoint_disabled"
    ENDPOINT_DELETED = "endpoint_deleted"
    # A partner's own credentials may not force past an operator's decision to disable.
    DISABLED_BY_OPERATOR = "disabled_by_operator"


class ResendJobState(StrEnum):
    """A background resend: waiting for a worker, running its pages, or finished."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


# ---------------------------------------------------------------------------- inbound


class InboundStatus(StrEnum):
    """Where a received callback is: stored, being processed, or what processing decided."""

    RECEIVED = "received"
    PROCESSING = "processing"
    APPLIED = "applied"
    IGNORED = "ignored"
    QUARANTINED = "quarantined"
    FAILED = "failed"


class ReconcileState(StrEnum):
    """A pull of a provider's state: due, claimed by a worker, done, or given up."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class RetentionKind(StrEnum):
    """The kinds of history retention purges, each after its own number of days
    (`KURIR_RETAIN_<KIND>_DAYS`), in the order a run purges them: closed dead letters first,
    so the events they held become finished."""

    DEAD_LETTERS = "dead_letters"
    ATTEMPTS = "attempts"
    EVENTS = "events"
    INBOUND = "inbound"
    AUDIT = "audit"
