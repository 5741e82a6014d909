"""Reading JSON requests strictly: the right media type, valid JSON, an object."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flask import request

from app import jsonstrict
from app.clock import parse_time
from app.errors import BadRequest, UnsupportedMediaType


def read_json_object() -> dict[str, Any]:
    """The request body as a JSON object.

    Raises:
        UnsupportedMediaType: the content type is not JSON.
        BadRequest: the body is not strict JSON (see :mod:`app.jsonstrict`) or not an object.
    """
    mimetype = request.mimetype or ""
    if mimetype != "application/json" and not mimetype.endswith("+json"):
        raise UnsupportedMediaType(
            f"content type must be application/json, got {request.content_type or 'none'}")
    raw = request.get_data(cache=True)
    try:
        body = jsonstrict.loads(raw)
    except jsonstrict.InvalidJSON as exc:
        raise BadRequest(f"body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object", code="invalid_json")
    return body


def time_param(name: str) -> datetime | None:
    """A time query parameter (`since`, `until`); a value that is not one is a 400."""
    raw = request.args.get(name)
    if not raw:
        return None
    try:
        return parse_time(raw)
    except ValueError:
        raise BadRequest(f"{name} must be an RFC 3339 timestamp", code="invalid_parameter",
                         details={"parameter": name}) from None
