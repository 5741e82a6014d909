"""The OpenAPI 3.1 document of the `/v1` API, kept as small dicts next to the code it describes.

It is written by hand, not generated, so it can say exactly what the views do — and it is held
to that by tests: every Flask `/v1` rule must appear here, and live responses are validated
against the schemas below (tests/integration/test_openapi.py).

How to add to it: put the JSON Schemas of your request and response bodies in `SCHEMAS`
(OpenAPI 3.1 schemas are JSON Schema 2020-12; spell "nullable" as `{"type": [..., "null"]}`),
then call `add(path, method, op(...))` in your family's section at the bottom. Mark fields
`required` only when the code always sends them.
"""

from __future__ import annotations

import copy
from typing import Any

from flask import Blueprint, Response, jsonify

from app import __version__, downgrades

Schema = dict[str, Any]

OPENAPI_VERSION = "3.1.0"
SCHEMAS: dict[str, Schema] = {}
PATHS: dict[str, dict[str, Any]] = {}
TAGS: list[dict[str, str]] = []

# ---------------------------------------------------------------------------- building blocks


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    """`schema` or null; plain types use a type list, anything else a oneOf."""
    if set(schema) <= {"type", "format", "enum", "minimum", "maximum", "minLength",
                       "maxLength", "pattern", "description"} and isinstance(
                           schema.get("type"), str):
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


def obj(properties: dict[str, Schema], *, required: list[str] | None = None,
        strict: bool = True, description: str | None = None) -> Schema:
    """An object; by default every property is required and no other property is allowed."""
    schema: Schema = {"type": "object", "properties": properties,
                      "required": list(properties) if required is None else required}
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
    return {"name": name, "in": "path", "required": True, "description": description,
            "schema": {"type": type_}}


def query(name: str, description: str, schema_: Schema | None = None) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description,
            "schema": schema_ or STRING}


PAGE_PARAMS = [
    query("limit", "page size (default 50)", {"type": "integer", "minimum": 1, "maximum": 250}),
    query("cursor", "the `next_cursor` of the previous page"),
]

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


def op(summary: str, *, tag: str, scope: str | None, ok: dict[int, Schema | None],
       errors: tuple[int, ...] = (), params: list[dict[str, Any]] | None = None,
       body: Schema | None = None, body_required: bool = True,
       description: str | None = None, headers: dict[int, dict[str, Any]] | None = None,
       operation_id: str | None = None) -> dict[str, Any]:
    """One operation: `ok` maps success statuses to body schemas (None: no body)."""
    operation: dict[str, Any] = {"summary": summary, "tags": [tag]}
    if description:
        operation["description"] = description
    if operation_id:
        operation["operationId"] = operation_id
    if params:
        operation["parameters"] = params
    if body is not None:
        operation["requestBody"] = {"required": body_required,
                                    "content": {"application/json": {"schema": body}}}
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
        responses[str(status)] = {"description": ERROR_TEXT.get(status, "error"),
                                  "content": {"application/json": {"schema": ref("Error")}}}
        if status == 429:
            responses[str(status)]["headers"] = {"Retry-After": {
                "description": "seconds to wait before trying again",
                "schema": {"type": "integer", "minimum": 1}}}
    operation["responses"] = responses
    return operation


def add(path: str, method: str, operation: dict[str, Any]) -> None:
    methods = PATHS.setdefault(path, {})
    if method in methods:
        raise ValueError(f"{method.upper()} {path} is documented twice")
    methods[method] = operation


def document() -> dict[str, Any]:
    """A fresh copy of the whole document, as `GET /openapi.json` serves it."""
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
            "securitySchemes": {"bearerAuth": {
                "type": "http", "scheme": "bearer",
                "description": "an API key made with `kurir keys create`"}},
        },
        "security": [{"bearerAuth": []}],
    }


blueprint = Blueprint("openapi", __name__)


@blueprint.get("/openapi.json")
def openapi_json() -> Response:
    return jsonify(document())


# ---------------------------------------------------------------------------- common schemas

schema("Error", obj({"error": obj({
    "code": {"type": "string", "description": "machine-readable, e.g. `validation_failed`"},
    "message": STRING,
    "details": {"description": "what exactly was wrong (free form: object, list or null)"},
})}))

# ---------------------------------------------------------------------------- keys

TAGS.append({"name": "keys", "description": "API keys, and the audit trail"})
add("/v1/me", "get", op(
    "Who am I: the calling key and its scopes", tag="keys", scope="read",
    ok={200: obj({"id": STRING, "name": STRING, "scopes": array(STRING),
                  "partner": dict(OPT_STRING, description="uid of the partner the key is "
                                                           "bound to, if any")})}))
API_KEY = schema("ApiKey", obj({
    "id": STRING, "name": STRING,
    "prefix": {"type": "string", "description": "the first characters of the key, to tell "
                                                "keys apart; never the key"},
    "scopes": array(STRING), "partner": OPT_STRING, "created_at": TIMESTAMP,
    "last_used_at": dict(OPT_TIMESTAMP, description="updated at most once a minute"),
    "revoked_at": OPT_TIMESTAMP}))
KEY_ID = [path_param("key_id", "API key id")]
add("/v1/keys", "get", op(
    "List API keys, newest first (never the keys themselves)", tag="keys", scope="admin",
    params=PAGE_PARAMS, ok={200: schema("ApiKeyPage", page_of("ApiKey"))}, errors=(400,)))
add("/v1/keys/{key_id}", "get", op(
    "Read an API key", tag="keys", scope="admin", params=KEY_ID, ok={200: API_KEY},
    errors=(404,)))
add("/v1/keys/{key_id}", "delete", op(
    "Revoke an API key: every API process refuses it within a second", tag="keys",
    scope="admin", params=KEY_ID, ok={200: API_KEY}, errors=(404, 409)))
AUDIT_RECORD = schema("AuditRecord", obj({
    "id": STRING,
    "actor": {"type": "string", "description": "key:<name>, operator:<email>, cli[:<user>], "
                                               "portal:<uid> or system"},
    "action": {"type": "string", "examples": ["endpoint.disabled"]},
    "subject_type": STRING, "subject_id": STRING, "details": ANY_OBJECT,
    "created_at": TIMESTAMP}))
add("/v1/audit", "get", op(
    "The audit trail, newest first: every state change, by whom", tag="keys", scope="read",
    params=[query("subject", "only changes to this id (an endpoint, a key, ...)"),
            query("action", "only this action, e.g. endpoint.secret_rotated"), *PAGE_PARAMS],
    ok={200: schema("AuditRecordPage", page_of("AuditRecord"))}, errors=(400,)))

# ---------------------------------------------------------------------------- event types

TAGS.append({"name": "event-types", "description": "versioned event contracts"})
_EVENT_TYPE_PROPS: dict[str, Schema] = {
    "id": STRING,
    "name": STRING,
    "version": {"type": "integer", "minimum": 1},
    "schema": {"type": "object", "description": "JSON Schema that `data` must satisfy"},
    "description": OPT_STRING,
    "deprecated": BOOLEAN,
    "deprecated_at": OPT_TIMESTAMP,
    "sunset_at": OPT_TIMESTAMP,
    "downgrade": dict(OPT_STRING, description="JMESPath from this version's data to the "
                                              "previous version's"),
    "examples": array(ANY_OBJECT),
    "created_at": TIMESTAMP,
}
EVENT_TYPE = schema("EventType", obj(_EVENT_TYPE_PROPS))
EVENT_TYPE_CREATE = schema("EventTypeCreate", obj({
    "name": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$",
             "examples": ["payment.succeeded"]},
    "version": {"type": "integer", "minimum": 1},
    "schema": {"type": "object", "description": "a valid JSON Schema (2020-12 unless "
                                                "`$schema` says otherwise); local $refs only"},
    "description": OPT_STRING,
    "downgrade": {"type": "string", "maxLength": 4000,
                  "description": "JMESPath turning this version's data into version-1's, "
                                 "e.g. `{amount: amount_minor, currency: currency}`; checked "
                                 "against every example at registration. 422 "
                                 "`invalid_downgrade` when it nests past "
                                 f"{downgrades.MAX_DEPTH} levels, has more than "
                                 f"{downgrades.MAX_PIPES} pipes, calls an unknown function, "
                                 "can copy one part of its input more than "
                                 f"{downgrades.MAX_COPIES} times, or makes more than "
                                 "KURIR_MAX_PAYLOAD_BYTES from an example (`details.bound` "
                                 "or `details.reason` says which)"},
    "examples": array(ANY_OBJECT, maxItems=20,
                      description="sample data of this version (validated)"),
}, required=["name", "version", "schema"]))
NAME_VERSION = [path_param("name", "event type name"),
                path_param("version", "contract version", "integer")]

add("/v1/event-types", "post", op(
    "Register a contract version", tag="event-types", scope="events:write",
    description="201 when new; 200 when the identical schema is already registered; 409 when "
                "the version exists with another schema (published versions are immutable).",
    body=EVENT_TYPE_CREATE, ok={201: EVENT_TYPE, 200: EVENT_TYPE},
    errors=(400, 409, 413, 415, 422)))
add("/v1/event-types", "get", op(
    "List contract versions, newest first", tag="event-types", scope="read",
    params=[query("name", "only this event type name"), *PAGE_PARAMS],
    ok={200: schema("EventTypePage", page_of("EventType"))}, errors=(400,)))
add("/v1/event-types/{name}/{version}", "get", op(
    "Read one contract version", tag="event-types", scope="read", params=NAME_VERSION,
    ok={200: EVENT_TYPE}, errors=(404,)))
add("/v1/event-types/{name}/{version}/deprecate", "post", op(
    "Deprecate a version: still accepted, with a warning", tag="event-types",
    scope="events:write", params=NAME_VERSION, body_required=False,
    body=obj({"sunset_at": dict(TIMESTAMP, description="from when endpoints still pinned "
                                                       "to it are reported")}, required=[]),
    ok={200: EVENT_TYPE}, errors=(404, 415, 422)))
add("/v1/event-types/{name}/versions", "get", op(
    "Every version of a type with its adoption", tag="event-types", scope="read",
    params=[path_param("name", "event type name")],
    ok={200: obj({"data": array(schema("EventTypeAdoption", obj({
        **_EVENT_TYPE_PROPS,
        "endpoints_pinned": dict(array(STRING), description="live endpoints pinned to it"),
        "deliveries_7d": dict(INTEGER, description="deliveries of it in the last 7 days")})))})},
    errors=(404,)))

# ---------------------------------------------------------------------------- partners

TAGS.append({"name": "partners", "description": "receiving organisations and their endpoints"})
PARTNER = schema("Partner", obj({
    "id": STRING, "uid": STRING, "name": STRING, "created_at": TIMESTAMP,
    "updated_at": TIMESTAMP}))
PARTNER_CREATE = schema("PartnerCreate", obj({
    "uid": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,199}$",
            "description": "chosen by the publisher, unique"},
    "name": {"type": "string", "minLength": 1, "maxLength": 400},
}, required=["uid"]))
UID = path_param("uid", "partner uid")

add("/v1/partners", "post", op(
    "Create a partner", tag="partners", scope="endpoints:write", body=PARTNER_CREATE,
    ok={201: PARTNER}, errors=(400, 409, 413, 415, 422)))
add("/v1/partners", "get", op(
    "List partners, newest first", tag="partners", scope="read", params=PAGE_PARAMS,
    ok={200: schema("PartnerPage", page_of("Partner"))}, errors=(400,)))
add("/v1/partners/{uid}", "get", op(
    "Read a partner", tag="partners", scope="read", params=[UID], ok={200: PARTNER},
    errors=(404,)))

add("/v1/partners/{uid}/keys", "post", op(
    "Create an API key bound to this partner (the key is in this answer only)",
    tag="partners", scope="admin", params=[UID],
    description="A partner key reaches only this partner's endpoints, events, deliveries and "
                "dead letters; anything else answers 404. It can hold `read`, "
                "`endpoints:write` and `dlq:write` (default: all three), never publish or "
                "manage event types, sources, operators or keys.",
    body=schema("PartnerKeyCreate", obj({
        "name": {"type": "string", "minLength": 1, "maxLength": 200},
        "scopes": array({"type": "string", "enum": ["read", "endpoints:write", "dlq:write"]}),
    }, required=["name"])),
    ok={201: schema("ApiKeyWithKey", obj({
        "id": STRING, "name": STRING, "prefix": STRING, "scopes": array(STRING),
        "partner": STRING, "created_at": TIMESTAMP, "last_used_at": OPT_TIMESTAMP,
        "revoked_at": OPT_TIMESTAMP,
        "key": {"type": "string", "description": "the key itself: shown once, stored hashed"},
    }))}, errors=(400, 404, 413, 415, 422)))
add("/v1/partners/{uid}/portal-links", "post", op(
    "Make a one-time magic link to the partner portal", tag="partners",
    scope="endpoints:write", params=[UID], body_required=False,
    description="The link opens `/portal` for this partner only, once, until `expires_at` "
                "(default KURIR_PORTAL_LINK_TTL_SECONDS, 15 min; at most 24 h, and at most "
                "1 h when a partner key mints it). Its token is stored hashed. Revoking the "
                "key that minted it revokes it while unused and ends the session it opened. "
                "Embed it in an `<iframe>` from an origin listed in "
                "KURIR_PORTAL_FRAME_ANCESTORS, or send it to the partner. Without "
                "KURIR_PUBLIC_URL, a request that did not come in on a loopback address is "
                "refused (`503 public_url_required`): the link's host would come from the "
                "request.",
    body=schema("PortalLinkCreate", obj({
        "expires_in_s": {"type": "integer", "minimum": 60, "maximum": 86400}}, required=[])),
    ok={201: schema("PortalLink", obj({
        "id": STRING, "partner": STRING, "url": {"type": "string", "format": "uri"},
        "expires_at": TIMESTAMP, "created_at": TIMESTAMP}))},
    errors=(400, 404, 415, 422, 503)))
add("/v1/partners/{uid}/portal-sessions", "delete", op(
    "End every portal session and revoke every unused portal link of this partner",
    tag="partners", scope="admin", params=[UID],
    description="Takes effect at once in every API process: the portal reads its session "
                "on each request. `ended` counts the sessions that were still live, "
                "`revoked` the links that could still have been used. Revoking an API key "
                "(`DELETE /v1/keys/{id}`) does the same for what that key minted.",
    ok={200: schema("PortalRevocation", obj({
        "ended": {"type": "integer", "minimum": 0,
                  "description": "live portal sessions ended"},
        "revoked": {"type": "integer", "minimum": 0,
                    "description": "unused, unexpired links revoked"}}))},
    errors=(403, 404)))

# ---------------------------------------------------------------------------- endpoints

TAGS.append({"name": "endpoints", "description": "partner URLs, subscriptions and secrets"})
_HEADERS: Schema = {"type": "object", "additionalProperties": {"type": "string"},
                    "maxProperties": 20,
                    "description": "custom headers; no CR/LF, no webhook-*, content-type, "
                                   "content-length, host, transfer-encoding, user-agent"}
_HEADERS_SHOWN: Schema = {"type": "object", "additionalProperties": nullable(STRING),
                          "description": "every custom header by name; values are write-only "
                                         "(null) unless listed in public_headers"}
_HEADERS_CHANGE: Schema = {"type": "object", "additionalProperties": nullable(STRING),
                           "maxProperties": 20,
                           "description": "replaces the custom headers; a null value keeps "
                                          "that header's stored value"}
_PUBLIC_HEADERS: Schema = array(STRING, description="custom headers whose values reads may "
                                                    "show (the others are write-only)")
_VERSIONS: Schema = {"type": "object", "additionalProperties": {"type": "integer",
                                                                  "minimum": 1},
                     "description": "contract version pinned per event type; other types "
                                    "arrive in the version published. 422 "
                                    "`version_unavailable` (`details.type`) when no chain of "
                                    f"at most {downgrades.MAX_HOPS} downgrades makes it from "
                                    "the type's newest version"}
_EVENT_TYPES: Schema = nullable(array(STRING, minItems=1))
_EVENT_TYPES["description"] = "names of registered event types; null subscribes to all"
_TIMEOUT: Schema = {"type": "integer", "minimum": 1, "maximum": 30}
_RATE: Schema = nullable({"type": "integer", "minimum": 1})
_ORDERING: Schema = {"type": "string", "enum": ["none", "key"],
                     "description": "key: one ordering key's events arrive one at a time, in "
                                    "publish-commit order, with webhook-sequence and "
                                    "webhook-previous-id headers (default none)"}
_ON_DEAD: Schema = {"type": "string", "enum": ["skip", "block"],
                    "description": "for ordered endpoints, what a dead delivery does to the "
                                   "rest of its key: skip goes on with the next, block holds "
                                   "the key until its dead letter is resent or discarded "
                                   "(default skip)"}
SECRET: Schema = {"type": "string", "pattern": "^whsec_",
                  "description": "whsec_ + base64 of 24-64 random bytes"}
_MODE: Schema = {"type": "string", "enum": ["push", "pull"],
                  "description": "push: Kurir POSTs every event; pull: nothing is sent, the "
                                 "partner reads GET /v1/partners/{uid}/feed?endpoint={id} and "
                                 "acknowledges. Fixed at creation."}
LAG = schema("PullLag", obj({
    "events": dict(INTEGER, description="events in the endpoint's feed not acknowledged yet"),
    "oldest_unacknowledged_at": OPT_TIMESTAMP,
    "oldest_unacknowledged_age_s": nullable({"type": "number", "minimum": 0}),
    "acknowledged_at": dict(OPT_TIMESTAMP, description="when the last acknowledgement moved "
                                                        "the position"),
    "expired_events": dict(INTEGER, description="of `events`, those created before the "
                                                "retention horizon: reads without a cursor "
                                                "answer 410 `backlog_expired` until they are "
                                                "skipped"),
}, description="what a pull endpoint's consumer is behind"))
_ENDPOINT_PROPS: dict[str, Schema] = {
    "id": STRING,
    "partner": {"type": "string", "description": "the partner uid"},
    "url": nullable({"type": "string", "format": "uri",
                     "description": "null for a pull endpoint"}),
    "mode": _MODE,
    "event_types": _EVENT_TYPES,
    "description": OPT_STRING,
    "headers": _HEADERS_SHOWN,
    "public_headers": _PUBLIC_HEADERS,
    "versions": _VERSIONS,
    "timeout_s": _TIMEOUT,
    "rate_limit_per_s": _RATE,
    "ordering": _ORDERING,
    "on_dead": _ON_DEAD,
    "state": {"type": "string", "enum": ["enabled", "disabled"]},
    "disabled_reason": OPT_STRING,
    "disabled_at": OPT_TIMESTAMP,
    "disabled_by": nullable({"type": "string", "enum": ["operator", "partner", "health"],
                             "description": "who disabled it: an operator (UI, admin key, "
                                            "CLI; a partner's credentials cannot enable it "
                                            "again), the partner, or Kurir's health monitor "
                                            "after failures"}),
    "consecutive_failures": {"type": "integer", "minimum": 0},
    "last_success_at": OPT_TIMESTAMP,
    "last_failure_at": OPT_TIMESTAMP,
    "created_at": TIMESTAMP,
    "updated_at": TIMESTAMP,
}
ENDPOINT = schema("Endpoint", obj(_ENDPOINT_PROPS))
ENDPOINT_WITH_LAG = schema("EndpointWithLag", obj(
    {**_ENDPOINT_PROPS, "lag": LAG}, required=list(_ENDPOINT_PROPS),
    description="`lag` for a pull endpoint only"))
ENDPOINT_WITH_SECRET = schema("EndpointWithSecret", obj({**_ENDPOINT_PROPS, "secret": SECRET},
                                                        description="only in the answers to "
                                                                    "create and rotate"))
ENDPOINT_CREATE = schema("EndpointCreate", obj({
    "url": {"type": "string", "format": "uri", "maxLength": 2048,
            "description": "http(s); refused when it resolves to an internal address or "
                           "carries user:password@ (send credentials in a header). Required "
                           "for a push endpoint, refused for a pull endpoint"},
    "mode": dict(_MODE, description="default push; fixed at creation"),
    "event_types": _EVENT_TYPES,
    "description": nullable({"type": "string", "maxLength": 1000}),
    "headers": _HEADERS,
    "public_headers": _PUBLIC_HEADERS,
    "versions": nullable(_VERSIONS),
    "timeout_s": _TIMEOUT,
    "rate_limit_per_s": _RATE,
    "ordering": _ORDERING,
    "on_dead": _ON_DEAD,
    "secret": dict(SECRET, description="optional; generated when absent"),
}, required=[]))
ENDPOINT_UPDATE = schema("EndpointUpdate", obj({
    "url": {"type": "string", "format": "uri", "maxLength": 2048},
    "event_types": _EVENT_TYPES,
    "description": nullable({"type": "string", "maxLength": 1000}),
    "headers": _HEADERS_CHANGE,
    "public_headers": _PUBLIC_HEADERS,
    "versions": nullable(_VERSIONS),
    "timeout_s": _TIMEOUT,
    "rate_limit_per_s": _RATE,
    "ordering": _ORDERING,
    "on_dead": _ON_DEAD,
}, required=[]))
EP = [UID, path_param("endpoint_id", "endpoint id")]
_EP_PATH = "/v1/partners/{uid}/endpoints/{endpoint_id}"

add("/v1/partners/{uid}/endpoints", "post", op(
    "Create an endpoint (answer includes its secret)", tag="endpoints",
    scope="endpoints:write", params=[UID], body=ENDPOINT_CREATE,
    description="A partner has at most `KURIR_MAX_ENDPOINTS_PER_PARTNER` live endpoints "
                "(default 50): one more is 422 `endpoint_limit`. A partner's own keys create "
                "at most `KURIR_PARTNER_ENDPOINT_CREATES_PER_MINUTE` a minute: more is 429 "
                "`rate_limited` with `Retry-After`.",
    ok={201: ENDPOINT_WITH_SECRET}, errors=(400, 404, 413, 415, 422, 429)))
add("/v1/partners/{uid}/endpoints", "get", op(
    "List a partner's endpoints, newest first", tag="endpoints", scope="read",
    params=[UID, query("state", "enabled or disabled"), *PAGE_PARAMS],
    ok={200: schema("EndpointPage", page_of("Endpoint"))}, errors=(400, 404)))
add(_EP_PATH, "get", op("Read an endpoint (a pull endpoint with its lag)", tag="endpoints",
                        scope="read", params=EP, ok={200: ENDPOINT_WITH_LAG}, errors=(404,)))
add(_EP_PATH, "patch", op(
    "Change an endpoint (only the fields given)", tag="endpoints", scope="endpoints:write",
    params=EP, body=ENDPOINT_UPDATE, ok={200: ENDPOINT}, errors=(400, 404, 413, 415, 422)))
add(_EP_PATH, "delete", op(
    "Remove an endpoint (its history stays)", tag="endpoints", scope="endpoints:write",
    params=EP, ok={204: None}, errors=(404,)))
add(f"{_EP_PATH}/enable", "post", op(
    "Enable an endpoint", tag="endpoints", scope="endpoints:write", params=EP,
    description="A partner's key cannot enable an endpoint an operator disabled "
                "(`disabled_by: operator`): 409 `disabled_by_operator`. One the health "
                "monitor or the partner disabled, it can.",
    ok={200: ENDPOINT}, errors=(404, 409)))
add(f"{_EP_PATH}/disable", "post", op(
    "Disable an endpoint: new events are parked as dead letters", tag="endpoints",
    scope="endpoints:write", params=EP, body_required=False,
    body=schema("EndpointDisable", obj({"reason": {"type": "string", "maxLength": 200}},
                                       required=[])),
    ok={200: ENDPOINT}, errors=(400, 404, 415, 422)))
add(f"{_EP_PATH}/secret/rotate", "post", op(
    "Rotate the secret; the old one keeps signing for the rotation overlap",
    tag="endpoints", scope="endpoints:write", params=EP, body_required=False,
    body=schema("SecretRotate", obj({"secret": SECRET}, required=[])),
    ok={200: ENDPOINT_WITH_SECRET}, errors=(400, 404, 415, 422)))
add(f"{_EP_PATH}/test", "post", op(
    "Send a `kurir.test` event to this endpoint only", tag="endpoints",
    scope="endpoints:write", params=EP,
    description="Through the normal delivery engine (signed, retried, recorded); follow it "
                "with GET /v1/deliveries/{id}. 409 `endpoint_disabled` for a disabled "
                "endpoint (enable it first), 409 `pull_endpoint` for a pull endpoint. A "
                "partner's own keys send at most `KURIR_PARTNER_TEST_SENDS_PER_MINUTE` a "
                "minute: more is 429 `rate_limited` with `Retry-After`; while the rate "
                "limiter (Redis) is unreachable they are refused, 503 `unavailable`.",
    ok={202: ref("Delivery")}, errors=(404, 409, 429, 503)))
add(f"{_EP_PATH}/blocked-keys", "get", op(
    "List the ordering keys this endpoint holds behind a dead delivery", tag="endpoints",
    scope="read", params=[*EP, *PAGE_PARAMS],
    description="Only for `ordering: key` with `on_dead: block`. Each key's head is its "
                "first dead delivery after which nothing of the key went out; `waiting` counts "
                "the deliveries held behind it. Resending the head's dead letter (POST "
                "/v1/dead-letters/{id}/resend) or discarding it (…/discard) releases the key.",
    ok={200: schema("BlockedKeyPage", obj({
        "data": array(obj({
            "ordering_key": STRING, "sequence": {"type": "integer", "minimum": 1},
            "delivery": STRING, "event": STRING, "dead_letter": STRING, "reason": STRING,
            "waiting": {"type": "integer", "minimum": 0}})),
        "next_cursor": OPT_STRING}))}, errors=(400, 404)))
add(f"{_EP_PATH}/secret", "get", op(
    "Read the current secret", tag="endpoints", scope="endpoints:write", params=EP,
    ok={200: schema("Secret", obj({
        "id": STRING, "endpoint": STRING, "secret": SECRET, "created_at": TIMESTAMP,
        "expires_at": OPT_TIMESTAMP}))}, errors=(404,)))

# ---------------------------------------------------------------------------- events

TAGS.append({"name": "events", "description": "publish and read events"})
RESOURCE = schema("Resource", obj({
    "type": {"type": "string", "minLength": 1, "maxLength": 200},
    "id": {"type": "string", "minLength": 1, "maxLength": 200},
    "version": nullable({"type": "integer", "minimum": 0}),
}, required=["type", "id"]))
PUBLISH = schema("PublishRequest", obj({
    "type": {"type": "string", "minLength": 1, "maxLength": 200},
    "version": {"type": "integer", "minimum": 1},
    "data": {"type": "object", "description": "validated against the contract's JSON Schema"},
    "occurred_at": dict(TIMESTAMP, description="default: now"),
    "resource": nullable(RESOURCE),
    "correlation_id": nullable({"type": "string", "maxLength": 200}),
    "ordering_key": nullable({"type": "string", "minLength": 1, "maxLength": 255,
                              "description": "events of one key reach ordered endpoints in "
                                            "publish-commit order; default `{resource.type}:"
                                            "{resource.id}` when `resource` is given, none "
                                            "when null"}),
    "renditions": {"type": "object", "additionalProperties": {"type": "object"},
                   "propertyNames": {"pattern": "^[1-9][0-9]*$"},
                   "description": "the same event's `data` in other versions, by version "
                                  "number; each is validated, and wins over a downgrade"},
}, required=["type", "version", "data"]))
WARNING = schema("Warning", obj({
    "code": STRING, "message": STRING,
    "type": STRING, "version": INTEGER,
    "sunset_at": OPT_TIMESTAMP,
    "endpoints": dict(array(STRING), description="endpoints pinned to this version")},
    required=["code", "message"]))
DELIVERY_STATE: Schema = {"type": "string",
                          "enum": ["pending", "delivering", "succeeded", "retrying", "dead"]}
PUBLISHED = schema("PublishResponse", obj({
    "id": {"type": "string", "pattern": "^evt_"},
    "type": STRING,
    "version": INTEGER,
    "deliveries": array(obj({"id": STRING, "endpoint": STRING, "state": DELIVERY_STATE,
                             "version": dict(INTEGER, description="the contract version "
                                                                  "this endpoint receives")})),
    "warnings": array(WARNING),
}))
ATTEMPT = schema("Attempt", obj({
    "n": {"type": "integer", "minimum": 1},
    "started_at": TIMESTAMP,
    "duration_ms": {"type": "integer", "minimum": 0},
    "response_status": OPT_INTEGER,
    "response_body": nullable({"type": "string",
                               "description": "first 4 KiB, decoded as UTF-8 (replaced)"}),
    "response_headers": nullable({"type": "object", "additionalProperties": STRING,
                                  "description": "the partner's answer headers where kept "
                                                 "(credentials such as Set-Cookie shown as "
                                                 "[redacted])"}),
    "error": OPT_STRING,
}))
_DELIVERY_PROPS: dict[str, Schema] = {
    "id": STRING,
    "event": STRING,
    "endpoint": STRING,
    "version": dict(INTEGER, description="the contract version this delivery carries (its "
                                         "endpoint's pin, or the version published)"),
    "state": DELIVERY_STATE,
    "attempt_count": {"type": "integer", "minimum": 0},
    "next_attempt_at": OPT_TIMESTAMP,
    "last_status_code": OPT_INTEGER,
    "last_error": OPT_STRING,
    "ordering": nullable(obj({
        "key": STRING, "sequence": {"type": "integer", "minimum": 1},
        "previous_event": OPT_STRING},
        description="for an ordered endpoint: the key, this delivery's webhook-sequence and "
                    "the event sent as webhook-previous-id")),
    "created_at": TIMESTAMP,
    "updated_at": TIMESTAMP,
    "attempts": array(ATTEMPT),
}
DELIVERY = schema("Delivery", obj(_DELIVERY_PROPS,
                                  required=[k for k in _DELIVERY_PROPS if k != "attempts"]))
_EVENT_PROPS: dict[str, Schema] = {
    "id": STRING,
    "type": STRING,
    "version": INTEGER,
    "occurred_at": TIMESTAMP,
    "partner": STRING,
    "resource": nullable(RESOURCE),
    "correlation_id": OPT_STRING,
    "ordering_key": OPT_STRING,
    "data": ANY_OBJECT,
    "created_at": TIMESTAMP,
}
EVENT = schema("Event", obj(_EVENT_PROPS))
EVENT_DETAIL = schema("EventWithDeliveries", obj({**_EVENT_PROPS,
                                                  "deliveries": array(DELIVERY)}))

add("/v1/partners/{uid}/events", "post", op(
    "Publish an event to a partner", tag="events", scope="events:write", params=[
        UID,
        {"name": "Idempotency-Key", "in": "header", "required": False,
         "description": "≤ 255 characters, scoped to the API key, remembered ≥ 24 h",
         "schema": {"type": "string", "minLength": 1, "maxLength": 255}},
    ], body=PUBLISH, ok={202: PUBLISHED},
    headers={202: {"Idempotent-Replayed": {
        "description": "`true` when this is the stored answer to an earlier request",
        "schema": {"type": "string"}}}},
    description="The event and one delivery per subscribed endpoint are committed in one "
                "transaction before the 202. A disabled endpoint gets a delivery that is "
                "parked at once (state `dead`, dead letter `endpoint_disabled`). A version "
                "a pinned endpoint needs that cannot be made is 422 `version_unavailable`; "
                "one whose downgrade would make more than KURIR_MAX_PAYLOAD_BYTES of JSON "
                "(or spend more than its work budget) is 422 `version_too_large` "
                "(`details.version`); nothing is stored either way.",
    errors=(400, 404, 409, 413, 415, 422)))
add("/v1/partners/{uid}/events", "get", op(
    "List a partner's events, newest first", tag="events", scope="read", params=[
        UID,
        query("type", "only this event type"),
        query("since", "created at or after (RFC 3339)", TIMESTAMP),
        query("until", "created before (RFC 3339)", TIMESTAMP),
        query("delivery_success", "`false`: events with a delivery not (yet) succeeded; "
                                  "`true`: every delivery succeeded",
              {"type": "string", "enum": ["true", "false", "1", "0"]}),
        *PAGE_PARAMS,
    ], ok={200: schema("EventPage", page_of("Event"))}, errors=(400, 404)))
add("/v1/events/{event_id}", "get", op(
    "Read one event with its deliveries and their attempts", tag="events", scope="read",
    params=[path_param("event_id", "event id")], ok={200: EVENT_DETAIL}, errors=(404,)))

# ---------------------------------------------------------------------------- feed

TAGS.append({"name": "feed", "description": "a partner's events in commit order, for pulling"})
FEED_CURSOR: Schema = {"type": "string", "description": "opaque; valid for the retention "
                                                        "period (KURIR_RETENTION_DAYS)"}
add("/v1/partners/{uid}/feed", "get", op(
    "Read a partner's feed: its events in commit order", tag="feed", scope="read", params=[
        UID,
        query("after", "the `next_cursor` of the previous answer; without it, from the "
                       "oldest event within retention (a pull endpoint: from its last "
                       "acknowledgement)", FEED_CURSOR),
        query("limit", "page size (default 50)",
              {"type": "integer", "minimum": 1, "maximum": 250}),
        query("endpoint", "as this endpoint receives it: its subscribed types, each in the "
                          "version it is pinned to"),
    ], ok={200: schema("FeedPage", obj({
        "data": array(schema("Envelope", obj(
            {k: v for k, v in _EVENT_PROPS.items() if k not in ("created_at", "ordering_key")},
            description="exactly the body a pushed webhook carries"))),
        "next_cursor": FEED_CURSOR}))},
    description="A consumer paging with `next_cursor` while publishers write sees every event "
                "exactly once, in commit order: positions are given only to committed events. "
                "`next_cursor` is always given; an empty `data` means nothing new yet. A cursor "
                "older than the retention period answers 410 `cursor_expired`; a malformed one "
                "400 `invalid_cursor`. A pull endpoint read without a cursor whose "
                "acknowledgement lies behind the retention horizon answers 410 "
                "`backlog_expired` with `details: {horizon, skipped, oldest_event}` instead of "
                "skipping those events silently; `POST …/skip-expired` moves past them.",
    errors=(400, 404, 410)))
add("/v1/partners/{uid}/endpoints/{endpoint_id}/ack", "post", op(
    "Acknowledge a pull endpoint's feed up to a cursor", tag="feed", scope="endpoints:write",
    params=EP, body=schema("FeedAck", obj({"cursor": FEED_CURSOR})),
    ok={200: ENDPOINT_WITH_LAG},
    description="The position only moves forward: an older cursor (a late retry) is accepted "
                "and changes nothing. 409 `push_endpoint` for a push endpoint; 400 "
                "`invalid_cursor`; 410 `cursor_expired`.",
    errors=(400, 404, 409, 410, 415, 422)))
add("/v1/partners/{uid}/endpoints/{endpoint_id}/skip-expired", "post", op(
    "Move a pull endpoint past the events of its backlog that lie beyond retention",
    tag="feed", scope="endpoints:write", params=EP, ok={200: ENDPOINT_WITH_LAG},
    description="The way out of 410 `backlog_expired`: the acknowledgement moves to the last "
                "event created before the retention horizon, and past nothing younger. "
                "Audited (`endpoint.backlog_skipped`, with the count and the oldest event); "
                "with nothing to skip it changes nothing. 409 `push_endpoint` for a push "
                "endpoint.",
    errors=(404, 409)))

# ---------------------------------------------------------------------------- deliveries

TAGS.append({"name": "deliveries", "description": "one event to one endpoint"})
DELIVERY_ID = [path_param("delivery_id", "delivery id")]
add("/v1/deliveries", "get", op(
    "The delivery log, newest first", tag="deliveries", scope="read",
    params=[query("partner", "partner uid"), query("endpoint", "endpoint id"),
            query("state", "delivery state", DELIVERY_STATE),
            query("type", "event type"),
            query("status_code", "last HTTP status, or `none` for no answer"),
            query("since", "created at or after (RFC 3339)", TIMESTAMP),
            query("until", "created before (RFC 3339)", TIMESTAMP), *PAGE_PARAMS],
    description="A partner key sees its own partner's deliveries only.",
    ok={200: schema("DeliveryPage", page_of("Delivery"))}, errors=(400, 404)))
add("/v1/deliveries/{delivery_id}", "get", op(
    "Read a delivery with its attempts", tag="deliveries", scope="read", params=DELIVERY_ID,
    ok={200: DELIVERY}, errors=(404,)))
FORCE_PARAM = query("force", "also to a disabled endpoint (or `force` in the body)",
                    {"type": "string", "enum": ["true", "false", "1", "0"]})
add("/v1/deliveries/{delivery_id}/retry", "post", op(
    "Try a delivery now", tag="deliveries", scope="dlq:write",
    params=[*DELIVERY_ID, FORCE_PARAM], body_required=False,
    body={"type": "object", "properties": {"force": BOOLEAN}},
    description="A pending or retrying delivery becomes due now; a succeeded one is sent "
                "again as a new run; a dead one is resent through its open dead letter "
                "(audited there): 409 `endpoint_disabled` unless `force`, 409 "
                "`dead_letter_not_open` when its letter was discarded. 409 "
                "`delivery_in_flight` while an attempt runs.",
    ok={200: DELIVERY, 202: DELIVERY}, errors=(400, 404, 409, 415, 422)))

# ---------------------------------------------------------------------------- dead letters

TAGS.append({"name": "dead-letters", "description": "what Kurir stopped trying: search, "
                                                    "resend, discard"})
DEAD_LETTER_STATE: Schema = {"type": "string", "enum": ["open", "resent", "discarded"]}
DEAD_LETTER = schema("DeadLetter", obj({
    "id": STRING,
    "delivery": STRING,
    "event": STRING,
    "endpoint": STRING,
    "partner": STRING,
    "type": STRING,
    "version": dict(INTEGER, description="the contract version the delivery carries (its "
                                         "endpoint's pin, or the version published): the "
                                         "envelope's `version` it was sent with"),
    "reason": STRING,
    "last_status_code": OPT_INTEGER,
    "last_error": OPT_STRING,
    "state": DEAD_LETTER_STATE,
    "created_at": TIMESTAMP,
    "audit": array(ANY_OBJECT),
    "attempts": array(ATTEMPT),
}, required=["id", "delivery", "event", "endpoint", "partner", "type", "version", "reason",
             "last_status_code", "last_error", "state", "created_at", "audit"], strict=False))
LETTER_ID = [path_param("letter_id", "dead letter id")]
DL_FILTERS = [
    query("partner", "partner uid"), query("endpoint", "endpoint id"),
    query("type", "event type"), query("reason", "e.g. retries_exhausted, endpoint_disabled"),
    query("status_code", "last HTTP status", INTEGER), query("error", "last error class"),
    query("since", "created at or after", TIMESTAMP), query("until", "created before",
                                                            TIMESTAMP),
    query("q", "text in the payload"), query("state", "open, resent or discarded",
                                             DEAD_LETTER_STATE),
]
BULK = schema("BulkResend", {"type": "object", "properties": {
    "count": INTEGER, "job_id": OPT_STRING, "status_url": STRING,
    "resent": array(STRING), "skipped": array(ANY_OBJECT)}, "required": ["count", "job_id"]})
add("/v1/dead-letters", "get", op(
    "Search dead letters, newest first", tag="dead-letters", scope="read",
    params=[*DL_FILTERS, *PAGE_PARAMS],
    ok={200: schema("DeadLetterPage", page_of("DeadLetter"))}, errors=(400, 422)))
add("/v1/dead-letters/{letter_id}", "get", op(
    "Read a dead letter with its attempts and audit", tag="dead-letters", scope="read",
    params=LETTER_ID, ok={200: DEAD_LETTER}, errors=(404,)))
add("/v1/dead-letters/{letter_id}/resend", "post", op(
    "Resend one dead letter (same event id, fresh attempt budget)", tag="dead-letters",
    scope="dlq:write", params=LETTER_ID, body_required=False,
    body={"type": "object", "properties": {"force": BOOLEAN}},
    ok={200: DEAD_LETTER}, errors=(400, 404, 409, 415, 422)))
RESEND_FILTER = obj({
    "partner": STRING, "endpoint": STRING, "type": STRING, "reason": STRING,
    "status_code": {"type": ["integer", "string"],
                    "description": "last HTTP status, or `none` for no answer"},
    "error": STRING, "q": STRING, "since": TIMESTAMP, "until": TIMESTAMP,
    "state": {"type": "string", "enum": ["open"]},
    "all": {"type": "boolean", "description": "required (`true`) when no criterion is given: "
                                              "resend every open dead letter"},
}, required=[], description="search criteria (AND); at least one, or `all: true`")
add("/v1/dead-letters/resend", "post", op(
    "Resend many: `{ids: [...]}` or `{filter: {...}}`", tag="dead-letters",
    scope="dlq:write",
    description="A filter with no criteria is refused (422 `invalid_parameter`); "
                '`{"filter": {"all": true}}` resends every open dead letter.',
    body={"type": "object", "properties": {"ids": array(STRING), "filter": RESEND_FILTER,
                                           "force": BOOLEAN}},
    ok={200: BULK, 202: BULK}, errors=(400, 415, 422)))
add("/v1/dead-letters/resend-jobs/{op_id}", "get", op(
    "Progress of a bulk resend", tag="dead-letters", scope="read",
    params=[path_param("op_id", "bulk operation id")],
    ok={200: schema("BulkOperation", obj({
        "id": STRING, "kind": STRING, "state": STRING, "total": INTEGER, "done": INTEGER,
        "failed": INTEGER}, strict=False))}, errors=(404,)))
add("/v1/dead-letters/{letter_id}/discard", "post", op(
    "Discard a dead letter (audited)", tag="dead-letters", scope="dlq:write",
    params=LETTER_ID, body_required=False,
    body={"type": "object", "properties": {"note": STRING}},
    ok={200: DEAD_LETTER}, errors=(400, 404, 409, 415, 422)))

# ---------------------------------------------------------------------------- inbound

TAGS.append({"name": "inbound", "description": "partner callbacks: sources, received events"})
SOURCE = schema("Source", obj({
    "id": STRING, "name": STRING, "scheme": STRING, "tolerance_s": INTEGER,
    "mapping": ANY_OBJECT, "receive_path": STRING, "secrets": array(ANY_OBJECT),
    "created_at": TIMESTAMP}, strict=False))
SOURCE_NAME = path_param("name", "source name")
add("/v1/sources", "post", op(
    "Configure an inbound source", tag="inbound", scope="sources:write",
    body={"type": "object", "required": ["name", "scheme"], "properties": {
        "name": STRING,
        "scheme": {"type": "string",
                   "enum": ["standard-webhooks", "stripe", "github", "shopify"]},
        "secret": STRING, "secrets": array(STRING), "tolerance_s": INTEGER,
        "mapping": ANY_OBJECT, "allow_gaps": BOOLEAN,
        "handlers": array({"oneOf": [STRING, ANY_OBJECT]}),
        "reconcile_url": OPT_STRING}},
    ok={201: SOURCE}, errors=(400, 409, 413, 415, 422)))
add("/v1/inbound-handlers", "get", op(
    "The handlers a source may select by name (KURIR_INBOUND_HANDLERS)", tag="inbound",
    scope="read", ok={200: obj({"data": array(obj({"name": STRING, "path": STRING}))})}))
add("/v1/sources", "get", op(
    "List inbound sources", tag="inbound", scope="read", params=PAGE_PARAMS,
    ok={200: schema("SourcePage", page_of("Source"))}, errors=(400,)))
add("/v1/sources/{name}", "get", op(
    "Read an inbound source", tag="inbound", scope="read", params=[SOURCE_NAME],
    ok={200: SOURCE}, errors=(404,)))
add("/v1/sources/{name}/secrets", "post", op(
    "Add (or rotate to) a verification secret", tag="inbound", scope="sources:write",
    params=[SOURCE_NAME],
    body={"type": "object", "properties": {"secret": STRING, "rotate": BOOLEAN}},
    ok={201: SOURCE}, errors=(400, 404, 415, 422)))
add("/v1/sources/{name}/resources/{resource_id}", "get", op(
    "Current state of one resource of a source", tag="inbound", scope="read",
    params=[SOURCE_NAME, path_param("resource_id", "resource id (may contain /)"),
            query("resource_type", "when several resource types share the id")],
    ok={200: schema("ResourceState", obj({
        "status": OPT_STRING, "version": OPT_INTEGER, "occurred_at": OPT_TIMESTAMP,
        "updated_at": TIMESTAMP}, strict=False))}, errors=(404, 409)))
INBOUND_STATUS: Schema = {"type": "string", "enum": ["received", "processing", "applied",
                                                     "ignored", "quarantined", "failed"]}
INBOUND_EVENT = schema("InboundEvent", obj({
    "id": STRING, "source": STRING, "event_id": STRING, "event_type": OPT_STRING,
    "resource_id": OPT_STRING, "resource_version": OPT_INTEGER,
    "occurred_at": OPT_TIMESTAMP, "status": INBOUND_STATUS, "reason": OPT_STRING,
    "received_at": TIMESTAMP, "created_at": TIMESTAMP}, strict=False))
INBOUND_ID = [path_param("event_id", "inbound event id")]
add("/v1/inbound-events", "get", op(
    "List received callbacks, newest first", tag="inbound", scope="read",
    params=[query("source", "source name"), query("status", "processing status",
                                                  INBOUND_STATUS),
            query("resource_id", "resource id"),
            query("since", "received at or after (RFC 3339)", TIMESTAMP),
            query("until", "received before (RFC 3339)", TIMESTAMP), *PAGE_PARAMS],
    ok={200: schema("InboundEventPage", page_of("InboundEvent"))}, errors=(400, 404)))
add("/v1/inbound-events/{event_id}", "get", op(
    "Read a received callback", tag="inbound", scope="read", params=INBOUND_ID,
    ok={200: INBOUND_EVENT}, errors=(404,)))
add("/v1/inbound-events/{event_id}/replay", "post", op(
    "Process a received callback again", tag="inbound", scope="sources:write",
    params=INBOUND_ID, ok={202: INBOUND_EVENT}, errors=(404, 409, 422)))
add("/inbound/{source}", "post", op(
    "Receive a partner callback (signature verified over the raw body)", tag="inbound",
    scope=None, params=[path_param("source", "source name")],
    body={"description": "whatever the partner sends; verified before it is parsed"},
    body_required=False,
    ok={202: ANY_OBJECT, 200: ANY_OBJECT}, errors=(400, 401, 404, 413, 503)))
