"""Planning a publish: judge `data` by its contract, make the versions pinned endpoints need,
and lay out the event row and what each endpoint gets, ready to write.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from app import event_types, telemetry
from app.clock import isoformat
from app.errors import ValidationFailed
from app.event_types import filters
from app.ids import new_id
from app.intake.envelope import PublishRequest, payload_json
from app.intake.targets import Targets
from app.models import DEAD, PENDING
from app.vocabulary import EndpointMode, EndpointState

Planned = tuple[str, str, int | None]  # (delivery id, endpoint id, version unless published)


@dataclass
class Plan:
    """One validated publish, ready to write: the event row and what each endpoint gets."""

    event_values: dict[str, Any]
    pending: list[Planned]  # to send
    parked: list[Planned]  # for disabled endpoints
    response: dict[str, Any]
    # The event in other versions (event_versions rows): what pinned endpoints receive, and
    # every rendition the publisher sent.
    versions: list[dict[str, Any]] = field(default_factory=list)
    # Ordered endpoints this event goes to under its ordering key: numbered at write time.
    ordered: list[str] = field(default_factory=list)
    # Deliveries among `pending` whose endpoint waits for verification: written held (no
    # `next_attempt_at`), not enqueued, released once it is verified (sender.verification).
    held: list[str] = field(default_factory=list)

    @property
    def enqueued(self) -> list[str]:
        if not self.held:
            return [delivery_id for delivery_id, _, _ in self.pending]
        held = set(self.held)
        return [delivery_id for delivery_id, _, _ in self.pending if delivery_id not in held]

    @property
    def versioned(self) -> bool:
        return bool(self.versions)


def contract_of(targets: Targets, req: PublishRequest) -> event_types.Contract:
    if targets.contract is None:
        raise ValidationFailed(
            f"unknown event type {req.type} v{req.version}",
            code="unknown_event_type",
            details={"type": req.type, "version": req.version},
        )
    return targets.contract


def deprecation_warning(
    type_: str, version: int, sunset_at: datetime | None, endpoints: list[str]
) -> dict[str, Any]:
    """What a publish answers when it sends a deprecated version (published, or pinned)."""
    message = f"{type_} v{version} is deprecated"
    if sunset_at is not None:
        message += f"; its sunset is {isoformat(sunset_at)}"
    if endpoints:
        message += f"; endpoints still on it: {', '.join(endpoints)}"
    return {
        "code": "deprecated_event_type",
        "message": message + "; publish a newer version",
        "type": type_,
        "version": version,
        "sunset_at": isoformat(sunset_at),
        "endpoints": endpoints,
    }


def published_warnings(
    req: PublishRequest, deprecated: bool, sunset_at: datetime | None = None
) -> list[dict[str, Any]]:
    if not deprecated:
        return []
    return [deprecation_warning(req.type, req.version, sunset_at, [])]


VersionsLoader = Callable[[str], dict[int, event_types.Version]]


def filtered_out(targets: Targets, req: PublishRequest) -> frozenset[str]:
    """The subscribed push endpoints whose filter does not match this event (evaluated once
    per publish, before anything is made for them)."""
    if not targets.filters:
        return frozenset()
    candidates = [
        endpoint_id
        for endpoint_id, _, subscribed, _, mode in targets.endpoints
        if endpoint_id in targets.filters
        and mode != EndpointMode.PULL
        and (subscribed is None or req.type in subscribed)
    ]
    if not candidates:
        return frozenset()
    event = filters.envelope(req.type, req.version, req.data, req.resource)
    return frozenset(filters.filtered_out(targets.filters, event, candidates))


def wanted_versions(
    targets: Targets, req: PublishRequest, excluded: frozenset[str] = frozenset()
) -> dict[str, int]:
    """Endpoint id -> the version it is pinned to, for the subscribed endpoints with a pin
    on this type other than the published version (those `excluded` by their filter get
    nothing, so need nothing made)."""
    wanted: dict[str, int] = {}
    for endpoint_id, _, subscribed, pins, _mode in targets.endpoints:
        if subscribed is not None and req.type not in subscribed:
            continue
        if endpoint_id in excluded:
            continue
        pinned = (pins or {}).get(req.type)
        if pinned is not None and pinned != req.version:
            wanted[endpoint_id] = int(pinned)
    return wanted


def _produce(
    req: PublishRequest,
    wanted: dict[str, int],
    versions: dict[int, event_types.Version],
    max_bytes: int,
) -> dict[int, tuple[dict[str, Any], str]]:
    """Every version pinned endpoints need, or the 422 that says which cannot be had."""
    try:
        return event_types.produce(
            versions,
            req.version,
            req.data,
            req.renditions,
            set(wanted.values()),
            max_bytes=max_bytes,
        )
    except event_types.VersionTooLarge as exc:
        what = (
            f"JSON larger than {exc.limit} bytes"
            if exc.reason == "bytes"
            else f"more than {exc.limit} units of work"
        )
        raise ValidationFailed(
            f"{req.type} v{exc.version} would take {what} to make from v{req.version} "
            "(KURIR_MAX_PAYLOAD_BYTES bounds every version made); send it as a rendition",
            code="version_too_large",
            details={"version": exc.version, "reason": exc.reason, "limit": exc.limit},
        ) from None
    except event_types.VersionInvalid as exc:
        raise ValidationFailed(
            f"{req.type} v{exc.version} made by {exc.source} does not match its schema",
            code="version_invalid",
            details={"version": exc.version, "source": exc.source, "errors": exc.errors},
        ) from None
    except event_types.VersionUnavailable:
        # Which pins cannot be served is structure alone: nothing is run again per endpoint.
        reach = event_types.reachable(
            {v: row.downgrade is not None for v, row in versions.items()},
            req.version,
            set(req.renditions) & set(versions),
        )
        missing = [
            {"endpoint": endpoint_id, "version": version}
            for endpoint_id, version in sorted(wanted.items())
            if version not in reach
        ]
        unknown = sorted(set(req.renditions) - set(versions))
        if unknown and not missing:
            raise ValidationFailed(
                f"renditions name version(s) of {req.type} that are not registered: "
                f"{', '.join(map(str, unknown))}",
                code="unknown_event_type",
                details={"type": req.type, "versions": unknown},
            ) from None
        raise ValidationFailed(
            f"{req.type} v{req.version} cannot be turned into the version(s) some endpoints "
            "are pinned to (no rendition, no chain of at most "
            f"{event_types.MAX_DOWNGRADE_HOPS} downgrades, and never upwards): "
            + ", ".join(f"{m['endpoint']} needs v{m['version']}" for m in missing),
            code="version_unavailable",
            details={"endpoints": missing},
        ) from None


def make_plan(
    targets: Targets,
    req: PublishRequest,
    partner_uid: str,
    now: datetime,
    load_versions: VersionsLoader,
    *,
    max_bytes: int,
    excluded: frozenset[str] | None = None,
) -> Plan:
    """Judge `data` by its contract, make the versions pinned endpoints need (each at most
    `max_bytes` of JSON), and lay out the rows to write. Without pins or renditions no other
    version is looked at. Endpoints whose filter does not match (`excluded`, evaluated here
    unless the caller did) get no delivery and are left out of the answer."""
    contract = contract_of(targets, req)
    errors = event_types.data_errors(contract.validator, req.data)
    if errors:
        raise ValidationFailed(
            f"data does not match the schema of {req.type} v{req.version}",
            code="schema_validation_failed",
            details=errors,
        )
    if excluded is None:
        excluded = filtered_out(targets, req)
    wanted = wanted_versions(targets, req, excluded)
    made: dict[int, tuple[dict[str, Any], str]] = {}
    family: dict[int, event_types.Version] = {}
    if wanted or req.renditions:
        family = load_versions(req.type)
        made = _produce(req, wanted, family, max_bytes)

    event_id = new_id("evt")
    occurred_at = req.occurred_at or now
    resource = req.resource or {}
    event_values = {
        "id": event_id,
        "partner_id": targets.partner_id,
        "type": req.type,
        "version": req.version,
        "data": req.data,
        "payload": payload_json(event_id, req, partner_uid, occurred_at),
        "occurred_at": occurred_at,
        "resource_type": resource.get("type"),
        "resource_id": resource.get("id"),
        "resource_version": resource.get("version"),
        "correlation_id": req.correlation_id,
        "ordering_key": req.ordering_key,
        "created_at": now,
        # The publish span's context (None while tracing is off): attempts join its trace.
        "trace_context": telemetry.traceparent(),
    }
    pending: list[Planned] = []
    parked: list[Planned] = []
    held: list[str] = []
    answer: list[dict[str, Any]] = []
    for endpoint_id, state, subscribed, _, mode in targets.endpoints:
        if subscribed is not None and req.type not in subscribed:
            continue
        if mode == EndpointMode.PULL:
            # Nothing is pushed to a pull endpoint: it reads the feed. Its pin still counts
            # above, so the version it wants is stored with the event.
            continue
        if endpoint_id in excluded:
            continue  # its filter does not match this event
        delivery_id = new_id("dlv")
        enabled = state in (EndpointState.ENABLED, EndpointState.PENDING_VERIFICATION)
        if state == EndpointState.PENDING_VERIFICATION:
            held.append(delivery_id)
        version = wanted.get(endpoint_id)
        (pending if enabled else parked).append((delivery_id, endpoint_id, version))
        answer.append(
            {
                "id": delivery_id,
                "endpoint": endpoint_id,
                "state": PENDING if enabled else DEAD,
                "version": req.version if version is None else version,
            }
        )
    versions = [
        {
            "event_id": event_id,
            "version": version,
            "data": data,
            "source": source,
            "payload": payload_json(event_id, req, partner_uid, occurred_at, version, data),
        }
        for version, (data, source) in sorted(made.items())
    ]
    warnings = (
        published_warnings(req, contract.deprecated, targets.sunset_at)
        if not family
        else [
            deprecation_warning(
                req.type,
                number,
                family[number].sunset_at,
                sorted(e for e, v in wanted.items() if v == number),
            )
            for number in sorted({req.version, *wanted.values()}, reverse=True)
            if family[number].deprecated
        ]
    )
    response = {
        "id": event_id,
        "type": req.type,
        "version": req.version,
        "deliveries": answer,
        "warnings": warnings,
    }
    ordered = (
        []
        if req.ordering_key is None
        else [
            endpoint_id for _, endpoint_id, _ in pending + parked if endpoint_id in targets.ordered
        ]
    )
    return Plan(event_values, pending, parked, response, versions, ordered, held)
