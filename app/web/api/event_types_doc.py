"""The API description of app/web/api/event_types.py: versioned event contracts.

It quotes the registration limits from `app.event_types` and its `downgrades` (the only part of
the web layer that may import them, see tests/unit/test_layering.py), so the document states
the bounds the code enforces.
"""

from __future__ import annotations

from app import event_types
from app.event_types import downgrades
from app.web.openapi import (
    ANY_OBJECT,
    BOOLEAN,
    INTEGER,
    OPT_STRING,
    OPT_TIMESTAMP,
    PAGE_PARAMS,
    STRING,
    TIMESTAMP,
    Schema,
    add,
    array,
    obj,
    op,
    page_of,
    path_param,
    query,
    schema,
)

_EVENT_TYPE_PROPS: dict[str, Schema] = {
    "id": STRING,
    "name": STRING,
    "version": {"type": "integer", "minimum": 1},
    "schema": {"type": "object", "description": "JSON Schema that `data` must satisfy"},
    "description": OPT_STRING,
    "deprecated": BOOLEAN,
    "deprecated_at": OPT_TIMESTAMP,
    "sunset_at": OPT_TIMESTAMP,
    "downgrade": dict(
        OPT_STRING, description="JMESPath from this version's data to the previous version's"
    ),
    "examples": array(ANY_OBJECT),
    "created_at": TIMESTAMP,
}
EVENT_TYPE = schema("EventType", obj(_EVENT_TYPE_PROPS))
EVENT_TYPE_CREATE = schema(
    "EventTypeCreate",
    obj(
        {
            "name": {
                "type": "string",
                "pattern": event_types.NAME_PATTERN.pattern,
                "examples": ["payment.succeeded"],
            },
            "version": {"type": "integer", "minimum": 1},
            "schema": {
                "type": "object",
                "description": "a valid JSON Schema (2020-12 unless "
                "`$schema` says otherwise); local $refs only",
            },
            "description": OPT_STRING,
            "downgrade": {
                "type": "string",
                "maxLength": event_types.MAX_DOWNGRADE,
                "description": "JMESPath turning this version's data into version-1's, "
                "e.g. `{amount: amount_minor, currency: currency}`; checked "
                "against every example at registration. 422 "
                "`invalid_downgrade` when it nests past "
                f"{downgrades.MAX_DEPTH} levels, has more than "
                f"{downgrades.MAX_PIPES} pipes, calls an unknown function, "
                "can copy one part of its input more than "
                f"{downgrades.MAX_COPIES} times, or makes more than "
                "KURIR_MAX_PAYLOAD_BYTES from an example (`details.bound` "
                "or `details.reason` says which)",
            },
            "examples": array(
                ANY_OBJECT,
                maxItems=event_types.MAX_EXAMPLES,
                description="sample data of this version (validated)",
            ),
        },
        required=["name", "version", "schema"],
    ),
)
NAME_VERSION = [
    path_param("name", "event type name"),
    path_param("version", "contract version", "integer"),
]

add(
    "/v1/event-types",
    "post",
    op(
        "Register a contract version",
        tag="event-types",
        scope="events:write",
        description="201 when new; 200 when the identical schema is already registered; 409 when "
        "the version exists with another schema (published versions are immutable).",
        body=EVENT_TYPE_CREATE,
        ok={201: EVENT_TYPE, 200: EVENT_TYPE},
        errors=(400, 409, 413, 415, 422),
    ),
)
add(
    "/v1/event-types",
    "get",
    op(
        "List contract versions, newest first",
        tag="event-types",
        scope="read",
        params=[query("name", "only this event type name"), *PAGE_PARAMS],
        ok={200: schema("EventTypePage", page_of("EventType"))},
        errors=(400,),
    ),
)
add(
    "/v1/event-types/{name}/{version}",
    "get",
    op(
        "Read one contract version",
        tag="event-types",
        scope="read",
        params=NAME_VERSION,
        ok={200: EVENT_TYPE},
        errors=(404,),
    ),
)
add(
    "/v1/event-types/{name}/{version}/deprecate",
    "post",
    op(
        "Deprecate a version: still accepted, with a warning",
        tag="event-types",
        scope="events:write",
        params=NAME_VERSION,
        body_required=False,
        body=obj(
            {
                "sunset_at": dict(
                    TIMESTAMP, description="from when endpoints still pinned to it are reported"
                )
            },
            required=[],
        ),
        ok={200: EVENT_TYPE},
        errors=(404, 415, 422),
    ),
)
add(
    "/v1/event-types/{name}/versions",
    "get",
    op(
        "Every version of a type with its adoption",
        tag="event-types",
        scope="read",
        params=[path_param("name", "event type name")],
        ok={
            200: obj(
                {
                    "data": array(
                        schema(
                            "EventTypeAdoption",
                            obj(
                                {
                                    **_EVENT_TYPE_PROPS,
                                    "endpoints_pinned": dict(
                                        array(STRING), description="live endpoints pinned to it"
                                    ),
                                    "deliveries_7d": dict(
                                        INTEGER, description="deliveries of it in the last 7 days"
                                    ),
                                }
                            ),
                        )
                    )
                }
            )
        },
        errors=(404,),
    ),
)
