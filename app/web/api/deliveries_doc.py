"""The API description of app/web/api/deliveries.py: the delivery log, one delivery with its
attempts, and retry. The `Delivery` and `Attempt` schemas live here; events and dead letters
show them too. Delivery states are `app.vocabulary.DeliveryState`."""

from __future__ import annotations

from app.vocabulary import DeliveryState
from app.web.openapi import (
    BOOLEAN,
    FLAG,
    INTEGER,
    OPT_INTEGER,
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

DELIVERY_STATE: Schema = {"type": "string", "enum": list(DeliveryState)}
ATTEMPT = schema(
    "Attempt",
    obj(
        {
            "n": {"type": "integer", "minimum": 1},
            "started_at": TIMESTAMP,
            "duration_ms": {"type": "integer", "minimum": 0},
            "response_status": OPT_INTEGER,
            "response_body": nullable(
                {"type": "string", "description": "first 4 KiB, decoded as UTF-8 (replaced)"}
            ),
            "response_headers": nullable(
                {
                    "type": "object",
                    "additionalProperties": STRING,
                    "description": "the partner's answer headers where kept "
                    "(credentials such as Set-Cookie shown as "
                    "[redacted])",
                }
            ),
            "error": OPT_STRING,
        }
    ),
)
_DELIVERY_PROPS: dict[str, Schema] = {
    "id": STRING,
    "event": STRING,
    "endpoint": STRING,
    "version": dict(
        INTEGER,
        description="the contract version this delivery carries (its "
        "endpoint's pin, or the version published)",
    ),
    "state": DELIVERY_STATE,
    "attempt_count": {"type": "integer", "minimum": 0},
    "next_attempt_at": OPT_TIMESTAMP,
    "last_status_code": OPT_INTEGER,
    "last_error": OPT_STRING,
    "ordering": nullable(
        obj(
            {
                "key": STRING,
                "sequence": {"type": "integer", "minimum": 1},
                "previous_event": OPT_STRING,
            },
            description="for an ordered endpoint: the key, this delivery's webhook-sequence and "
            "the event sent as webhook-previous-id",
        )
    ),
    "created_at": TIMESTAMP,
    "updated_at": TIMESTAMP,
    "attempts": array(ATTEMPT),
}
DELIVERY = schema(
    "Delivery", obj(_DELIVERY_PROPS, required=[k for k in _DELIVERY_PROPS if k != "attempts"])
)

DELIVERY_ID = [path_param("delivery_id", "delivery id")]
add(
    "/v1/deliveries",
    "get",
    op(
        "The delivery log, newest first",
        tag="deliveries",
        scope="read",
        params=[
            query("partner", "partner uid"),
            query("endpoint", "endpoint id"),
            query("state", "delivery state", DELIVERY_STATE),
            query("type", "event type"),
            query("status_code", "last HTTP status, or `none` for no answer"),
            query("since", "created at or after (RFC 3339)", TIMESTAMP),
            query("until", "created before (RFC 3339)", TIMESTAMP),
            query(
                "q",
                "search: an event id (`evt_…`, the webhook-id), a delivery id, a resource id, "
                "a correlation id, or words of the payload (looked for in the last 7 days "
                "unless `since` is given)",
            ),
            *PAGE_PARAMS,
        ],
        description="A partner key sees its own partner's deliveries only.",
        ok={200: schema("DeliveryPage", page_of("Delivery"))},
        errors=(400, 404),
    ),
)
add(
    "/v1/deliveries/{delivery_id}",
    "get",
    op(
        "Read a delivery with its attempts",
        tag="deliveries",
        scope="read",
        params=DELIVERY_ID,
        ok={200: DELIVERY},
        errors=(404,),
    ),
)
FORCE_PARAM = query("force", "also to a disabled endpoint (or `force` in the body)", FLAG)
add(
    "/v1/deliveries/{delivery_id}/retry",
    "post",
    op(
        "Try a delivery now",
        tag="deliveries",
        scope="dlq:write",
        params=[*DELIVERY_ID, FORCE_PARAM],
        body_required=False,
        body={"type": "object", "properties": {"force": BOOLEAN}},
        description="A pending or retrying delivery becomes due now; a succeeded one is sent "
        "again as a new run; a dead one is resent through its open dead letter "
        "(audited there): 409 `endpoint_disabled` unless `force`, 409 "
        "`dead_letter_not_open` when its letter was discarded. 409 "
        "`delivery_in_flight` while an attempt runs.",
        ok={200: DELIVERY, 202: DELIVERY},
        errors=(400, 404, 409, 415, 422),
    ),
)
