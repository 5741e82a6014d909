"""`/v1/dead-letters`: search, inspect, resend (one, ids, a filter) and discard — audited."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request

from app.clock import isoformat
from app.errors import ValidationFailed
from app.models import Attempt, DeadLetter, Delivery, ResendJob
from app.pagination import parse_limit
from app.services import dead_letters
from app.services.actor import Actor
from app.web.api.serializers import attempt_json
from app.web.auth import current_actor
from app.web.context import runtime
from app.web.jsonio import force_flag, optional_json, read_json_object

blueprint = Blueprint("api_dead_letters", __name__)


def audit_json(letter: DeadLetter, reader: Actor) -> list[dict[str, Any]]:
    """The letter's trail; a partner's credential sees the publisher's people as
    "publisher" (`Actor.shows`)."""
    return [
        {
            "actor": reader.shows(a.actor, a.actor_partner_id),
            "action": a.action,
            "outcome": a.outcome,
            "note": a.note,
            "at": isoformat(a.created_at),
        }
        for a in letter.audit
    ]


def dead_letter_json(
    letter: DeadLetter,
    partner_uid: str,
    version: int | None,
    reader: Actor,
    *,
    attempts: list[Attempt] | None = None,
) -> dict[str, Any]:
    """The dead-letter shape, plus links to the event, the delivery and its attempts.

    `version` is the contract version the delivery carries: for an endpoint pinned to an
    older version, not the one published. `reader` is who asks (what its audit shows).
    """
    delivery: Delivery = letter.delivery
    body: dict[str, Any] = {
        "id": letter.id,
        "delivery": letter.delivery_id,
        "event": letter.event_id,
        "endpoint": letter.endpoint_id,
        "partner": partner_uid,
        "type": letter.event_type,
        "version": version,
        "reason": letter.reason,
        "last_status_code": letter.last_status_code,
        "last_error": letter.last_error,
        "state": letter.state,
        "note": letter.note,
        "attempt_count": delivery.attempt_count or 0,
        "delivery_state": delivery.state,
        "run": delivery.run,
        "created_at": isoformat(letter.created_at),
        "updated_at": isoformat(letter.updated_at),
        "resolved_at": isoformat(letter.resolved_at),
        "audit": audit_json(letter, reader),
        "links": {
            "self": f"/v1/dead-letters/{letter.id}",
            "event": f"/v1/events/{letter.event_id}",
            "delivery": f"/v1/deliveries/{letter.delivery_id}",
            "attempts": f"/v1/deliveries/{letter.delivery_id}",
            "ui": f"/ui/dead-letters/{letter.id}",
        },
    }
    if attempts is not None:
        body["attempts"] = [attempt_json(a) for a in attempts]
    return body


def resend_job_json(job: ResendJob) -> dict[str, Any]:
    params = job.params or {}
    return {
        "id": job.id,
        "kind": job.kind,
        "state": job.state,
        "actor": job.actor,
        "total": job.total,
        "done": job.done,
        "failed": job.failed,
        "skipped": params.get("skipped") or {},
        "filter": params.get("filter"),
        "force": bool(params.get("force")),
        "ordered": bool(params.get("ordered")),
        "purpose": params.get("purpose"),
        "error": job.error,
        "created_at": isoformat(job.created_at),
        "updated_at": isoformat(job.updated_at),
        "finished_at": isoformat(job.finished_at),
    }


def _letter_answer(letter_id: str) -> Response:
    actor = current_actor()
    with runtime().db.begin() as session:
        letter, uid = dead_letters.get(session, actor, letter_id)
        version = dead_letters.versions(session, [letter]).get(letter.delivery_id)
        return jsonify(dead_letter_json(letter, uid, version, actor))


@blueprint.get("/dead-letters")
def list_dead_letters() -> Response:
    actor = current_actor()
    flt = dead_letters.DeadLetterFilter.from_params(request.args)
    limit = parse_limit(request.args.get("limit"))
    with runtime().db.begin() as session:
        page = dead_letters.page(
            session, actor, flt, limit=limit, cursor=request.args.get("cursor")
        )
        data = [
            dead_letter_json(
                letter,
                page.partner_uids.get(letter.partner_id, ""),
                page.versions.get(letter.delivery_id),
                actor,
            )
            for letter in page.letters
        ]
    return jsonify({"data": data, "next_cursor": page.next_cursor})


@blueprint.get("/dead-letters/<letter_id>")
def get_dead_letter(letter_id: str) -> Response:
    actor = current_actor()
    with runtime().db.begin() as session:
        letter, uid = dead_letters.get(session, actor, letter_id)
        attempts = dead_letters.attempts(session, letter)
        version = dead_letters.versions(session, [letter]).get(letter.delivery_id)
        return jsonify(dead_letter_json(letter, uid, version, actor, attempts=attempts))


@blueprint.post("/dead-letters/<letter_id>/resend")
def resend_dead_letter(letter_id: str) -> Response:
    actor = current_actor()
    force = force_flag(optional_json())
    rt = runtime()
    with rt.db.begin() as session:
        dead_letters.resend_one(session, rt, actor, letter_id, force=force)
    return _letter_answer(letter_id)


def _status_url(job_id: str) -> str:
    return f"/v1/dead-letters/resend-jobs/{job_id}"


@blueprint.post("/dead-letters/resend")
def resend_many() -> tuple[Response, int]:
    """`{"ids": [...]}` (a few: now, 200; many: in the background, 202) or `{"filter": {...}}`.

    A filter needs at least one criterion, or `"all": true` to resend every open letter.
    Every answer carries `count` and `job_id`, whose progress `GET …/resend-jobs/{id}` shows.
    """
    actor = current_actor()
    body = read_json_object()
    unknown = sorted(set(body) - {"ids", "filter", "force"})
    if unknown or ("ids" in body) == ("filter" in body):
        raise ValidationFailed(
            'body must be {"ids": [...]} or {"filter": {...}}, optionally with "force": true',
            code="invalid_parameter",
            details={"unknown": unknown},
        )
    force = force_flag(body)
    rt = runtime()
    if "ids" in body:
        ids = body["ids"]
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ValidationFailed(
                "ids must be a list of dead letter ids",
                code="invalid_parameter",
                details={"parameter": "ids"},
            )
        with rt.db.begin() as session:
            outcome = dead_letters.resend_ids(session, rt, actor, ids, force=force)
            job_id, total = outcome.job.id, outcome.job.total
        if outcome.inline:
            return jsonify(
                {
                    "count": len(outcome.resent),
                    "job_id": job_id,
                    "status_url": _status_url(job_id),
                    "resent": outcome.resent,
                    "skipped": [{"id": i, "reason": r} for i, r in outcome.skipped.items()],
                }
            ), 200
        return jsonify({"count": total, "job_id": job_id, "status_url": _status_url(job_id)}), 202
    raw = body["filter"]
    if not isinstance(raw, dict):
        raise ValidationFailed(
            "filter must be an object of search parameters",
            code="invalid_parameter",
            details={"parameter": "filter"},
        )
    everything = raw.get("all", False)
    if not isinstance(everything, bool):
        raise ValidationFailed(
            "filter.all must be a boolean",
            code="invalid_parameter",
            details={"parameter": "filter.all"},
        )
    form = dead_letters.parse_filter({k: v for k, v in raw.items() if k != "all"}, strict=True)
    with rt.db.begin() as session:
        job = dead_letters.resend_matching(
            session, rt, actor, form, everything=everything, force=force
        )
        answer = {"count": job.total, "job_id": job.id, "status_url": _status_url(job.id)}
    return jsonify(answer), 202


@blueprint.get("/dead-letters/resend-jobs/<job_id>")
def resend_job(job_id: str) -> Response:
    actor = current_actor()
    with runtime().db.begin() as session:
        return jsonify(resend_job_json(dead_letters.resend_job(session, actor, job_id)))


@blueprint.get("/operations/<job_id>")
def operation(job_id: str) -> Response:
    """A background operation (a bulk resend, a recovery's replay, a recover window)."""
    return resend_job(job_id)


@blueprint.post("/dead-letters/<letter_id>/discard")
def discard_dead_letter(letter_id: str) -> Response:
    actor = current_actor()
    body = optional_json()
    note = body.get("note")
    if note is not None and not isinstance(note, str):
        raise ValidationFailed(
            "note must be a string", code="invalid_parameter", details={"parameter": "note"}
        )
    rt = runtime()
    with rt.db.begin() as session:
        dead_letters.discard(session, actor, letter_id, note=note, rt=rt)
    return _letter_answer(letter_id)
