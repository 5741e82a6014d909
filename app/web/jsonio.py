"""Reading requests strictly: the right media type, valid JSON, an object, storable text."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flask import Response, request

from app import jsonstrict
from app.clock import parse_time
from app.errors import BadRequest, UnsupportedMediaType, ValidationFailed, reject_unknown_fields

# Top-level members of a request body that are stored only as JSON (the event's data and
# its renditions), never in a text column: a NUL character in them is escaped and harmless.
JSON_ONLY_MEMBERS = frozenset({"data", "renditions"})


def read_json_object() -> dict[str, Any]:
    """The request body as a JSON object.

    Raises:
        UnsupportedMediaType: the content type is not JSON.
        BadRequest: the body is not strict JSON (see :mod:`app.jsonstrict`), not an object,
            or holds a NUL character where it would be stored as text.
    """
    mimetype = request.mimetype or ""
    if mimetype != "application/json" and not mimetype.endswith("+json"):
        raise UnsupportedMediaType(
            f"content type must be application/json, got {request.content_type or 'none'}"
        )
    raw = request.get_data(cache=True)
    try:
        body = jsonstrict.loads(raw)
    except jsonstrict.InvalidJSON as exc:
        raise BadRequest(f"body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object", code="invalid_json")
    where = jsonstrict.nul_at(raw, body, skip=JSON_ONLY_MEMBERS)
    if where is not None:
        raise BadRequest(
            f"{where} contains a NUL character (\\u0000), which cannot be stored",
            code="invalid_json",
            details={"at": where},
        )
    return body


# No filter needs more; gunicorn refuses a request line over 4 KiB anyway, and SQLite refuses
# a LIKE pattern over 50,000 bytes with an error, not an empty answer.
MAX_QUERY_VALUE_CHARS = 2048


def check_url_and_headers(*, form: bool = False) -> None:
    """A before-request guard: what no handler could take is a 400, not a 500.

    NUL in the path, the query, a header (or, with `form`, a form field) would end up in a
    query parameter or a text column, which PostgreSQL refuses and SQLite stores: refused up
    front, both answer alike. A query value over MAX_QUERY_VALUE_CHARS is refused too.

    Raises:
        BadRequest: code ``invalid_parameter``, naming the parameter, header or field.
    """
    if "\x00" in request.path:
        raise BadRequest(
            "the path contains a NUL character",
            code="invalid_parameter",
            details={"parameter": "path"},
        )
    for name, value in request.args.items(multi=True):
        if "\x00" in name or "\x00" in value:
            raise BadRequest(
                f"query parameter {name[:100]!r} contains a NUL character",
                code="invalid_parameter",
                details={"parameter": name[:100]},
            )
        if len(value) > MAX_QUERY_VALUE_CHARS or len(name) > MAX_QUERY_VALUE_CHARS:
            raise BadRequest(
                f"query parameter {name[:100]!r} is longer than {MAX_QUERY_VALUE_CHARS} characters",
                code="invalid_parameter",
                details={"parameter": name[:100], "limit": MAX_QUERY_VALUE_CHARS},
            )
    for name, value in request.headers.items():
        if "\x00" in value:
            raise BadRequest(
                f"header {name!r} contains a NUL character",
                code="invalid_parameter",
                details={"header": name},
            )
    if form and request.method == "POST":
        for name, value in request.form.items(multi=True):
            if "\x00" in name or "\x00" in value:
                raise BadRequest(
                    f"form field {name[:100]!r} contains a NUL character",
                    code="invalid_parameter",
                    details={"field": name[:100]},
                )


def time_param(name: str) -> datetime | None:
    """A time query parameter (`since`, `until`); a value that is not one is a 400."""
    raw = request.args.get(name)
    if not raw:
        return None
    try:
        return parse_time(raw)
    except ValueError:
        raise BadRequest(
            f"{name} must be an RFC 3339 timestamp",
            code="invalid_parameter",
            details={"parameter": name},
        ) from None


def optional_json(allowed: tuple[str, ...] | None = None) -> dict[str, Any]:
    """An action's optional body: none at all is `{}`; one that is sent must be an object
    (with only the `allowed` keys, when given)."""
    if not request.content_length and not request.get_data(cache=True):
        return {}
    body = read_json_object()
    if allowed is not None:
        reject_unknown_fields(body, allowed)
    return body


# The spellings of a true/false query parameter (any case); the API description lists them.
FLAG_VALUES = {"true": True, "false": False, "1": True, "0": False}


def bool_param(name: str) -> bool | None:
    """A true/false query parameter; absent or empty is None, anything else a 400."""
    raw = request.args.get(name)
    if raw is None or raw == "":
        return None
    value = FLAG_VALUES.get(raw.strip().lower())
    if value is not None:
        return value
    raise BadRequest(
        f"{name} must be true or false", code="invalid_parameter", details={"parameter": name}
    )


def force_flag(body: dict[str, Any]) -> bool:
    """`force` from the JSON body (a boolean) or the query string (true/false/1/0)."""
    if "force" in body:
        value = body["force"]
    else:
        raw = request.args.get("force", "false").strip().lower()
        value = {**FLAG_VALUES, "": False}.get(raw, raw)
    if not isinstance(value, bool):
        raise ValidationFailed(
            "force must be a boolean", code="invalid_parameter", details={"parameter": "force"}
        )
    return value


def no_content() -> Response:
    """204 with no body and no Content-Type (there is no content to type)."""
    response = Response(status=204)
    del response.headers["Content-Type"]
    return response
