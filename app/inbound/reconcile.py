"""Reconciliation: pull a provider's current state and apply it as the newest snapshot.

Webhooks say "something changed"; the provider's API says what is true. For a source with a
``reconcile_url``:

- every quarantine (version gap, contradiction) files a :class:`ReconcileRequest` for that
  resource, fetched as ``GET {url}?resource_id=<id>`` → ``{id, version, status, …}``;
- a scheduled pass (``KURIR_RECONCILE_CRON``, nightly by default) files one *sweep* request
  per source (``resource_id`` NULL), fetched as ``GET {url}?since=<RFC 3339>`` → a list of
  snapshots (or ``{"data": [...], "next_cursor": …}``, followed with ``cursor=``), and one
  request per resource that still has quarantined events.

A snapshot moves the state forward only: its version must be at least the applied one (the
provider's word corrects the status at the same version), else it changes nothing. Then the
resource's quarantined events are resolved, oldest first: one newer than the state is applied,
the rest ignored, both with reason ``reconciled``.

Transient failures (connection errors, timeouts, 408/429/5xx) retry with the backoff
``BACKOFF_S`` through ``next_attempt_at``; after the last step, or at once for a permanent
failure (another 4xx, a body that is not a snapshot), the request ends ``failed`` with the
error kept. Requests are run by RQ jobs (:func:`run_request`) and picked up again by the
periodic :func:`process_due`, so a lost job or a killed worker only delays them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, cast
from urllib.parse import urlencode, urlsplit, urlunsplit

from sqlalchemy import Table, or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from app import __version__, jsonstrict
from app import runtime as runtime_mod
from app.clock import isoformat, utcnow
from app.config import Settings
from app.db import after_commit
from app.inbound import handlers as handler_registry
from app.inbound import state as states
from app.inbound.mapping import Extracted, FieldMapping, MappingError, extract
from app.models import InboundEvent, InboundSource, ReconcileRequest, ResourceState
from app.net import guard, http
from app.net.http import Transport
from app.queues import INBOUND, JobSpec, try_enqueue_many
from app.runtime import Runtime

log = logging.getLogger(__name__)
# Core table for the conditional statements (typed as a Table for mypy).
_REQUESTS = cast(Table, ReconcileRequest.__table__)

PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
BACKOFF_S = (10, 60, 300, 1800, 7200)
MAX_ATTEMPTS = len(BACKOFF_S) + 1
RUNNING_LEASE_S = 300
FETCH_TIMEOUT_S = 10.0
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
MAX_PAGES = 100
RUN_JOB = "app.inbound.reconcile.run_request"
RECONCILED = "reconciled"

# The snapshot contract: {id, version, status, updated_at?, type?}.
SNAPSHOT_MAPPING = FieldMapping(
    event_id=None,
    event_type=None,
    resource_id="/id",
    resource_version="/version",
    occurred_at="/updated_at | /occurred_at",
    status="/status",
    resource_type="/type",
)


class FetchError(Exception):
    """A pull that did not give a usable answer; ``transient`` ones are retried."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class Outcome:
    request_id: str
    state: str
    applied: int = 0
    resolved: int = 0
    error: str | None = None


# ------------------------------------------------------------------------------ URL and fetch


def check_reconcile_url(url: str, settings: Settings) -> None:
    """Vet a pull URL with the SSRF guard the sender uses; ValueError says why not.

    A host that does not resolve yet is accepted: every pull resolves and vets it again.
    """
    try:
        guard.check_url(url, guard.policy_from(settings))
    except guard.BlockedAddress as exc:
        raise ValueError(str(exc)) from None
    except guard.ResolutionError as exc:
        log.info("reconcile_url host does not resolve yet: %s", exc)


def fetch_json(
    transport: Transport,
    url: str,
    params: dict[str, str],
    settings: Settings,
    timeout_s: float = FETCH_TIMEOUT_S,
) -> Any:
    """GET a JSON document within a total deadline, without following redirects, from the
    address the SSRF guard checked (a name that resolves elsewhere on a second lookup cannot
    steer the request inside).

    Raises:
        FetchError: transient for network errors, 408, 429 and 5xx; permanent otherwise.
    """
    answer = transport.send(
        "GET",
        _with_query(url, params),
        None,
        {"Accept": "application/json", "User-Agent": f"Kurir/{__version__}"},
        timeout_s,
        guard.policy_from(settings),
        connect_timeout_s=settings.connect_timeout_s,
        max_body_bytes=MAX_RESPONSE_BYTES,
    )
    if answer.error in (http.ERROR_BLOCKED, http.ERROR_INVALID_URL):
        raise FetchError(f"reconcile_url refused: {answer.error_detail}", transient=False)
    if answer.error is not None:
        raise FetchError(f"{answer.error}: {(answer.error_detail or '')[:300]}", transient=True)
    status = cast(int, answer.status)
    body = answer.body
    if answer.truncated:
        raise FetchError(f"response larger than {MAX_RESPONSE_BYTES} bytes", transient=False)
    if not 200 <= status <= 299:
        transient = status in (408, 425, 429) or status >= 500
        raise FetchError(
            f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}", transient=transient
        )
    try:
        # Strict, as for callbacks: NaN or a lone surrogate cannot be stored with the state.
        return jsonstrict.loads(body)
    except jsonstrict.InvalidJSON as exc:
        raise FetchError(f"response is not JSON: {exc}", transient=False) from None


def _with_query(url: str, params: dict[str, str]) -> str:
    """The URL with `params` added to whatever query it already has."""
    parts = urlsplit(url)
    extra = urlencode(params)
    query = f"{parts.query}&{extra}" if parts.query and extra else parts.query or extra
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


def parse_snapshot(document: Any) -> tuple[Extracted, dict[str, Any]]:
    """One snapshot object (optionally wrapped in ``{"data": …}``), typed.

    Raises:
        FetchError: permanent, when it is not a snapshot with an id.
    """
    if (
        isinstance(document, dict)
        and isinstance(document.get("data"), dict)
        and "id" not in document
    ):
        document = document["data"]
    if not isinstance(document, dict):
        raise FetchError("snapshot is not a JSON object", transient=False)
    try:
        snapshot = extract(SNAPSHOT_MAPPING, [], document)
    except MappingError as exc:
        raise FetchError(f"snapshot is invalid: {exc}", transient=False) from None
    if snapshot.resource_id is None:
        raise FetchError("snapshot has no id", transient=False)
    return snapshot, document


# ------------------------------------------------------------------------------ filing requests


class HasPullApi(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def reconcile_url(self) -> str | None: ...


def request_reconcile(
    session: Session, source: HasPullApi, resource_id: str | None, *, now: datetime | None = None
) -> ReconcileRequest | None:
    """File a pull for one resource (or a sweep); None when the source has no pull API.

    A request already waiting for the same resource is reused rather than duplicated.
    """
    if not source.reconcile_url:
        return None
    match = (
        ReconcileRequest.resource_id.is_(None)
        if resource_id is None
        else ReconcileRequest.resource_id == resource_id
    )
    existing = session.scalar(
        select(ReconcileRequest)
        .where(
            ReconcileRequest.source_id == source.id,
            match,
            ReconcileRequest.state.in_((PENDING, RUNNING)),
        )
        .limit(1)
    )
    if existing is not None:
        return existing
    request = ReconcileRequest(
        source_id=source.id, resource_id=resource_id, state=PENDING, next_attempt_at=now or utcnow()
    )
    session.add(request)
    session.flush()
    return request


def enqueue_after_commit(session: Session, runtime: Runtime, request_ids: Iterable[str]) -> None:
    ids = list(request_ids)
    if not ids:
        return
    redis = runtime.redis
    after_commit(
        session,
        lambda: try_enqueue_many(
            redis, [JobSpec(INBOUND, RUN_JOB, (request_id,)) for request_id in ids]
        ),
    )


# ------------------------------------------------------------------------------ running them


def run_request(
    request_id: str,
    runtime: Runtime | None = None,
    *,
    force: bool = False,
    now: datetime | None = None,
) -> Outcome | None:
    """RQ job: claim, fetch, apply; None when another run has it or it is not due yet."""
    rt = runtime or runtime_mod.current()
    claimed = _claim(rt, request_id, force=force, now=now)
    if claimed is None:
        return None
    source_url, resource_id, attempts, since = claimed
    try:
        documents = _fetch(source_url, resource_id, since, rt.settings)
    except FetchError as exc:
        return _record_failure(rt, request_id, str(exc), exc.transient, attempts, now=now)
    try:
        with rt.db.begin() as session:
            applied, resolved = _apply_all(session, rt, request_id, resource_id, documents, now=now)
            _set(session, request_id, state=DONE, last_error=None, now=now)
    except FetchError as exc:
        return _record_failure(rt, request_id, str(exc), False, attempts, now=now)
    except SQLAlchemyError:
        log.warning(
            "reconcile: database unavailable, left for the next pass",
            extra={"reconcile_request_id": request_id},
            exc_info=True,
        )
        return None
    except Exception as exc:
        log.exception(
            "reconcile: applying the snapshot failed", extra={"reconcile_request_id": request_id}
        )
        return _record_failure(
            rt, request_id, f"{type(exc).__name__}: {exc}"[:2000], False, attempts, now=now
        )
    log.info(
        "reconciled",
        extra={"reconcile_request_id": request_id, "applied": applied, "resolved": resolved},
    )
    return Outcome(request_id, DONE, applied=applied, resolved=resolved)


def _claim(
    rt: Runtime, request_id: str, *, force: bool, now: datetime | None
) -> tuple[str, str | None, int, datetime | None] | None:
    now = now or utcnow()
    col = _REQUESTS.c
    due = (
        or_(col.state == PENDING, col.state == FAILED)
        if force
        else (col.state == PENDING) & (col.next_attempt_at <= now)
    )
    expired = (col.state == RUNNING) & (col.updated_at < now - timedelta(seconds=RUNNING_LEASE_S))
    with rt.db.begin() as session:
        result = session.execute(
            update(_REQUESTS)
            .where(col.id == request_id, or_(due, expired))
            .values(state=RUNNING, attempts=col.attempts + 1, updated_at=now)
        )
        if not result.rowcount:  # type: ignore[attr-defined]
            return None
        request = session.get(ReconcileRequest, request_id)
        assert request is not None  # noqa: S101 - just updated
        source = session.get(InboundSource, request.source_id)
        if source is None or not source.reconcile_url:
            _set(
                session, request_id, state=FAILED, last_error="source has no reconcile_url", now=now
            )
            return None
        since: datetime | None = None
        if request.resource_id is None:
            since = (
                session.scalar(
                    select(ReconcileRequest.created_at)
                    .where(
                        ReconcileRequest.source_id == source.id,
                        ReconcileRequest.resource_id.is_(None),
                        ReconcileRequest.state == DONE,
                    )
                    .order_by(ReconcileRequest.created_at.desc())
                    .limit(1)
                )
                or source.created_at
            )
        return source.reconcile_url, request.resource_id, request.attempts, since


def _fetch(
    url: str, resource_id: str | None, since: datetime | None, settings: Settings
) -> list[Any]:
    with Transport(pool_maxsize=1, max_sessions=1, resolver_threads=1) as transport:
        if resource_id is not None:
            return [fetch_json(transport, url, {"resource_id": resource_id}, settings)]
        return _fetch_sweep(transport, url, since, settings)


def _fetch_sweep(
    transport: Transport, url: str, since: datetime | None, settings: Settings
) -> list[Any]:
    documents: list[Any] = []
    params = {"since": isoformat(since) or ""}
    for _ in range(MAX_PAGES):
        page = fetch_json(transport, url, params, settings)
        cursor = None
        if isinstance(page, dict) and isinstance(page.get("data"), list):
            documents.extend(page["data"])
            cursor = page.get("next_cursor")
        elif isinstance(page, list):
            documents.extend(page)
        else:
            raise FetchError("a since= sweep must answer a list or {data: [...]}", transient=False)
        if not cursor or not isinstance(cursor, str):
            break
        params = {"since": params["since"], "cursor": cursor}
    return documents


def _apply_all(
    session: Session,
    rt: Runtime,
    request_id: str,
    resource_id: str | None,
    documents: list[Any],
    *,
    now: datetime | None,
) -> tuple[int, int]:
    request = session.get(ReconcileRequest, request_id)
    assert request is not None  # noqa: S101 - claimed above
    source = session.get(InboundSource, request.source_id)
    assert source is not None  # noqa: S101 - checked by the claim
    applied = resolved = 0
    for document in documents:
        try:
            snapshot, raw = parse_snapshot(document)
        except FetchError:
            if resource_id is not None:
                raise
            # One bad record in a sweep must not block every other resource, every night.
            log.warning(
                "reconcile sweep: skipped an invalid snapshot",
                extra={"reconcile_request_id": request_id},
            )
            continue
        if resource_id is not None and snapshot.resource_id != resource_id:
            raise FetchError(
                f"snapshot is for {snapshot.resource_id!r}, asked for {resource_id!r}",
                transient=False,
            )
        a, r = apply_snapshot(session, source, snapshot, raw, now=now)
        applied += a
        resolved += r
    return applied, resolved


def apply_snapshot(
    session: Session,
    source: InboundSource,
    snapshot: Extracted,
    document: dict[str, Any],
    *,
    now: datetime | None = None,
) -> tuple[int, int]:
    """Apply one provider snapshot, then resolve the resource's quarantined events.

    Returns (state rows moved, events resolved).
    """
    assert snapshot.resource_id is not None  # noqa: S101 - parse_snapshot checks
    now = now or utcnow()
    resource_id = snapshot.resource_id
    ordering = states.Ordering(snapshot.resource_version, snapshot.occurred_at, snapshot.status)
    quarantined = list(
        session.scalars(
            select(InboundEvent)
            .where(
                InboundEvent.source_id == source.id,
                InboundEvent.resource_id == resource_id,
                InboundEvent.status == "quarantined",
            )
            .with_for_update()
        )
    )
    types = _resource_types(session, source.id, resource_id, snapshot.resource_type, quarantined)
    connection = session.connection()
    moved = 0
    for resource_type in types:
        state = states.ensure_state(connection, source.id, resource_type, resource_id, lock=True)
        if states.compare_and_set(
            connection,
            state.id,
            ordering,
            last_event_id=None,
            data=document,
            allow_equal=True,
            now=now,
        ):
            moved += 1
    resolved = 0
    quarantined.sort(
        key=lambda e: (
            e.resource_version is None,
            e.resource_version or 0,
            e.occurred_at or now,
            e.id,
        )
    )
    for event in quarantined:
        if (event.resource_type or "") not in types:
            continue
        state = states.ensure_state(
            connection, source.id, event.resource_type, resource_id, lock=True
        )
        ordering_of_event = states.Ordering(
            event.resource_version, event.occurred_at, event.resource_status or event.event_type
        )
        decision = states.decide(ordering_of_event, state, allow_gaps=True)
        event.reason = RECONCILED
        event.processed_at = now
        if decision.kind == states.APPLY and states.compare_and_set(
            connection, state.id, ordering_of_event, last_event_id=event.id, now=now
        ):
            event.status = "applied"
            handler_registry.run_handlers(
                handler_registry.HandlerContext(
                    session=session,
                    source=source,
                    event=event,
                    state=session.get(ResourceState, state.id, populate_existing=True),
                )
            )
        else:
            event.status = "ignored"
        resolved += 1
    return moved, resolved


def _resource_types(
    session: Session,
    source_id: str,
    resource_id: str,
    snapshot_type: str | None,
    quarantined: list[InboundEvent],
) -> list[str]:
    """Which state rows a snapshot speaks for: its own type, else those we know of."""
    if snapshot_type:
        return [snapshot_type]
    known = set(
        session.scalars(
            select(ResourceState.resource_type).where(
                ResourceState.source_id == source_id, ResourceState.resource_id == resource_id
            )
        )
    )
    known.update(e.resource_type or "" for e in quarantined)
    return sorted(known) or [""]


def _set(
    session: Session,
    request_id: str,
    *,
    state: str,
    last_error: str | None,
    now: datetime | None,
    next_attempt_at: datetime | None = None,
) -> None:
    values: dict[str, Any] = {
        "state": state,
        "last_error": last_error,
        "updated_at": now or utcnow(),
    }
    if next_attempt_at is not None:
        values["next_attempt_at"] = next_attempt_at
    session.execute(update(_REQUESTS).where(_REQUESTS.c.id == request_id).values(**values))


def _record_failure(
    rt: Runtime,
    request_id: str,
    error: str,
    transient: bool,
    attempts: int,
    *,
    now: datetime | None,
) -> Outcome:
    now = now or utcnow()
    if transient and attempts < MAX_ATTEMPTS:
        delay = BACKOFF_S[min(attempts, len(BACKOFF_S)) - 1]
        state, when = PENDING, now + timedelta(seconds=delay)
    else:
        state, when = FAILED, None
    try:
        with rt.db.begin() as session:
            _set(
                session,
                request_id,
                state=state,
                last_error=error[:2000],
                now=now,
                next_attempt_at=when,
            )
    except SQLAlchemyError:
        log.warning(
            "reconcile: could not record a failure; the lease will expire",
            extra={"reconcile_request_id": request_id},
        )
    log.warning(
        "reconcile failed (%s): %s",
        "will retry" if state == PENDING else "giving up",
        error,
        extra={"reconcile_request_id": request_id},
    )
    return Outcome(request_id, state, error=error)


# ------------------------------------------------------------------------------ periodic passes


def process_due(runtime: Runtime, *, now: datetime | None = None, limit: int = 500) -> int:
    """Periodic: enqueue every request that is due (or whose run was abandoned)."""
    now = now or utcnow()
    with runtime.db.begin() as session:
        ids = list(
            session.scalars(
                select(ReconcileRequest.id)
                .where(
                    or_(
                        (ReconcileRequest.state == PENDING)
                        & (ReconcileRequest.next_attempt_at <= now),
                        (ReconcileRequest.state == RUNNING)
                        & (ReconcileRequest.updated_at < now - timedelta(seconds=RUNNING_LEASE_S)),
                    )
                )
                .order_by(ReconcileRequest.next_attempt_at)
                .limit(limit)
            )
        )
    if ids:
        try_enqueue_many(runtime.redis, [JobSpec(INBOUND, RUN_JOB, (i,)) for i in ids])
    return len(ids)


def file_scheduled(
    runtime: Runtime, *, source_name: str | None = None, now: datetime | None = None
) -> list[str]:
    """File a sweep for each source with a pull API, plus one per still-quarantined resource."""
    now = now or utcnow()
    filed: list[str] = []
    with runtime.db.begin() as session:
        stmt = select(InboundSource).where(InboundSource.reconcile_url.is_not(None))
        if source_name is not None:
            stmt = stmt.where(InboundSource.name == source_name)
        for source in session.scalars(stmt):
            sweep = request_reconcile(session, source, None, now=now)
            if sweep is not None:
                filed.append(sweep.id)
            resources = session.scalars(
                select(InboundEvent.resource_id)
                .where(
                    InboundEvent.source_id == source.id,
                    InboundEvent.status == "quarantined",
                    InboundEvent.resource_id.is_not(None),
                )
                .distinct()
            )
            for resource_id in list(resources):
                request = request_reconcile(session, source, resource_id, now=now)
                if request is not None:
                    filed.append(request.id)
    return filed


def scheduled_reconcile(runtime: Runtime) -> int:
    """The cron job: file the scheduled requests and hand them to the workers."""
    ids = file_scheduled(runtime)
    if ids:
        try_enqueue_many(runtime.redis, [JobSpec(INBOUND, RUN_JOB, (i,)) for i in ids])
    return len(ids)


def reconcile_now(
    runtime: Runtime, *, source_name: str | None = None, now: datetime | None = None
) -> list[Outcome]:
    """`kurir inbound reconcile`: file and run everything in this process, due or not."""
    ids = file_scheduled(runtime, source_name=source_name, now=now)
    with runtime.db.begin() as session:
        stmt = (
            select(ReconcileRequest.id)
            .join(InboundSource, InboundSource.id == ReconcileRequest.source_id)
            .where(ReconcileRequest.state == PENDING)
        )
        if source_name is not None:
            stmt = stmt.where(InboundSource.name == source_name)
        for request_id in session.scalars(stmt):
            if request_id not in ids:
                ids.append(request_id)
    outcomes = []
    for request_id in ids:
        outcome = run_request(request_id, runtime, force=True, now=now)
        if outcome is not None:
            outcomes.append(outcome)
    return outcomes
