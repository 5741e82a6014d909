"""The API description of app/web/api/events.py: publish an event, list and read events.

`EVENT_PROPS` is the envelope an event is stored and sent as; the feed's items are built on it.
"""

from __future__ import annotations

from app.web.api.deliveries_doc import DELIVERY, DELIVERY_STATE
from app.web.api.partners_doc import UID
from app.web.openapi import (
    ANY_OBJECT,
    FLAG,
    INTEGER,
    OPT_STRING,
    OPT_TIMESTAMP,
    PAGE_PARAMS,
    STRING,
    TIMESTAMP,
    Schema,
    add,
    array,
    nullable,
    obj,
    op,
    page_of,
    path_param,
    query,
    schema,
)

RESOURCE = schema(
    "Resource",
    obj(
        {
            "type": {"type": "string", "minLength": 1, "maxLength": 200},
            "id": {"type": "string", "minLength": 1, "maxLength": 200},
            "version": nullable({"type": "integer", "minimum": 0}),
        },
        required=["type", "id"],
    ),
)
PUBLISH = schema(
    "PublishRequest",
    obj(
        {
            "type": {"type": "string", "minLength": 1, "maxLength": 200},
            "version": {"type": "integer", "minimum": 1},
            "data": {
                "type": "object",
                "description": "validated against the contract's JSON Schema",
            },
            "occurred_at": dict(TIMESTAMP, description="default: now"),
            "resource": nullable(RESOURCE),
            "correlation_id": nullable({"type": "string", "maxLength": 200}),
            "ordering_key": nullable(
                {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 255,
                    "description": "events of one key reach ordered endpoints in "
                    "publish-commit order; default `{resource.type}:"
                    "{resource.id}` when `resource` is given, none "
                    "when null",
                }
            ),
            "renditions": {
                "type": "object",
                "additionalProperties": {"type": "object"},
                "propertyNames": {"pattern": "^[1-9][0-9]*$"},
                "description": "the same event's `data` in other versions, by version "
                "number; each is validated, and wins over a downgrade",
            },
        },
        required=["type", "version", "data"],
    ),
)
WARNING = schema(
    "Warning",
    obj(
        {
            "code": STRING,
            "message": STRING,
            "type": STRING,
            "version": INTEGER,
            "sunset_at": OPT_TIMESTAMP,
            "endpoints": dict(array(STRING), description="endpoints pinned to this version"),
        },
        required=["code", "message"],
    ),
)
PUBLISHED = schema(
    "PublishResponse",
    obj(
        {
            "id": {"type": "string", "pattern": "^evt_"},
            "type": STRING,
            "version": INTEGER,
            "deliveries": array(
                obj(
                    {
                        "id": STRING,
                        "endpoint": STRING,
                        "state": DELIVERY_STATE,
                        "version": dict(
                            INTEGER, description="the contract version this endpoint receives"
                        ),
                    }
                )
            ),
            "warnings": array(WARNING),
        }
    ),
)
EVENT_PROPS: dict[str, Schema] = {
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
EVENT = schema("Event", obj(EVENT_PROPS))
EVENT_DETAIL = schema("EventWithDeliveries", obj({**EVENT_PROPS, "deliveries": array(DELIVERY)}))

add(
    "/v1/partners/{uid}/events",
    "post",
    op(
        "Publish an event to a partner",
        tag="events",
        scope="events:write",
        params=[
            UID,
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "description": "≤ 255 characters, scoped to the API key, remembered ≥ 24 h",
                "schema": {"type": "string", "minLength": 1, "maxLength": 255},
            },
        ],
        body=PUBLISH,
        ok={202: PUBLISHED},
        headers={
            202: {
                "Idempotent-Replayed": {
                    "description": "`true` when this is the stored answer to an earlier request",
                    "schema": {"type": "string"},
                }
            }
        },
        description="The event and one delivery per subscribed endpoint are committed in one "
        "transaction before the 202. A disabled endpoint gets a delivery that is "
        "parked at once (state `dead`, dead letter `endpoint_disabled`). A version "
        "a pinned endpoint needs that cannot be made is 422 `version_unavailable`; "
        "one whose downgrade would make more than KURIR_MAX_PAYLOAD_BYTES of JSON "
        "(or spend more than its work budget) is 422 `version_too_large` "
        "(`details.version`); nothing is stored either way.",
        errors=(400, 404, 409, 413, 415, 422),
    ),
)
add(
    "/v1/partners/{uid}/events",
    "get",
    op(
        "List a partner's events, newest first",
        tag="events",
        scope="read",
        params=[
            UID,
            query("type", "only this event type"),
            query("since", "created at or after (RFC 3339)", TIMESTAMP),
            query("until", "created before (RFC 3339)", TIMESTAMP),
            query(
                "delivery_success",
                "`false`: events with a delivery not (yet) succeeded; "
                "`true`: every delivery succeeded",
                FLAG,
            ),
            *PAGE_PARAMS,
        ],
        ok={200: schema("EventPage", page_of("Event"))},
        errors=(400, 404),
    ),
)
add(
    "/v1/events/{event_id}",
    "get",
    op(
        "Read one event with its deliveries and their attempts",
        tag="events",
        scope="read",
        params=[path_param("event_id", "event id")],
        ok={200: EVENT_DETAIL},
        errors=(404,),
    ),
)
