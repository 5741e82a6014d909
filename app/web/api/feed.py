"""The feed and pull acknowledgements over HTTP; the rules live in app.services.feed."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from app.clock import utcnow
from app.pagination import parse_limit
from app.services import feed
from app.web.api.serializers import endpoint_json, lag_json
from app.web.auth import current_actor
from app.web.context import runtime
from app.web.jsonio import read_json_object

blueprint = Blueprint("api_feed", __name__)

JSON = "application/json"


@blueprint.get("/partners/<uid>/feed")
def read_feed(uid: str) -> Response:
    """The partner's events in commit order; each item is the body a push would carry.

    The stored bodies are spliced in as they are: the bytes a consumer parses are the bytes
    a pushed webhook would have carried.
    """
    actor = current_actor()
    limit = parse_limit(request.args.get("limit"))
    page = feed.read(
        runtime(),
        actor,
        uid,
        after=request.args.get("after") or None,
        limit=limit,
        endpoint_id=request.args.get("endpoint") or None,
    )
    body = '{"data":[' + ",".join(page.payloads) + '],"next_cursor":"' + page.next_cursor + '"}'
    return Response(body, content_type=JSON)


@blueprint.post("/partners/<uid>/endpoints/<endpoint_id>/ack")
def acknowledge(uid: str, endpoint_id: str) -> Response:
    actor = current_actor()
    body = read_json_object()
    rt = runtime()
    now = utcnow()
    with rt.db.begin() as session:
        endpoint = feed.ack(session, rt.settings, actor, uid, endpoint_id, body, now=now)
        lag = feed.lag_of(session, rt.settings, endpoint, now)
        answer = endpoint_json(
            endpoint, uid, lag=None if lag is None else lag_json(lag, endpoint.acked_at, now)
        )
    return jsonify(answer)


@blueprint.post("/partners/<uid>/endpoints/<endpoint_id>/skip-expired")
def skip_expired(uid: str, endpoint_id: str) -> Response:
    """Move a pull endpoint past what of its backlog lies beyond retention (after a
    `410 backlog_expired`); the answer is the endpoint with its lag, as for an ack."""
    actor = current_actor()
    rt = runtime()
    now = utcnow()
    with rt.db.begin() as session:
        endpoint = feed.skip_expired(
            session, rt.settings, actor, uid, endpoint_id, now=now
        ).endpoint
        lag = feed.lag_of(session, rt.settings, endpoint, now)
        answer = endpoint_json(
            endpoint, uid, lag=None if lag is None else lag_json(lag, endpoint.acked_at, now)
        )
    return jsonify(answer)
