"""Endpoints: create, change, disable, enable, delete, and their signing secrets.

Each field is validated by its rule in `app.registry.endpoint_fields`, so a bad URL never
reaches a worker. Secrets are stored only encrypted and are returned to the caller, never
logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.clock import utcnow
from app.config import Settings
from app.crypto import SecretBox
from app.errors import NotFound, ValidationFailed, reject_unknown_fields
from app.feed.sequencer import settled_head
from app.models import DISABLED_BY_OPERATOR, Endpoint, EndpointSecret, Partner
from app.net import guard
from app.registry import keys
from app.registry.endpoint_fields import (
    ENDPOINT_FIELDS,
    PATCHABLE_FIELDS,
    check_choice,
    check_description,
    check_event_types,
    check_filter,
    check_flag,
    check_headers,
    check_mode,
    check_public_headers,
    check_rate_limit,
    check_timeout,
    check_url,
    check_versions,
    invalid,
)
from app.registry.secrets import add_secret, current_secret_row, rotate
from app.vocabulary import EndpointMode, EndpointState, OnDead, Ordering, values

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EndpointWithSecret:
    endpoint: Endpoint
    secret: str | None  # None for an Ed25519 endpoint: its private key is never shown


def create_endpoint(
    session: Session,
    partner: Partner,
    body: dict[str, Any],
    settings: Settings,
    box: SecretBox,
    resolver: guard.Resolver = guard.default_resolver,
) -> EndpointWithSecret:
    """Validate everything, then store the endpoint and its (encrypted) first secret."""
    reject_unknown_fields(body, ENDPOINT_FIELDS)
    mode = check_mode(body.get("mode", EndpointMode.PUSH.value))
    if mode == EndpointMode.PULL:
        if body.get("url") is not None:
            raise invalid(
                "url",
                "a pull endpoint has no url: nothing is sent to it, its "
                "consumer reads the feed (GET /v1/partners/{uid}/feed"
                "?endpoint={id})",
            )
        url = ""
    else:
        url = check_url(body.get("url"), settings, resolver)
    event_types = check_event_types(session, body.get("event_types"))
    headers = check_headers(body.get("headers"))
    public_headers = check_public_headers(body.get("public_headers"), headers)
    versions = check_versions(session, body.get("versions"))
    timeout_s = check_timeout(body.get("timeout_s", settings.default_timeout_s))
    rate_limit = check_rate_limit(body.get("rate_limit_per_s"))
    description = check_description(body.get("description"))
    ordering_ = check_choice(
        "ordering", body.get("ordering", Ordering.NONE.value), values(Ordering)
    )
    on_dead = check_choice("on_dead", body.get("on_dead", OnDead.SKIP.value), values(OnDead))
    send_traceparent = check_flag("send_traceparent", body.get("send_traceparent", False))
    auto_recover = check_flag("auto_recover", body.get("auto_recover", True))
    verify = check_verify(body, mode, settings)
    filter_ = check_filter(body.get("filter"))
    if filter_ is not None and mode == EndpointMode.PULL:
        raise _pull_filter()
    signature, secret = keys.first_key(body)
    endpoint = Endpoint(
        partner=partner,
        url=url,
        event_types=event_types,
        headers=headers,
        public_headers=public_headers,
        versions=versions,
        timeout_s=timeout_s,
        rate_limit_per_s=rate_limit,
        description=description,
        state=EndpointState.ENABLED,
        mode=mode,
        ordering=ordering_,
        on_dead=on_dead,
        send_traceparent=send_traceparent,
        auto_recover=auto_recover,
        signature=signature,
        verify=verify,
        filter=filter_,
    )
    if mode == EndpointMode.PULL:
        # Its feed starts here: what was committed before is not its backlog.
        endpoint.acked_seq = settled_head(session.connection())
    session.add(endpoint)
    add_secret(session, endpoint, secret, box)
    session.flush()
    return EndpointWithSecret(endpoint, keys.shown(secret))


def check_verify(body: dict[str, Any], mode: str, settings: Settings) -> bool:
    """`verify` as given, else the setting's default for a push endpoint; a pull endpoint is
    sent nothing, so it has nothing to verify."""
    if "verify" not in body:
        return settings.verify_endpoints and mode == EndpointMode.PUSH
    verify = check_flag("verify", body["verify"])
    if verify and mode == EndpointMode.PULL:
        raise invalid(
            "verify", "a pull endpoint is sent nothing, so there is no URL whose control to verify"
        )
    return verify


def _pull_filter() -> ValidationFailed:
    return ValidationFailed(
        "a pull endpoint reads the partner's whole feed: a filter applies to pushed "
        "deliveries only",
        code="invalid_filter",
        details={"field": "filter", "bound": "mode"},
    )


def get_endpoint(session: Session, partner: Partner, endpoint_id: str) -> Endpoint:
    endpoint = session.scalar(
        select(Endpoint).where(
            Endpoint.id == endpoint_id,
            Endpoint.partner_id == partner.id,
            Endpoint.deleted_at.is_(None),
        )
    )
    if endpoint is None:
        raise NotFound(
            f"endpoint {endpoint_id!r} of partner {partner.uid!r} does not exist",
            details={"endpoint": endpoint_id, "partner": partner.uid},
        )
    return endpoint


def live_endpoints_query(partner: Partner) -> Any:
    return select(Endpoint).where(Endpoint.partner_id == partner.id, Endpoint.deleted_at.is_(None))


def update_endpoint(
    session: Session,
    endpoint: Endpoint,
    body: dict[str, Any],
    settings: Settings,
    resolver: guard.Resolver = guard.default_resolver,
) -> Endpoint:
    """Change only the fields given; each is validated as at creation."""
    if "secret" in body:
        raise ValidationFailed(
            "the secret is changed with POST .../secret/rotate",
            code="unknown_field",
            details={"fields": ["secret"]},
        )
    if "mode" in body and body["mode"] != endpoint.mode:
        raise ValidationFailed(
            "an endpoint's mode is fixed at creation; create a new endpoint for the other mode",
            code="mode_immutable",
            details={"field": "mode", "mode": endpoint.mode},
        )
    keys.refuse_change(endpoint, body)
    if "verify" in body and body["verify"] != endpoint.verify:
        raise ValidationFailed(
            "whether an endpoint must prove it controls its URL is fixed at creation; "
            "create a new endpoint to change it",
            code="verify_immutable",
            details={"field": "verify", "verify": endpoint.verify},
        )
    body = {k: v for k, v in body.items() if k not in ("mode", keys.FIELD, "verify")}
    reject_unknown_fields(body, PATCHABLE_FIELDS)
    if "url" in body and endpoint.mode == EndpointMode.PULL:
        raise invalid("url", "a pull endpoint has no url (its mode is fixed at creation)")
    if "url" in body:
        endpoint.url = check_url(body["url"], settings, resolver)
    if "event_types" in body:
        endpoint.event_types = check_event_types(session, body["event_types"])
    if "headers" in body:
        endpoint.headers = check_headers(body["headers"], current=endpoint.headers or {})
    if "public_headers" in body:
        endpoint.public_headers = check_public_headers(
            body["public_headers"], endpoint.headers or {}
        )
    elif "headers" in body and endpoint.public_headers:
        # A header removed by this change leaves the public list with it.
        present = {h.lower() for h in endpoint.headers or {}}
        endpoint.public_headers = [
            n for n in endpoint.public_headers if n.lower() in present
        ] or None
    if "versions" in body:
        endpoint.versions = check_versions(session, body["versions"])
    if "timeout_s" in body:
        endpoint.timeout_s = check_timeout(body["timeout_s"])
    if "rate_limit_per_s" in body:
        endpoint.rate_limit_per_s = check_rate_limit(body["rate_limit_per_s"])
    if "description" in body:
        endpoint.description = check_description(body["description"])
    # A change applies to deliveries made from now on: those already numbered keep their order.
    if "ordering" in body:
        endpoint.ordering = check_choice("ordering", body["ordering"], values(Ordering))
    if "on_dead" in body:
        endpoint.on_dead = check_choice("on_dead", body["on_dead"], values(OnDead))
    if "send_traceparent" in body:
        endpoint.send_traceparent = check_flag("send_traceparent", body["send_traceparent"])
    if "auto_recover" in body:
        endpoint.auto_recover = check_flag("auto_recover", body["auto_recover"])
    if "filter" in body:
        endpoint.filter = check_filter(body["filter"])
        if endpoint.filter is not None and endpoint.mode == EndpointMode.PULL:
            raise _pull_filter()
    session.flush()
    return endpoint


def delete_endpoint(session: Session, endpoint: Endpoint, now: datetime | None = None) -> None:
    """Soft delete: history (deliveries, dead letters) stays; the endpoint gets nothing new.

    It is also disabled, so a worker that re-reads it before sending stops there.
    """
    now = now or utcnow()
    endpoint.deleted_at = now
    if endpoint.state != EndpointState.DISABLED:
        endpoint.state = EndpointState.DISABLED
        endpoint.disabled_reason = "deleted"
        endpoint.disabled_at = now
    session.flush()


def enable_endpoint(session: Session, endpoint: Endpoint) -> Endpoint:
    """Operator action: deliveries start again; health counters restart from zero."""
    endpoint.state = EndpointState.ENABLED
    endpoint.disabled_reason = None
    endpoint.disabled_at = None
    endpoint.disabled_by = None
    endpoint.consecutive_failures = 0
    endpoint.first_failure_at = None
    endpoint.probe_next_at = None
    endpoint.probe_count = 0
    session.flush()
    return endpoint


def disable_endpoint(
    session: Session,
    endpoint: Endpoint,
    reason: str | None = None,
    now: datetime | None = None,
    *,
    by: str = DISABLED_BY_OPERATOR,
) -> Endpoint:
    """Disable by hand: new events for the endpoint are parked as dead letters from now on.

    `by` says who (`Endpoint.disabled_by`). An operator disabling an endpoint that is disabled
    already makes it theirs; a partner leaves an operator's disable as it is (who, and why),
    so that it cannot turn it into one it may undo.
    """
    if reason is not None and (
        not isinstance(reason, str) or not reason.strip() or len(reason) > 200
    ):
        raise invalid("reason", "reason must be a non-empty string of at most 200 characters")
    if endpoint.state != EndpointState.DISABLED:
        endpoint.state = EndpointState.DISABLED
        endpoint.disabled_at = now or utcnow()
        endpoint.disabled_reason = reason.strip() if reason else "manual"
        endpoint.disabled_by = by
    elif by == DISABLED_BY_OPERATOR or endpoint.disabled_by != DISABLED_BY_OPERATOR:
        if reason:
            endpoint.disabled_reason = reason.strip()
        endpoint.disabled_by = by
    # Disabled by someone, not by failures: Kurir no longer probes it.
    endpoint.probe_next_at = None
    session.flush()
    return endpoint


def rotate_secret(
    session: Session,
    endpoint: Endpoint,
    body: dict[str, Any],
    settings: Settings,
    box: SecretBox,
    now: datetime | None = None,
) -> str | None:
    """Make a new key current, of the kind asked (default: the endpoint's); the old ones keep
    signing for the configured overlap. The new HMAC secret, or None for an Ed25519 key."""
    reject_unknown_fields(body, ("secret", keys.FIELD))
    signature, secret = keys.next_key(endpoint, body)
    rotate(
        session, endpoint, secret, box, now or utcnow(), settings.secret_rotation_overlap_seconds
    )
    endpoint.signature = signature
    return keys.shown(secret)


def read_secret(
    endpoint: Endpoint, box: SecretBox, now: datetime | None = None
) -> tuple[EndpointSecret, str]:
    """The current secret's row and its plaintext.

    Raises:
        Conflict: `no_shared_secret` for an Ed25519 key, whose private half is never shown.
    """
    row = current_secret_row(endpoint, now or utcnow())
    keys.require_shared(endpoint, row)
    return row, box.decrypt(row.secret_encrypted)
