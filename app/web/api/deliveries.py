"""One delivery with its attempts, and "try it now"."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from app.errors import BadRequest
from app.pagination import parse_limit
from app.services import deliveries
from app.web.api.serializers import delivery_json
from app.web.auth import current_actor
from app.web.context import runtime
from app.web.jsonio import force_flag, optional_json

blueprint = Blueprint("api_deliveries", __name__)


@blueprint.get("/deliveries")
def list_deliveries() -> Response:
    """The delivery log, newest first: `partner`, `endpoint`, `state`, `type`, `status_code`
    (or `none`), `since`, `until`, and the search box `q`. A partner key sees its partner's
    deliveries only."""
    actor = current_actor()
    flt, errors = deliveries.DeliveryFilter.parse(request.args)
    if errors:
        name = next(iter(errors))
        raise BadRequest(
            f"{name} {errors[name]}",
            code="invalid_parameter",
            details={"parameter": name, "errors": errors},
        )
    limit = parse_limit(request.args.get("limit"))
    with runtime().db.begin() as session:
        page = deliveries.page(session, actor, flt, limit=limit, cursor=request.args.get("cursor"))
        data = [delivery_json(d, with_attempts=False) for d in page.deliveries]
    return jsonify({"data": data, "next_cursor": page.next_cursor})


@blueprint.get("/deliveries/<delivery_id>")
def get_delivery(delivery_id: str) -> Response:
    actor = current_actor()
    with runtime().db.begin() as session:
        return jsonify(delivery_json(deliveries.get(session, actor, delivery_id)))


@blueprint.post("/deliveries/<delivery_id>/retry")
def retry_delivery(delivery_id: str) -> Response:
    """Make the delivery due now and enqueue it; a succeeded one is sent again as a new run.

    A delivery in flight answers 409; a dead one is resent through its dead letter (audited
    there, refused for a disabled endpoint unless `force`, like the dead-letter resend).
    """
    actor = current_actor()
    force = force_flag(optional_json())
    rt = runtime()
    with rt.db.begin() as session:
        deliveries.retry(session, rt, actor, delivery_id, force=force)
    with rt.db.begin() as session:
        response = jsonify(delivery_json(deliveries.get(session, actor, delivery_id)))
    response.status_code = 202
    return response
