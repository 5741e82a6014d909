"""`POST /inbound/<source>`: the public door for partner callbacks.

No API key: authenticity is the source's signature, checked over the raw bytes by
:func:`app.services.sources.receive` before anything parses them. The body is read once with
``get_data()`` and never through ``request.json``/``form``, which would decode it.

WSGI servers (werkzeug, gunicorn) fold a repeated header into one comma-joined value, so a
duplicated signature header reaches the verifier as one malformed value and is refused (401).
"""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from app.services import sources
from app.web.context import runtime
from app.web.errors import error_response

blueprint = Blueprint("inbound", __name__)


@blueprint.post("/inbound/<source>")
def receive_callback(source: str) -> Response:
    body = request.get_data(cache=False)
    headers = list(request.headers.items())
    try:
        receipt = sources.receive(runtime(), source, headers, body)
    except sources.StoreUnavailable as exc:
        response = error_response(exc.status, exc.code, exc.message, exc.details)
        response.headers["Retry-After"] = str(sources.RETRY_AFTER_S)
        return response
    response = jsonify(receipt.to_dict())
    response.status_code = receipt.status_code
    return response
