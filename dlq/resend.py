"""Resending dead letters: one, a list of ids, or everything matching a filter.

A resend re-arms the same delivery (same event, so the same `webhook-id`) for a new run with a
fresh attempt budget; the delivery engine signs it at send time with the endpoint's current
secret and a fresh timestamp. Whoever flips a letter from `open` to `resent` with a conditional
UPDATE wins; a concurrent second resend finds nothing to flip, so two operators clicking at
once produce one new run, not two.

Small resends happen in the caller's transaction. Large ones (a filter, or many ids) become a
`ResendJob` processed in pages by an RQ job on the default queue (or in-process by the
CLI), each page its own transaction, with progress an operator can watch.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import redis
from sqlalchemy import and_, func, insert, select, update
from sqlalchemy.orm import Session

from app.clock import utcnow
from app.db import after_commit
from app.errors import Conflict, NotFound, ValidationFailed
from app.ids import new_id
from app.models import (
    DEAD,
    DELIVERING,
    DL_OPEN,
    DL_RESENT,
    PENDING,
    RETRYING,
    SUCCEEDED,
    DeadLetter,
    DeadLetterAudit,
    Delivery,
    Endpoint,
    Event,
    ResendJob,
)
from app.queues import DEFAULT, DLQ_BULK_RESEND, JobSpec, enqueue_after_commit, try_enqueue_many
from app.runtime import Runtime
from app.vocabulary import DisabledBy, EndpointState, ResendJobState, ResendSkip
from dlq.audit import audit_row
from dlq.search import DeadLetterFilter, conditions, count, newest_id
from sender.dispatch import job_specs

log = logging.getLogger(__name__)

# Up to this many ids are resent inside the request; more go to a background job.
INLINE_LIMIT = 50
PAGE_SIZE = 200
MAX_IDS = 10_000
BULK_KIND = "resend"

# Why a letter was not resent (also the API error codes of a single resend).
_MESSAGES = {
    ResendSkip.NOT_FOUND: "no such dead letter",
    ResendSkip.NOT_OPEN: "this dead letter is no longer open (already resent or discarded)",
    ResendSkip.ENDPOINT_DISABLED: "the endpoint is disabled: enable it first, or resend with "
    "force=true",
    ResendSkip.ENDPOINT_DELETED: "the endpoint was deleted; this letter can only be discarded",
    ResendSkip.DISABLED_BY_OPERATOR: "the publisher's operators disabled this endpoint: only "
    "they can resend to it",
}


@dataclass
class PageResult:
    """What one page of a resend did."""

    resent: list[str] = field(default_factory=list)  # dead letter ids
    delivery_ids: list[str] = field(default_factory=list)
    skipped: dict[str, ResendSkip] = field(default_factory=dict)  # dead letter id -> why not


def _tag() -> str:
    # Part of the delivery job id: a resend must not collide with the job of an earlier run.
    return "r" + secrets.token_hex(4)


def rearm(
    session: Session,
    letter_ids: Sequence[str],
    *,
    actor: str,
    force: bool = False,
    now: datetime | None = None,
    operation_id: str | None = None,
    actor_partner_id: str | None = None,
) -> PageResult:
    """Flip open letters to `resent` and their deliveries back to `pending`, in this session.

    Letters that are not open, or whose endpoint is disabled (unless `force`; a partner's own
    credentials, `actor_partner_id`, never force past an operator's disable) or deleted, are
    skipped with a reason. Nothing is enqueued here; see `enqueue`.
    """
    now = now or utcnow()
    result = PageResult()
    ids = list(dict.fromkeys(letter_ids))
    if not ids:
        return result
    rows = session.execute(
        select(
            DeadLetter.id,
            DeadLetter.state,
            Endpoint.state,
            Endpoint.deleted_at,
            Endpoint.disabled_by,
        )
        .join(Endpoint, Endpoint.id == DeadLetter.endpoint_id)
        .where(DeadLetter.id.in_(ids))
    ).all()
    found = {row[0]: row for row in rows}
    eligible: list[str] = []
    forced: set[str] = set()
    for letter_id in ids:
        row = found.get(letter_id)
        if row is None:
            result.skipped[letter_id] = ResendSkip.NOT_FOUND
        elif row[1] != DL_OPEN:
            result.skipped[letter_id] = ResendSkip.NOT_OPEN
        elif row[3] is not None:
            result.skipped[letter_id] = ResendSkip.ENDPOINT_DELETED
        elif row[2] != EndpointState.ENABLED and not force:
            result.skipped[letter_id] = ResendSkip.ENDPOINT_DISABLED
        elif (
            row[2] != EndpointState.ENABLED
            and actor_partner_id is not None
            and row[4] == DisabledBy.OPERATOR
        ):
            # Forcing is the partner's to do on its own or Kurir's disable, not an operator's.
            result.skipped[letter_id] = ResendSkip.DISABLED_BY_OPERATOR
        else:
            eligible.append(letter_id)
            if row[2] != EndpointState.ENABLED:
                forced.add(letter_id)
    if not eligible:
        return result
    # The conditional UPDATE is the lock: a concurrent resend of the same letter waits for this
    # transaction and then matches nothing, because the letter is no longer open.
    flipped = session.execute(
        update(DeadLetter)
        .where(DeadLetter.id.in_(eligible), DeadLetter.state == DL_OPEN)
        .values(state=DL_RESENT, resolved_at=now, updated_at=now)
        .returning(DeadLetter.id, DeadLetter.delivery_id)
        .execution_options(synchronize_session=False)
    ).all()
    won = {letter_id: delivery_id for letter_id, delivery_id in flipped}
    for letter_id in eligible:
        if letter_id not in won:
            result.skipped[letter_id] = ResendSkip.NOT_OPEN
    if not won:
        return result
    # A forced run is sent although its endpoint is disabled; once, as a failure finds the
    # endpoint still disabled and parks the delivery again.
    forced_deliveries = [won[letter_id] for letter_id in forced if letter_id in won]
    rearmed = session.execute(
        update(Delivery)
        .where(Delivery.id.in_(list(won.values())), Delivery.state == DEAD)
        .values(
            state=PENDING,
            run=Delivery.run + 1,
            run_attempts=0,
            next_attempt_at=now,
            lease_expires_at=None,
            updated_at=now,
            forced=Delivery.id.in_(forced_deliveries) if forced_deliveries else False,
        )
        .returning(Delivery.id, Delivery.run, Delivery.state)
        .execution_options(synchronize_session=False)
    ).all()
    runs = {delivery_id: run for delivery_id, run, _ in rearmed}
    audits: list[dict[str, Any]] = []
    for letter_id, delivery_id in won.items():
        result.resent.append(letter_id)
        if delivery_id in runs:
            result.delivery_ids.append(delivery_id)
            outcome = f"resent as run {runs[delivery_id]}"
            if letter_id in forced:
                outcome += " (forced: endpoint disabled)"
        else:
            # Someone already brought the delivery back (e.g. a manual retry): just close.
            outcome = "closed: delivery was no longer dead"
        audits.append(
            audit_row(
                letter_id,
                actor,
                "resend",
                outcome,
                now,
                operation_id=operation_id,
                actor_partner_id=actor_partner_id,
            )
        )
    session.execute(insert(DeadLetterAudit), audits)
    # The ORM may hold these rows from before the Core UPDATEs; make it re-read them.
    for obj in list(session.identity_map.values()):
        if isinstance(obj, DeadLetter | Delivery):
            session.expire(obj)
    return result


def audit_skips(
    session: Session,
    skipped: Mapping[str, str],
    *,
    actor: str,
    now: datetime | None = None,
    operation_id: str | None = None,
    actor_partner_id: str | None = None,
) -> None:
    """Record, on each letter that exists, why a bulk resend left it alone."""
    now = now or utcnow()
    rows = [
        audit_row(
            letter_id,
            actor,
            "resend",
            f"skipped: {reason}",
            now,
            operation_id=operation_id,
            actor_partner_id=actor_partner_id,
        )
        for letter_id, reason in skipped.items()
        if reason != ResendSkip.NOT_FOUND
    ]
    if rows:
        session.execute(insert(DeadLetterAudit), rows)


def enqueue(session: Session, connection: redis.Redis, result: PageResult) -> None:
    """Queue the re-armed deliveries once the transaction has committed."""
    enqueue_after_commit(session, connection, job_specs(result.delivery_ids, tag=_tag()))


def resend_one(
    session: Session,
    connection: redis.Redis,
    letter_id: str,
    *,
    actor: str,
    force: bool = False,
    now: datetime | None = None,
    actor_partner_id: str | None = None,
) -> DeadLetter:
    """Resend one letter or say precisely why not.

    Raises:
        NotFound: no such letter.
        Conflict: `dead_letter_not_open`, `endpoint_disabled` (unless `force`),
            `endpoint_deleted`.
    """
    result = rearm(
        session, [letter_id], actor=actor, force=force, now=now, actor_partner_id=actor_partner_id
    )
    reason = result.skipped.get(letter_id)
    if reason == ResendSkip.NOT_FOUND:
        raise NotFound(f"dead letter {letter_id} not found")
    if reason is not None:
        raise Conflict(_MESSAGES[reason], code=reason, details={"dead_letter": letter_id})
    enqueue(session, connection, result)
    return session.get_one(DeadLetter, letter_id)


def resend_ids_inline(
    session: Session,
    connection: redis.Redis,
    letter_ids: Sequence[str],
    *,
    actor: str,
    force: bool = False,
    now: datetime | None = None,
    operation_id: str | None = None,
    actor_partner_id: str | None = None,
) -> PageResult:
    """Resend a short list of letters in the caller's transaction; skips are audited.

    `operation_id` is the id `record_inline` will give the job that reports it.
    """
    result = rearm(
        session,
        letter_ids,
        actor=actor,
        force=force,
        now=now,
        operation_id=operation_id,
        actor_partner_id=actor_partner_id,
    )
    audit_skips(
        session,
        result.skipped,
        actor=actor,
        now=now,
        operation_id=operation_id,
        actor_partner_id=actor_partner_id,
    )
    enqueue(session, connection, result)
    return result


def record_inline(
    session: Session,
    result: PageResult,
    letter_ids: Sequence[str],
    *,
    actor: str,
    force: bool = False,
    now: datetime | None = None,
    operation_id: str | None = None,
    key_id: str | None = None,
    actor_partner_id: str | None = None,
) -> ResendJob:
    """A finished ResendJob for a resend done inline, so every bulk call has a job id."""
    now = now or utcnow()
    ids = list(dict.fromkeys(letter_ids))
    job = ResendJob(
        id=operation_id or new_id("bop"),
        kind=BULK_KIND,
        actor=actor[:320],
        key_id=key_id,
        actor_partner_id=actor_partner_id,
        state=ResendJobState.SUCCEEDED,
        total=len(ids),
        done=len(result.resent),
        failed=len(result.skipped),
        params={
            "ids": ids,
            "force": bool(force),
            "skipped": dict(Counter(result.skipped.values())),
        },
        created_at=now,
        updated_at=now,
        finished_at=now,
    )
    session.add(job)
    session.flush()
    return job


# ------------------------------------------------------------------------------ bulk


def _validate_ids(ids: Iterable[Any]) -> list[str]:
    clean = list(dict.fromkeys(str(i).strip() for i in ids if str(i).strip()))
    if not clean:
        raise ValidationFailed(
            "ids must be a non-empty list of dead letter ids",
            code="invalid_parameter",
            details={"parameter": "ids"},
        )
    if len(clean) > MAX_IDS:
        raise ValidationFailed(
            f"at most {MAX_IDS} ids per request; use a filter for more",
            code="invalid_parameter",
            details={"parameter": "ids"},
        )
    return clean


def start_bulk(
    session: Session,
    *,
    actor: str,
    ids: Sequence[str] | None = None,
    flt: DeadLetterFilter | None = None,
    force: bool = False,
    connection: redis.Redis | None = None,
    key_id: str | None = None,
    actor_partner_id: str | None = None,
    ordered: bool = False,
    purpose: str | None = None,
) -> ResendJob:
    """Record a background resend and, if `connection` is given, enqueue it after commit.

    A filter resends only open letters, and only those that exist now: letters parked after
    this moment are not swept up by it. `key_id` is the API key starting it (a partner key
    reads its own jobs by it), `actor_partner_id` the partner a partner-bound actor acts
    for; the job audits its letters with both its actor and that partner.

    `ordered` resends in publish order, one after the other: each letter is re-armed only
    once the one before has had its attempt (see `run_bulk`); the letters are fixed now.
    `purpose` says why the job runs (e.g. `recovery`), shown with its progress.
    """
    if (ids is None) == (flt is None):
        raise ValidationFailed("give either ids or a filter", code="invalid_parameter")
    params: dict[str, Any] = {"force": bool(force), "skipped": {}}
    if purpose:
        params["purpose"] = purpose[:64]
    if ordered:
        if flt is not None:
            flt = flt.with_state(DL_OPEN)
            where = conditions(flt)
        else:
            where = [DeadLetter.id.in_(_validate_ids(ids or ()))]
        params.update(ordered=True, position=0, ids=publish_order(session, where))
        total = len(params["ids"])
    elif flt is not None:
        if flt.state not in (None, DL_OPEN):
            raise ValidationFailed(
                "only open dead letters can be resent; drop the state filter or set it to open",
                code="invalid_parameter",
                details={"parameter": "state"},
            )
        flt = flt.with_state(DL_OPEN)
        max_id = newest_id(session)
        params.update(filter=flt.to_params(), max_id=max_id)
        total = count(session, flt, max_id=max_id) if max_id else 0
    else:
        clean = _validate_ids(ids or ())
        params["ids"] = sorted(clean, reverse=True)
        total = len(clean)
    job = ResendJob(
        kind=BULK_KIND,
        actor=actor[:320],
        key_id=key_id,
        actor_partner_id=actor_partner_id,
        params=params,
        total=total,
    )
    session.add(job)
    session.flush()
    if connection is not None:
        job_id = job.id
        after_commit(session, lambda: enqueue_bulk(connection, job_id))
    return job


def start_ordered(
    session: Session,
    items: Sequence[str],
    *,
    actor: str,
    purpose: str,
    connection: redis.Redis | None = None,
    key_id: str | None = None,
    actor_partner_id: str | None = None,
    details: Mapping[str, Any] | None = None,
) -> ResendJob:
    """An ordered resend job over `items` as given (already in publish order): dead letter
    ids (re-armed as any resend) and ids of deliveries still retrying (made due now, once).
    `details` are kept with the job's parameters (e.g. a recovery's window)."""
    params: dict[str, Any] = {
        "force": False,
        "skipped": {},
        "ordered": True,
        "position": 0,
        "ids": list(items),
        "purpose": purpose[:64],
        **(details or {}),
    }
    job = ResendJob(
        kind=BULK_KIND,
        actor=actor[:320],
        key_id=key_id,
        actor_partner_id=actor_partner_id,
        params=params,
        total=len(items),
    )
    session.add(job)
    session.flush()
    if connection is not None:
        job_id = job.id
        after_commit(session, lambda: enqueue_bulk(connection, job_id))
    return job


def due_now(session: Session, delivery_id: str, now: datetime) -> PageResult:
    """Make a delivery still retrying due now (its attempt budget is left as it is)."""
    result = PageResult()
    moved = session.execute(
        update(Delivery)
        .where(Delivery.id == delivery_id, Delivery.state == RETRYING)
        .values(next_attempt_at=now, updated_at=now)
        .returning(Delivery.id)
        .execution_options(synchronize_session=False)
    ).first()
    if moved is None:
        result.skipped[delivery_id] = ResendSkip.NOT_OPEN
    else:
        result.resent.append(delivery_id)
        result.delivery_ids.append(delivery_id)
    return result


def publish_order(session: Session, where: list[Any]) -> list[str]:
    """The ids of the letters matching `where`, in the order their events were published."""
    stmt = (
        select(DeadLetter.id)
        .join(Event, Event.id == DeadLetter.event_id)
        .where(and_(*where))
        .order_by(Event.created_at, Event.id, DeadLetter.id)
        .limit(MAX_IDS * 10)
    )
    return list(session.scalars(stmt))


def enqueue_bulk(connection: redis.Redis, resend_job_id: str) -> bool:
    """Put the resend job on the queue as an RQ job whose id derives from it (once only)."""
    return try_enqueue_many(
        connection,
        [
            JobSpec(
                DEFAULT,
                DLQ_BULK_RESEND,
                (resend_job_id,),
                job_id=f"bulk-{resend_job_id}",
                timeout_s=3600,
            )
        ],
    )


def run_bulk_job(resend_job_id: str) -> None:
    """RQ entry point: ids only in, the process Runtime for the stores."""
    from app import runtime as runtime_mod

    run_bulk(runtime_mod.current(), resend_job_id)


def _next_page(session: Session, job: ResendJob, cursor: str | None, page_size: int) -> list[str]:
    params = job.params
    if "ids" in params:
        ids = [i for i in params["ids"] if cursor is None or i < cursor]
        return ids[:page_size]
    flt = DeadLetterFilter.from_params(params.get("filter") or {})
    where = conditions(flt)
    if params.get("max_id"):
        where.append(DeadLetter.id <= params["max_id"])
    else:
        return []
    if cursor is not None:
        where.append(DeadLetter.id < cursor)
    stmt = select(DeadLetter.id).where(and_(*where)).order_by(DeadLetter.id.desc())
    return list(session.scalars(stmt.limit(page_size)))


def run_bulk(
    runtime: Runtime,
    job_id: str,
    *,
    page_size: int = PAGE_SIZE,
    progress: Callable[[int], None] | None = None,
    settle_s: float | None = None,
) -> ResendJob:
    """Process a bulk resend page by page; safe to run twice (it resumes from its cursor).

    An ordered job goes letter by letter instead (see `_run_ordered`).
    """
    db = runtime.db
    with db.begin() as session:
        job = session.get(ResendJob, job_id)
        if job is None:
            raise NotFound(f"resend job {job_id} not found")
        if job.state in (ResendJobState.SUCCEEDED, ResendJobState.FAILED):
            return job
        job.state = ResendJobState.RUNNING
        cursor = job.params.get("cursor")
        ordered = bool(job.params.get("ordered"))
    try:
        if ordered:
            _run_ordered(runtime, job_id, settle_s=settle_s, progress=progress)
        while not ordered:
            with db.begin() as session:
                job = session.get_one(ResendJob, job_id)
                page = _next_page(session, job, cursor, page_size)
                if not page:
                    break
                result = rearm(
                    session,
                    page,
                    actor=job.actor,
                    force=bool(job.params.get("force")),
                    operation_id=job_id,
                    actor_partner_id=job.actor_partner_id,
                )
                audit_skips(
                    session,
                    result.skipped,
                    actor=job.actor,
                    operation_id=job_id,
                    actor_partner_id=job.actor_partner_id,
                )
                enqueue(session, runtime.redis, result)
                cursor = page[-1]
                skipped = Counter(job.params.get("skipped") or {})
                skipped.update(result.skipped.values())
                job.params = {**job.params, "cursor": cursor, "skipped": dict(skipped)}
                job.done += len(result.resent)
                job.failed += len(result.skipped)
                job.updated_at = utcnow()
            if progress is not None:
                progress(len(page))
    except Exception as exc:
        # The log field keeps its first name: log queries may depend on it.
        log.exception("bulk resend failed", extra={"bulk_operation_id": job_id})
        with db.begin() as session:
            job = session.get_one(ResendJob, job_id)
            job.state = ResendJobState.FAILED
            job.error = f"{type(exc).__name__}: {exc}"[:2000]
            job.finished_at = utcnow()
        raise
    with db.begin() as session:
        job = session.get_one(ResendJob, job_id)
        job.state = ResendJobState.SUCCEEDED
        job.finished_at = utcnow()
    log.info(
        "bulk resend finished",
        extra={"bulk_operation_id": job_id, "resent": job.done, "skipped": job.failed},
    )
    return job


DELIVERY_PREFIX = "dlv_"
# How long an ordered resend waits for one re-armed delivery's attempt before it goes on
# with the next (a worker that never comes must not hold the rest for ever).
SETTLE_S = 120.0
_SETTLE_POLL_S = 0.02


def _run_ordered(
    runtime: Runtime,
    job_id: str,
    *,
    settle_s: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Re-arm the job's letters one at a time, in their stored (publish) order: the next
    only when the delivery before has had its attempt (succeeded, retrying or dead again),
    so the endpoint gets them one after the other, at whatever rate its limit allows.

    Each letter is its own transaction and moves `position` on, so a job resumed after a
    crash goes on where it stopped; a letter is never re-armed twice (it is no longer open).
    """
    db = runtime.db
    wait_s = SETTLE_S if settle_s is None else settle_s
    while True:
        with db.begin() as session:
            job = session.get_one(ResendJob, job_id)
            ids: list[str] = list(job.params.get("ids") or [])
            position = int(job.params.get("position") or 0)
            if position >= len(ids):
                return
            letter_id = ids[position]
            if letter_id.startswith(DELIVERY_PREFIX):  # a delivery still retrying
                result = due_now(session, letter_id, utcnow())
            else:
                result = rearm(
                    session,
                    [letter_id],
                    actor=job.actor,
                    force=bool(job.params.get("force")),
                    operation_id=job_id,
                    actor_partner_id=job.actor_partner_id,
                )
                audit_skips(
                    session,
                    result.skipped,
                    actor=job.actor,
                    operation_id=job_id,
                    actor_partner_id=job.actor_partner_id,
                )
            enqueue(session, runtime.redis, result)
            _count(job, position, result)
            # Read before the commit lets a worker at them: their attempt counts now.
            bases = dict(
                session.execute(
                    select(Delivery.id, Delivery.attempt_count).where(
                        Delivery.id.in_(result.delivery_ids)
                    )
                ).all()
            )
        for delivery_id in result.delivery_ids:
            _settle(runtime, delivery_id, int(bases.get(delivery_id) or 0), wait_s)
        if progress is not None:
            progress(1)


def _count(job: ResendJob, position: int, result: PageResult) -> None:
    """One item of an ordered job done: move its position and its counts on."""
    skipped = Counter(job.params.get("skipped") or {})
    skipped.update(result.skipped.values())
    job.params = {**job.params, "position": position + 1, "skipped": dict(skipped)}
    job.done += len(result.resent)
    job.failed += len(result.skipped)
    job.updated_at = utcnow()


def _settle(runtime: Runtime, delivery_id: str, attempts: int, wait_s: float) -> None:
    """Wait until a re-armed delivery has had its attempt (one more than `attempts` is
    recorded, or it is final)."""
    deadline = time.monotonic() + wait_s
    while True:
        with runtime.db.begin() as session:
            row = session.execute(
                select(Delivery.state, Delivery.attempt_count).where(Delivery.id == delivery_id)
            ).first()
        if (
            row is None
            or row[0] in (SUCCEEDED, DEAD)
            or (row[0] not in (PENDING, DELIVERING) and int(row[1] or 0) > attempts)
        ):
            return
        if time.monotonic() > deadline:
            log.warning(
                "ordered resend went on without the attempt before",
                extra={"delivery_id": delivery_id, "waited_s": wait_s},
            )
            return
        time.sleep(_SETTLE_POLL_S)


@dataclass(frozen=True)
class Outcomes:
    """What became of the runs a resend job started: delivered, failed again, still going."""

    delivered: int = 0
    failed_again: int = 0
    in_progress: int = 0

    @property
    def total(self) -> int:
        return self.delivered + self.failed_again + self.in_progress


def outcomes(session: Session, job_id: str) -> Outcomes:
    """Count the job's re-armed deliveries by where they are now.

    A delivery that died again has a newer open dead letter (its state is `dead`); one that
    was resent again since by someone else counts by its latest state.
    """
    rows = session.execute(
        select(Delivery.state, func.count(func.distinct(Delivery.id)))
        .join(DeadLetter, DeadLetter.delivery_id == Delivery.id)
        .join(DeadLetterAudit, DeadLetterAudit.dead_letter_id == DeadLetter.id)
        .where(
            DeadLetterAudit.operation_id == job_id,
            DeadLetterAudit.outcome.startswith("resent as run"),
        )
        .group_by(Delivery.state)
    ).all()
    counts = {state: int(n) for state, n in rows}
    delivered = counts.pop(SUCCEEDED, 0)
    failed = counts.pop(DEAD, 0)
    return Outcomes(delivered, failed, sum(counts.values()))


def stalled_jobs(session: Session, older_than: datetime) -> list[str]:
    """Resend jobs not finished and untouched since `older_than` (e.g. Redis lost their RQ
    job)."""
    stmt = select(ResendJob.id).where(
        ResendJob.kind == BULK_KIND,
        ResendJob.state.in_((ResendJobState.PENDING, ResendJobState.RUNNING)),
        ResendJob.updated_at < older_than,
    )
    return list(session.scalars(stmt))


STALL_AFTER_S = 300


def resume_stalled(runtime: Runtime) -> int:
    """Periodic job: re-enqueue resend jobs whose RQ job was lost (Redis down, worker killed)."""
    with runtime.db.begin() as session:
        ids = stalled_jobs(session, utcnow() - timedelta(seconds=STALL_AFTER_S))
    for job_id in ids:
        enqueue_bulk(runtime.redis, job_id)
    return len(ids)
