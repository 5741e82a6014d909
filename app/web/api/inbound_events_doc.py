"""The API description of app/web/api/inbound_events.py: received callbacks, listed, read and
replayed. Their statuses are `app.models.INBOUND_STATUSES`."""

from __future__ import annotations

from app.models import INBOUND_STATUSES
from app.web.openapi import (
    OPT_INTEGER,
    OPT_STRING,
    OPT_TIMESTAMP,
    PAGE_PARAMS,
    STRING,
    TIMESTAMP,
    Schema,
    add,
    obj,
    op,
    page_of,
    path_param,
    query,
    schema,
)

INBOUND_STATUS: Schema = {"type": "string", "enum": list(INBOUND_STATUSES)}
INBOUND_EVENT = schema(
    "InboundEvent",
    obj(
        {
            "id": STRING,
            "source": STRING,
            "event_id": STRING,
            "event_type": OPT_STRING,
            "resource_id": OPT_STRING,
            "resource_version": OPT_INTEGER,
            "occurred_at": OPT_TIMESTAMP,
            "status": INBOUND_STATUS,
            "reason": OPT_STRING,
            "received_at": TIMESTAMP,
            "created_at": TIMESTAMP,
        },
        strict=False,
    ),
)
INBOUND_ID = [path_param("event_id", "inbound event id")]
add(
    "/v1/inbound-events",
    "get",
    op(
        "List received callbacks, newest first",
        tag="inbound",
        scope="read",
        params=[
            query("source", "source name"),
            query("status", "processing status", INBOUND_STATUS),
            query("resource_id", "resource id"),
            query("since", "received at or after (RFC 3339)", TIMESTAMP),
            query("until", "received before (RFC 3339)", TIMESTAMP),
            *PAGE_PARAMS,
        ],
        ok={200: schema("InboundEventPage", page_of("InboundEvent"))},
        errors=(400, 404),
    ),
)
add(
    "/v1/inbound-events/{event_id}",
    "get",
    op(
        "Read a received callback",
        tag="inbound",
        scope="read",
        params=INBOUND_ID,
        ok={200: INBOUND_EVENT},
        errors=(404,),
    ),
)
add(
    "/v1/inbound-events/{event_id}/replay",
    "post",
    op(
        "Process a received callback again",
        tag="inbound",
        scope="sources:write",
        params=INBOUND_ID,
        ok={202: INBOUND_EVENT},
        errors=(404, 409, 422),
    ),
)
