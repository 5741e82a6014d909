"""Dead letters: search, read, resend (one, many, everything matching) and discard.

Every action is audited on the letter itself (`dead_letter_audit`, shown with each letter),
under the actor's name. A filter that does not parse never acts on what did parse: the caller
gets every field's message, and a resend by filter without any criterion must say
`everything` outright.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload
from sqlalchemy.sql.base import ExecutableOption

from app.errors import BadRequest, KurirError, NotFound, ValidationFailed
from app.ids import new_id
from app.models import (
    DL_OPEN,
    DL_RESENT,
    SUCCEEDED,
    Attempt,
    DeadLetter,
    Endpoint,
    Event,
    Partner,
    ResendJob,
)
from app.queues import enqueue_after_commit
from app.runtime import Runtime
from app.services.actor import Actor
from app.vocabulary import ResendSkip
from dlq import discard as discard_mod
from dlq import resend as resend_mod
from dlq.search import FILTER_KEYS, DeadLetterFilter, SearchPage, count, search
from sender import ordering
from sender.bodies import Sent, delivered_versions, sent_by
from sender.dispatch import job_specs

BULK_KIND = resend_mod.BULK_KIND
# The faces know this skip reason by this name (`app.vocabulary` is its home).
ENDPOINT_DISABLED = ResendSkip.ENDPOINT_DISABLED
DETAIL_OPTIONS: tuple[ExecutableOption, ...] = (
    selectinload(DeadLetter.audit),
    selectinload(DeadLetter.delivery),
)
__all__ = ["FILTER_KEYS", "DeadLetterFilter", "FilterForm", "SearchPage", "parse_filter"]


@dataclass(frozen=True)
class FilterForm:
    """A filter as typed: the criteria that parsed, and a message per field that did not."""

    filter: DeadLetterFilter
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return not self.errors


def parse_filter(params: Mapping[str, Any], *, strict: bool = False) -> FilterForm:
    flt, errors = DeadLetterFilter.parse(params, strict=strict)
    return FilterForm(flt, errors)


def _scoped(actor: Actor, flt: DeadLetterFilter) -> DeadLetterFilter:
    """A partner-bound actor's filter can only ever name its own partner."""
    if actor.partner_id is None:
        return flt
    if flt.partner is not None and flt.partner != actor.partner_uid:
        raise NotFound(f"partner {flt.partner!r} does not exist", details={"uid": flt.partner})
    return replace(flt, partner=actor.partner_uid)


def page(
    session: Session,
    actor: Actor,
    flt: DeadLetterFilter,
    *,
    limit: int,
    cursor: str | None,
    options: Sequence[ExecutableOption] = DETAIL_OPTIONS,
) -> SearchPage:
    actor.require("read")
    return search(session, _scoped(actor, flt), limit=limit, cursor=cursor, options=options)


def count_matching(session: Session, actor: Actor, flt: DeadLetterFilter) -> int:
    """How many letters the actor may see match the filter."""
    actor.require("read")
    return count(session, _scoped(actor, flt))


def get(session: Session, actor: Actor, letter_id: str) -> tuple[DeadLetter, str]:
    """The letter (audit and delivery loaded) and its partner's uid."""
    actor.require("read")
    letter = session.scalar(
        select(DeadLetter).where(DeadLetter.id == letter_id).options(*DETAIL_OPTIONS)
    )
    if letter is None or not actor.may_see_partner(letter.partner_id):
        raise NotFound(f"dead letter {letter_id} not found", details={"id": letter_id})
    uid = session.scalar(select(Partner.uid).where(Partner.id == letter.partner_id)) or ""
    return letter, uid


def sent(session: Session, letter: DeadLetter) -> Sent:
    """What the letter's delivery sent (and a resend sends again): the version its endpoint
    got and the exact body it signed, not the event as published."""
    return sent_by(session, letter.delivery, session.get_one(Event, letter.event_id))


def versions(session: Session, letters: Sequence[DeadLetter]) -> dict[str, int]:
    """Delivery id -> the version each letter's delivery carries (its pin, or the version
    published), for answers that name it without reading the bodies."""
    return delivered_versions(session, [letter.delivery_id for letter in letters])


def attempts(session: Session, letter: DeadLetter, *, newest_first: bool = False) -> list[Attempt]:
    order = Attempt.n.desc() if newest_first else Attempt.n
    return list(
        session.scalars(
            select(Attempt).where(Attempt.delivery_id == letter.delivery_id).order_by(order)
        )
    )


@dataclass(frozen=True)
class Detail:
    """One letter with what its page shows: the event, endpoint and partner it belongs to,
    what its delivery sent, what became of a resend, and its attempts (newest first)."""

    letter: DeadLetter
    event: Event
    endpoint: Endpoint
    partner: Partner
    sent: Sent
    fate: Fate | None
    attempts: list[Attempt]


def detail(session: Session, actor: Actor, letter_id: str) -> Detail:
    letter, _ = get(session, actor, letter_id)
    return Detail(
        letter,
        session.get_one(Event, letter.event_id),
        session.get_one(Endpoint, letter.endpoint_id),
        session.get_one(Partner, letter.partner_id),
        sent(session, letter),
        fate(session, letter),
        attempts(session, letter, newest_first=True),
    )


def open_by_endpoint(session: Session, actor: Actor, endpoint_ids: Sequence[str]) -> dict[str, int]:
    """Endpoint id -> its open letters, for the endpoints given (those with none are left
    out); one statement for all of them."""
    actor.require("read")
    if not endpoint_ids:
        return {}
    stmt = (
        select(DeadLetter.endpoint_id, func.count())
        .where(DeadLetter.endpoint_id.in_(list(endpoint_ids)), DeadLetter.state == DL_OPEN)
        .group_by(DeadLetter.endpoint_id)
    )
    if actor.partner_id is not None:
        stmt = stmt.where(DeadLetter.partner_id == actor.partner_id)
    return {endpoint_id: int(n) for endpoint_id, n in session.execute(stmt)}


def _own_ids(session: Session, actor: Actor, ids: Sequence[str]) -> list[str]:
    """The ids a partner-bound actor may act on; the others behave as if they did not exist."""
    if actor.partner_id is None:
        return list(ids)
    own = set(
        session.scalars(
            select(DeadLetter.id).where(
                DeadLetter.id.in_(list(ids)), DeadLetter.partner_id == actor.partner_id
            )
        )
    )
    return [i for i in ids if i in own]


def inline_limit() -> int:
    """How many ids a resend handles at once; more go to a background job."""
    return resend_mod.INLINE_LIMIT


def resend_one(
    session: Session, rt: Runtime, actor: Actor, letter_id: str, *, force: bool = False
) -> DeadLetter:
    """Raises NotFound, or Conflict with the reason it cannot be resent."""
    actor.require("dlq:write")
    if not _own_ids(session, actor, [letter_id]):
        raise NotFound(f"dead letter {letter_id} not found", details={"id": letter_id})
    return resend_mod.resend_one(
        session,
        rt.redis,
        letter_id,
        actor=str(actor),
        force=force,
        actor_partner_id=actor.partner_id,
    )


@dataclass
class ResendOutcome:
    """What a resend by ids or by filter did: at once (`inline`) or as a background job."""

    job: ResendJob
    inline: bool
    resent: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def resend_ids(
    session: Session, rt: Runtime, actor: Actor, ids: Sequence[str], *, force: bool = False
) -> ResendOutcome:
    """A few ids are resent now, in this transaction; many go to a background job."""
    actor.require("dlq:write")
    wanted = list(dict.fromkeys(ids))
    if not wanted:
        raise ValidationFailed(
            "ids must not be empty", code="invalid_parameter", details={"parameter": "ids"}
        )
    own = _own_ids(session, actor, wanted)
    foreign = {i: ResendSkip.NOT_FOUND for i in wanted if i not in set(own)}
    if len(wanted) <= resend_mod.INLINE_LIMIT or not own:
        job_id = new_id("bop")
        result = resend_mod.resend_ids_inline(
            session,
            rt.redis,
            own,
            actor=str(actor),
            force=force,
            operation_id=job_id,
            actor_partner_id=actor.partner_id,
        )
        result.skipped.update(foreign)
        job = resend_mod.record_inline(
            session,
            result,
            wanted,
            actor=str(actor),
            force=force,
            operation_id=job_id,
            key_id=actor.key_id,
            actor_partner_id=actor.partner_id,
        )
        return ResendOutcome(job, True, list(result.resent), dict(result.skipped))
    job = resend_mod.start_bulk(
        session,
        actor=str(actor),
        ids=own,
        force=force,
        connection=rt.redis,
        key_id=actor.key_id,
        actor_partner_id=actor.partner_id,
    )
    return ResendOutcome(job, False)


def resend_matching(
    session: Session,
    rt: Runtime,
    actor: Actor,
    form: FilterForm,
    *,
    everything: bool = False,
    force: bool = False,
    enqueue: bool = True,
) -> ResendJob:
    """Resend every open letter matching the filter, in the background (or, without
    `enqueue`, by whoever calls `run_resend_job` next, e.g. the command line with its progress bar).

    Raises:
        BadRequest: a field of the filter does not parse (all of them in `details.errors`):
            never resend by the part that did.
        ValidationFailed: the filter has no criterion and `everything` was not said.
    """
    actor.require("dlq:write")
    if not form.valid:
        name = next(iter(form.errors))
        raise BadRequest(
            f"{name}: {form.errors[name]}",
            code="invalid_parameter",
            details={"parameter": name, "errors": form.errors},
        )
    flt = form.filter
    if flt.with_state(None).is_empty() and not everything:
        raise ValidationFailed(
            "the filter has no criteria and would resend every open dead letter: pass at "
            "least one criterion (partner, endpoint, type, reason, status_code, error, q, "
            'since, until) or "all": true',
            code="invalid_parameter",
            details={"parameter": "filter"},
        )
    return resend_mod.start_bulk(
        session,
        actor=str(actor),
        flt=_scoped(actor, flt),
        force=force,
        connection=rt.redis if enqueue else None,
        key_id=actor.key_id,
        actor_partner_id=actor.partner_id,
    )


def run_resend_job(
    rt: Runtime, job_id: str, progress: Callable[[int], None] | None = None
) -> ResendJob:
    """Run a resend job here and now, page by page (each page its own transaction)."""
    return resend_mod.run_bulk(rt, job_id, progress=progress)


def discard(
    session: Session,
    actor: Actor,
    letter_id: str,
    note: str | None = None,
    *,
    rt: Runtime | None = None,
) -> DeadLetter:
    """Discard an open letter; with `rt`, what its delivery held back in an ordered key
    (`on_dead: "block"`) is sent as soon as the caller commits (else the sweeper sends it)."""
    actor.require("dlq:write")
    if not _own_ids(session, actor, [letter_id]):
        raise NotFound(f"dead letter {letter_id} not found", details={"id": letter_id})
    letter = discard_mod.discard(
        session, letter_id, actor=str(actor), note=note, actor_partner_id=actor.partner_id
    )
    if rt is not None:
        enqueue_after_commit(
            session,
            rt.redis,
            job_specs(ordering.released_successors(session, [letter.delivery_id])),
        )
    return letter


def discard_ids(
    session: Session,
    actor: Actor,
    ids: Sequence[str],
    *,
    note: str | None = None,
    rt: Runtime | None = None,
) -> list[str]:
    """Discard each of these letters that is still open, and say which were.

    Each in a savepoint of the caller's transaction: a letter resent or discarded meanwhile,
    or one the actor may not see, is passed over and never undoes the others.
    """
    actor.require("dlq:write")
    done = []
    for letter_id in dict.fromkeys(ids):
        try:
            with session.begin_nested():
                discard(session, actor, letter_id, note, rt=rt)
        except KurirError:
            continue
        done.append(letter_id)
    return done


def _started(actor: Actor, job: ResendJob) -> bool:
    """Whether a partner-bound actor started this job: the same key (by id: key names are
    not unique), or for a portal session the same partner's portal."""
    if job.actor_partner_id is None or job.actor_partner_id != actor.partner_id:
        return False
    if actor.key_id is not None:
        return job.key_id == actor.key_id
    return job.key_id is None and job.actor == str(actor)


def resend_job(session: Session, actor: Actor, job_id: str) -> ResendJob:
    """A resend job: an operator reads any, a partner's credential only the jobs it started."""
    actor.require("read")
    job = session.get(ResendJob, job_id)
    if (
        job is None
        or job.kind != BULK_KIND
        or (actor.partner_id is not None and not _started(actor, job))
    ):
        raise NotFound(f"resend job {job_id} not found", details={"id": job_id})
    return job


def open_dead_letter_exists(session: Session, actor: Actor) -> bool:
    actor.require("read")
    stmt = select(DeadLetter.id).where(DeadLetter.state == DL_OPEN)
    if actor.partner_id is not None:
        stmt = stmt.where(DeadLetter.partner_id == actor.partner_id)
    return session.scalar(stmt.limit(1)) is not None


Outcomes = resend_mod.Outcomes


def resend_job_outcomes(session: Session, actor: Actor, job: ResendJob) -> Outcomes:
    """What became of the runs a resend job started (the job must be the actor's to see)."""
    resend_job(session, actor, job.id)
    return resend_mod.outcomes(session, job.id)


@dataclass(frozen=True)
class Fate:
    """What became of a resent letter: the delivery's run now, and a letter it died into."""

    delivery_state: str
    run: int
    failed_again: DeadLetter | None

    @property
    def delivered(self) -> bool:
        return self.delivery_state == SUCCEEDED and self.failed_again is None


def fate(session: Session, letter: DeadLetter) -> Fate | None:
    """For a resent letter: did its new run arrive, fail again (and into which letter), or is
    it still going? None for a letter that was not resent."""
    if letter.state != DL_RESENT:
        return None
    later = session.scalar(
        select(DeadLetter)
        .where(DeadLetter.delivery_id == letter.delivery_id, DeadLetter.id > letter.id)
        .order_by(DeadLetter.id)
        .limit(1)
    )
    delivery = letter.delivery
    return Fate(delivery.state, delivery.run, later)


def job_verdict(job: ResendJob, outcomes: Outcomes) -> str:
    """What a resend job came to, in words: the job's own state while it runs; once it is
    done, what became of the runs it started (never "succeeded" for letters that failed
    again)."""
    if job.state in ("pending", "running"):
        return f"{job.state}"
    parts = [f"{outcomes.delivered} delivered"]
    if outcomes.failed_again:
        parts.append(f"{outcomes.failed_again} failed again")
    if outcomes.in_progress:
        parts.append(f"{outcomes.in_progress} still on their way")
    return ("finished" if job.state == SUCCEEDED else str(job.state)) + " · " + ", ".join(parts)


def job_running(job: ResendJob) -> bool:
    """Whether the job itself still works (a page may refresh until it is done; the runs it
    started may then take days on the retry schedule, and are not waited for)."""
    return job.state in ("pending", "running")
