"""`/v1/dead-letters`: search, inspect, resend (one, ids, a filter) and discard — audited."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request
from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from app.clock import isoformat
from app.errors import NotFound, ValidationFailed
from app.models import Attempt, BulkOperation, DeadLetter, Delivery, Partner
from app.pagination import parse_limit
from app.web.api.serializers import attempt_json
from app.web.auth import current_principal, require_scope
from app.web.context import runtime
from app.web.jsonio import read_json_object
from dlq import discard as discard_mod
from dlq import resend as resend_mod
from dlq.search import DeadLetterFilter, search

blueprint = Blueprint("api_dead_letters", __name__)

_LOAD = (selectinload(DeadLetter.audit), selectinload(DeadLetter.delivery))


def audit_json(letter: DeadLetter) -> list[dict[str, Any]]:
    return [{"actor": a.actor, "action": a.action, "outcome": a.outcome, "note": a.note,
             "at": isoformat(a.created_at)} for a in letter.audit]


def dead_letter_json(letter: DeadLetter, partner_uid: str, *,
                     attempts: list[Attempt] | None = None) -> dict[str, Any]:
    """The SPEC §4 shape, plus links to the event, the delivery and its attempts."""
    delivery: Delivery = letter.delivery
    body: dict[str, Any] = {
        "id": letter.id,
        "delivery": letter.delivery_id,
        "event": letter.event_id,
        "endpoint": letter.endpoint_id,
        "partner": partner_uid,
        "type": letter.event_type,
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
        "audit": audit_json(letter),
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


def bulk_json(op: BulkOperation) -> dict[str, Any]:
    params = op.params or {}
    return {
        "id": op.id,
        "kind": op.kind,
        "state": op.state,
        "actor": op.actor,
        "total": op.total,
        "done": op.done,
        "failed": op.failed,
        "skipped": params.get("skipped") or {},
        "filter": params.get("filter"),
        "force": bool(params.get("force")),
        "error": op.error,
        "created_at": isoformat(op.created_at),
        "updated_at": isoformat(op.updated_at),
        "finished_at": isoformat(op.finished_at),
    }


def _load(session: Session, letter_id: str) -> tuple[DeadLetter, str]:
    letter = session.scalar(select(DeadLetter).where(DeadLetter.id == letter_id).options(*_LOAD))
    if letter is None:
        raise NotFound(f"dead letter {letter_id} not found", details={"id": letter_id})
    uid = session.scalar(select(Partner.uid).where(Partner.id == letter.partner_id)) or ""
    return letter, uid


def optional_body() -> dict[str, Any]:
    """Action bodies are optional; when one is sent it must be a JSON object."""
    if not request.get_data(cache=True):
        return {}
    return read_json_object()


def parse_force(body: dict[str, Any]) -> bool:
    """`force` from the JSON body (a boolean) or the query string (true/false/1/0).

    Shared with `POST /v1/deliveries/{id}/retry`, which resends a dead delivery the same way.
    """
    if "force" in body:
        value = body["force"]
    else:
        raw = request.args.get("force", "false").strip().lower()
        value = {"1": True, "true": True, "0": False, "false": False, "": False}.get(raw, raw)
    if not isinstance(value, bool):
        raise ValidationFailed("force must be a boolean", code="invalid_parameter",
                               details={"parameter": "force"})
    return value


def _resend_filter(raw: dict[str, Any]) -> DeadLetterFilter:
    """The filter of a bulk resend; with no criteria it must say `"all": true`.

    A bulk resend only touches open letters, so an empty filter (or one with only `state`)
    means every open letter: too easy to send by mistake, hence the explicit `all`, like
    the CLI's `--all`.
    """
    everything = raw.get("all", False)
    if not isinstance(everything, bool):
        raise ValidationFailed("filter.all must be a boolean", code="invalid_parameter",
                               details={"parameter": "filter.all"})
    flt = DeadLetterFilter.from_params({k: v for k, v in raw.items() if k != "all"},
                                       strict=True)
    if flt.with_state(None).is_empty() and not everything:
        raise ValidationFailed(
            "the filter has no criteria and would resend every open dead letter: pass at "
            "least one criterion (partner, endpoint, type, reason, status_code, error, q, "
            'since, until) or "all": true', code="invalid_parameter",
            details={"parameter": "filter"})
    return flt


@blueprint.get("/dead-letters")
@require_scope("read")
def list_dead_letters() -> Response:
    flt = DeadLetterFilter.from_params(request.args)
    limit = parse_limit(request.args.get("limit"))
    with runtime().db.begin() as session:
        page = search(session, flt, limit=limit, cursor=request.args.get("cursor"),
                      options=_LOAD)
        data = [dead_letter_json(letter, page.partner_uids.get(letter.partner_id, ""))
                for letter in page.letters]
    return jsonify({"data": data, "next_cursor": page.next_cursor})


@blueprint.get("/dead-letters/<letter_id>")
@require_scope("read")
def get_dead_letter(letter_id: str) -> Response:
    with runtime().db.begin() as session:
        letter, uid = _load(session, letter_id)
        attempts = list(session.scalars(select(Attempt).where(
            Attempt.delivery_id == letter.delivery_id).order_by(Attempt.n)))
        return jsonify(dead_letter_json(letter, uid, attempts=attempts))


@blueprint.post("/dead-letters/<letter_id>/resend")
@require_scope("dlq:write")
def resend_dead_letter(letter_id: str) -> Response:
    body = optional_body()
    force = parse_force(body)
    rt = runtime()
    actor = current_principal().name
    with rt.db.begin() as session:
        resend_mod.resend_one(session, rt.redis, letter_id, actor=actor, force=force)
    with rt.db.begin() as session:
        letter, uid = _load(session, letter_id)
        return jsonify(dead_letter_json(letter, uid))


@blueprint.post("/dead-letters/resend")
@require_scope("dlq:write")
def resend_many() -> tuple[Response, int]:
    """`{"ids": [...]}` (a few: now, 200; many: in the background, 202) or `{"filter": {...}}`.

    A filter needs at least one criterion, or `"all": true` to resend every open letter.

    Every answer carries `count` and `job_id`, whose progress `GET …/resend-jobs/{id}` shows.
    """
    body = read_json_object()
    unknown = sorted(set(body) - {"ids", "filter", "force"})
    if unknown or ("ids" in body) == ("filter" in body):
        raise ValidationFailed('body must be {"ids": [...]} or {"filter": {...}}, optionally '
                               'with "force": true', code="invalid_parameter",
                               details={"unknown": unknown})
    force = parse_force(body)
    rt = runtime()
    actor = current_principal().name
    if "ids" in body:
        ids = body["ids"]
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ValidationFailed("ids must be a list of dead letter ids",
                                   code="invalid_parameter", details={"parameter": "ids"})
        unique = list(dict.fromkeys(ids))
        if len(unique) <= resend_mod.INLINE_LIMIT:
            if not unique:
                raise ValidationFailed("ids must not be empty", code="invalid_parameter",
                                       details={"parameter": "ids"})
            with rt.db.begin() as session:
                result = resend_mod.resend_ids_inline(session, rt.redis, unique, actor=actor,
                                                      force=force)
                op = resend_mod.record_inline(session, result, unique, actor=actor,
                                              force=force)
                op_id = op.id
            return jsonify({"count": len(result.resent), "job_id": op_id,
                            "status_url": f"/v1/dead-letters/resend-jobs/{op_id}",
                            "resent": result.resent,
                            "skipped": [{"id": i, "reason": r}
                                        for i, r in result.skipped.items()]}), 200
        with rt.db.begin() as session:
            op = resend_mod.start_bulk(session, actor=actor, ids=unique, force=force,
                                       connection=rt.redis)
            answer = {"count": op.total, "job_id": op.id,
                      "status_url": f"/v1/dead-letters/resend-jobs/{op.id}"}
        return jsonify(answer), 202
    raw_filter = body["filter"]
    if not isinstance(raw_filter, dict):
        raise ValidationFailed("filter must be an object of search parameters",
                               code="invalid_parameter", details={"parameter": "filter"})
    flt = _resend_filter(raw_filter)
    with rt.db.begin() as session:
        op = resend_mod.start_bulk(session, actor=actor, flt=flt, force=force,
                                   connection=rt.redis)
        answer = {"count": op.total, "job_id": op.id,
                  "status_url": f"/v1/dead-letters/resend-jobs/{op.id}"}
    return jsonify(answer), 202


@blueprint.get("/dead-letters/resend-jobs/<op_id>")
@require_scope("read")
def resend_job(op_id: str) -> Response:
    with runtime().db.begin() as session:
        op = session.get(BulkOperation, op_id)
        if op is None or op.kind != resend_mod.BULK_KIND:
            raise NotFound(f"resend job {op_id} not found", details={"id": op_id})
        return jsonify(bulk_json(op))


@blueprint.post("/dead-letters/<letter_id>/discard")
@require_scope("dlq:write")
def discard_dead_letter(letter_id: str) -> Response:
    body = optional_body()
    note = body.get("note")
    if note is not None and not isinstance(note, str):
        raise ValidationFailed("note must be a string", code="invalid_parameter",
                               details={"parameter": "note"})
    rt = runtime()
    with rt.db.begin() as session:
        discard_mod.discard(session, letter_id, actor=current_principal().name, note=note)
    with rt.db.begin() as session:
        letter, uid = _load(session, letter_id)
        return jsonify(dead_letter_json(letter, uid))
