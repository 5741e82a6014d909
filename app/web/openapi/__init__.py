"""The OpenAPI 3.1 document of the `/v1` API: builders here, each family's part by its routes.

It is written by hand, not generated, so it can say exactly what the views do — and it is held
to that by tests: every Flask `/v1` rule must appear in it, live responses are validated
against its schemas (tests/integration/test_openapi.py), and the copy committed as
`docs/openapi.json` must be what the code serves (tests/unit/test_openapi_file.py).

Where things are: this module holds the building blocks, the shared schemas (`Error`, the page
parameters) and the tags in the order the document lists them. Each module of routes has a
`_doc` sibling (`app/web/api/partners.py` → `app/web/api/partners_doc.py`, and
`app/web/inbound.py` → `app/web/inbound_doc.py`) that declares that module's schemas and
operations when imported; :func:`document` imports them all. Enum lists are the code's own
constants, imported, never copied.

How to add to it: put the JSON Schemas of your request and response bodies in the family's
`_doc` module with `schema(name, body)` (OpenAPI 3.1 schemas are JSON Schema 2020-12; spell
"nullable" as `{"type": [..., "null"]}`), then call `add(path, method, op(...))` there. Mark
fields `required` only when the code always sends them. A new `_doc` module is imported in
:func:`_load_parts`. Then regenerate the committed copy: `python -m app.web.openapi --write`.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from flask import Blueprint, Response, jsonify

from app import __version__
from app.pagination import DEFAULT_LIMIT, MAX_LIMIT
from app.web.jsonio import FLAG_VALUES

Schema = dict[str, Any]

OPENAPI_VERSION = "3.1.0"
SCHEMAS: dict[str, Schema] = {}
PATHS: dict[str, dict[str, Any]] = {}
# The families, in the order the document lists them; every operation names one of these.
TAGS: list[dict[str, str]] = [
    {"name": "keys", "description": "API keys, and the audit trail"},
    {"name": "event-types", "description": "versioned event contracts"},
    {"name": "partners", "description": "receiving organisations and their endpoints"},
    {"name": "endpoints", "description": "partner URLs, subscriptions and secrets"},
    {"name": "events", "description": "publish and read events"},
    {"name": "feed", "description": "a partner's events in commit order, for pulling"},
    {"name": "deliveries", "description": "one event to one endpoint"},
    {"name": "dead-letters", "description": "what Kurir stopped trying: search, resend, discard"},
    {"name": "inbound", "description": "partner callbacks: sources, received events"},
]
# Where the committed copy of the document lives, from the repository root.
COMMITTED_PATH = "docs/openapi.json"

# ---------------------------------------------------------------------------- building blocks


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    """`schema` or null; plain types use a type list, anything else a oneOf."""
    if set(schema) <= {
        "type",
        "format",
        "enum",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "pattern",
        "description",
    } and isinstance(schema.get("type"), str):
        result = dict(schema, type=[schema["type"], "null"])
        if "enum" in result:
            result["enum"] = [*result["enum"], None]
        return result
    return {"oneOf": [schema, {"type": "null"}]}


STRING: Schema = {"type": "string"}
INTEGER: Schema = {"type": "integer"}
BOOLEAN: Schema = {"type": "boolean"}
TIMESTAMP: Schema = {"type": "string", "format": "date-time"}
OPT_TIMESTAMP: Schema = nullable(TIMESTAMP)
OPT_STRING: Schema = nullable(STRING)
OPT_INTEGER: Schema = nullable(INTEGER)
ANY_OBJECT: Schema = {"type": "object"}


def obj(
    properties: dict[str, Schema],
    *,
    required: list[str] | None = None,
    strict: bool = True,
    description: str | None = None,
) -> Schema:
    """An object; by default every property is required and no other property is allowed."""
    schema: Schema = {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
    }
    if strict:
        schema["additionalProperties"] = False
    if description:
        schema["description"] = description
    return schema


def array(items: Schema, **extra: Any) -> Schema:
    return {"type": "array", "items": items, **extra}


def page_of(name: str) -> Schema:
    return obj({"data": array(ref(name)), "next_cursor": OPT_STRING})


def schema(name: str, body: Schema) -> Schema:
    SCHEMAS[name] = body
    return ref(name)


def path_param(name: str, description: str, type_: str = "string") -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": type_},
    }


def query(name: str, description: str, schema_: Schema | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema_ or STRING,
    }


# The `limit` every page takes, as `app.pagination.parse_limit` reads it.
PAGE_LIMIT: Schema = {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}
LIMIT_PARAM = query("limit", f"page size (default {DEFAULT_LIMIT})", PAGE_LIMIT)
PAGE_PARAMS = [LIMIT_PARAM, query("cursor", "the `next_cursor` of the previous page")]
# A true/false query parameter, in the spellings `app.web.jsonio` reads.
FLAG: Schema = {"type": "string", "enum": list(FLAG_VALUES)}

ERROR_TEXT = {
    400: "malformed request (bad JSON, bad query parameter, bad header)",
    401: "missing or invalid API key",
    403: "the API key lacks the required scope",
    404: "not found",
    409: "conflict",
    410: "gone (e.g. a feed cursor older than the retention period)",
    413: "body larger than KURIR_MAX_PAYLOAD_BYTES",
    415: "content type is not application/json",
    422: "validation failed; `details` says what",
    429: "too many requests: wait the `Retry-After` header's seconds",
    503: "unavailable: a store is unreachable, or a setting the request needs is missing",
}


def op(
    summary: str,
    *,
    tag: str,
    scope: str | None,
    ok: dict[int, Schema | None],
    errors: tuple[int, ...] = (),
    params: list[dict[str, Any]] | None = None,
    body: Schema | None = None,
    body_required: bool = True,
    description: str | None = None,
    headers: dict[int, dict[str, Any]] | None = None,
    operation_id: str | None = None,
) -> dict[str, Any]:
    """One operation: `ok` maps success statuses to body schemas (None: no body)."""
    operation: dict[str, Any] = {"summary": summary, "tags": [tag]}
    if description:
        operation["description"] = description
    if operation_id:
        operation["operationId"] = operation_id
    if params:
        operation["parameters"] = params
    if body is not None:
        operation["requestBody"] = {
            "required": body_required,
            "content": {"application/json": {"schema": body}},
        }
    responses: dict[str, Any] = {}
    for status, body_schema in ok.items():
        response: dict[str, Any] = {"description": "success"}
        if body_schema is not None:
            response["content"] = {"application/json": {"schema": body_schema}}
        if headers and status in headers:
            response["headers"] = headers[status]
        responses[str(status)] = response
    statuses = set(errors)
    if scope is not None:
        statuses |= {401, 403}
        operation["security"] = [{"bearerAuth": []}]
        operation["x-kurir-scope"] = scope
    else:
        operation["security"] = []
    for status in sorted(statuses):
        responses[str(status)] = {
            "description": ERROR_TEXT.get(status, "error"),
            "content": {"application/json": {"schema": ref("Error")}},
        }
        if status == 429:
            responses[str(status)]["headers"] = {
                "Retry-After": {
                    "description": "seconds to wait before trying again",
                    "schema": {"type": "integer", "minimum": 1},
                }
            }
    operation["responses"] = responses
    return operation


def add(path: str, method: str, operation: dict[str, Any]) -> None:
    """Document `method path`; its tag must be one of TAGS, so the tag list stays whole."""
    declared = {tag["name"] for tag in TAGS}
    unknown = [tag for tag in operation["tags"] if tag not in declared]
    if unknown:
        raise ValueError(f"{method.upper()} {path}: undeclared tag(s) {unknown}")
    methods = PATHS.setdefault(path, {})
    if method in methods:
        raise ValueError(f"{method.upper()} {path} is documented twice")
    methods[method] = operation


def _load_parts() -> None:
    """Import every family's part: each `_doc` module adds its operations when imported.

    Imported here rather than at the top: the parts import this module's builders.
    """
    from app.web import inbound_doc  # noqa: F401
    from app.web.api import (  # noqa: F401
        dead_letters_doc,
        deliveries_doc,
        event_types_doc,
        events_doc,
        feed_doc,
        inbound_events_doc,
        keys_doc,
        partners_doc,
        sources_doc,
    )


def document() -> dict[str, Any]:
    """A fresh copy of the whole document, as `GET /openapi.json` serves it."""
    _load_parts()
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "Kurir",
            "version": __version__,
            "description": "Webhook delivery: publish events, manage partners and endpoints, "
            "inspect deliveries and dead letters, receive partner callbacks.",
        },
        "tags": copy.deepcopy(TAGS),
        "paths": copy.deepcopy(PATHS),
        "components": {
            "schemas": copy.deepcopy(SCHEMAS),
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "an API key made with `kurir keys create`",
                }
            },
        },
        "security": [{"bearerAuth": []}],
    }


blueprint = Blueprint("openapi", __name__)


@blueprint.get("/openapi.json")
def openapi_json() -> Response:
    return jsonify(document())


def render() -> str:
    """The document as committed to `docs/openapi.json`: sorted keys, two-space indent, a
    final newline, so a change to the API reads as a small diff."""
    return json.dumps(document(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------------- common schemas

schema(
    "Error",
    obj(
        {
            "error": obj(
                {
                    "code": {
                        "type": "string",
                        "description": "machine-readable, e.g. `validation_failed`",
                    },
                    "message": STRING,
                    "details": {
                        "description": "what exactly was wrong (free form: object, list or null)"
                    },
                }
            )
        }
    ),
)
