"""The API description of app/web/api/dead_letters.py: search, read, resend (one or many, with
the bulk job's progress) and discard. Dead-letter states are `app.vocabulary.DeadLetterState`."""

from __future__ import annotations

from app.vocabulary import DeadLetterState
from app.web.api.deliveries_doc import ATTEMPT
from app.web.openapi import (
    ANY_OBJECT,
    BOOLEAN,
    INTEGER,
    OPT_INTEGER,
    OPT_STRING,
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

DEAD_LETTER_STATE: Schema = {"type": "string", "enum": list(DeadLetterState)}
DEAD_LETTER = schema(
    "DeadLetter",
    obj(
        {
            "id": STRING,
            "delivery": STRING,
            "event": STRING,
            "endpoint": STRING,
            "partner": STRING,
            "type": STRING,
            "version": dict(
                INTEGER,
                description="the contract version the delivery carries (its "
                "endpoint's pin, or the version published): the "
                "envelope's `version` it was sent with",
            ),
            "reason": STRING,
            "last_status_code": OPT_INTEGER,
            "last_error": OPT_STRING,
            "state": DEAD_LETTER_STATE,
            "created_at": TIMESTAMP,
            "audit": array(ANY_OBJECT),
            "attempts": array(ATTEMPT),
        },
        required=[
            "id",
            "delivery",
            "event",
            "endpoint",
            "partner",
            "type",
            "version",
            "reason",
            "last_status_code",
            "last_error",
            "state",
            "created_at",
            "audit",
        ],
        strict=False,
    ),
)
LETTER_ID = [path_param("letter_id", "dead letter id")]
DL_FILTERS = [
    query("partner", "partner uid"),
    query("endpoint", "endpoint id"),
    query("type", "event type"),
    query("reason", "e.g. retries_exhausted, endpoint_disabled"),
    query("status_code", "last HTTP status", INTEGER),
    query("error", "last error class"),
    query("since", "created at or after", TIMESTAMP),
    query("until", "created before", TIMESTAMP),
    query("q", "text in the payload"),
    query("state", "open, resent or discarded", DEAD_LETTER_STATE),
]
RESEND_JOB = schema(
    "ResendJob",
    obj(
        {
            "id": STRING,
            "kind": STRING,
            "state": STRING,
            "total": INTEGER,
            "done": INTEGER,
            "failed": INTEGER,
            "ordered": {
                "type": "boolean",
                "description": "resent one after the other, in publish order (a recovery's "
                "replay, a recover window)",
            },
            "purpose": dict(
                OPT_STRING,
                description="why it runs: null for an operator's resend, `recovery` for "
                "the replay after an endpoint recovered, `recover_window` for POST "
                "…/endpoints/{id}/recover",
            ),
        },
        strict=False,
    ),
)
BULK = schema(
    "BulkResend",
    {
        "type": "object",
        "properties": {
            "count": INTEGER,
            "job_id": OPT_STRING,
            "status_url": STRING,
            "resent": array(STRING),
            "skipped": array(ANY_OBJECT),
        },
        "required": ["count", "job_id"],
    },
)
add(
    "/v1/dead-letters",
    "get",
    op(
        "Search dead letters, newest first",
        tag="dead-letters",
        scope="read",
        params=[*DL_FILTERS, *PAGE_PARAMS],
        ok={200: schema("DeadLetterPage", page_of("DeadLetter"))},
        errors=(400, 422),
    ),
)
add(
    "/v1/dead-letters/{letter_id}",
    "get",
    op(
        "Read a dead letter with its attempts and audit",
        tag="dead-letters",
        scope="read",
        params=LETTER_ID,
        ok={200: DEAD_LETTER},
        errors=(404,),
    ),
)
add(
    "/v1/dead-letters/{letter_id}/resend",
    "post",
    op(
        "Resend one dead letter (same event id, fresh attempt budget)",
        tag="dead-letters",
        scope="dlq:write",
        params=LETTER_ID,
        body_required=False,
        body={"type": "object", "properties": {"force": BOOLEAN}},
        ok={200: DEAD_LETTER},
        errors=(400, 404, 409, 415, 422),
    ),
)
RESEND_FILTER = obj(
    {
        "partner": STRING,
        "endpoint": STRING,
        "type": STRING,
        "reason": STRING,
        "status_code": {
            "type": ["integer", "string"],
            "description": "last HTTP status, or `none` for no answer",
        },
        "error": STRING,
        "q": STRING,
        "since": TIMESTAMP,
        "until": TIMESTAMP,
        "state": {"type": "string", "enum": [DeadLetterState.OPEN]},
        "all": {
            "type": "boolean",
            "description": "required (`true`) when no criterion is given: "
            "resend every open dead letter",
        },
    },
    required=[],
    description="search criteria (AND); at least one, or `all: true`",
)
add(
    "/v1/dead-letters/resend",
    "post",
    op(
        "Resend many: `{ids: [...]}` or `{filter: {...}}`",
        tag="dead-letters",
        scope="dlq:write",
        description="A filter with no criteria is refused (422 `invalid_parameter`); "
        '`{"filter": {"all": true}}` resends every open dead letter.',
        body={
            "type": "object",
            "properties": {"ids": array(STRING), "filter": RESEND_FILTER, "force": BOOLEAN},
        },
        ok={200: BULK, 202: BULK},
        errors=(400, 415, 422),
    ),
)
add(
    "/v1/dead-letters/resend-jobs/{job_id}",
    "get",
    op(
        "Progress of a bulk resend",
        tag="dead-letters",
        scope="read",
        params=[path_param("job_id", "resend job id")],
        ok={200: RESEND_JOB},
        errors=(404,),
    ),
)
add(
    "/v1/operations/{job_id}",
    "get",
    op(
        "Progress of a background operation",
        tag="dead-letters",
        scope="read",
        params=[path_param("job_id", "operation id (bop_…)")],
        description="A bulk resend, the replay after an endpoint recovered, or a recover "
        "window (POST …/endpoints/{id}/recover): the same job as "
        "GET /v1/dead-letters/resend-jobs/{id}. A partner's key reads the ones it started.",
        ok={200: RESEND_JOB},
        errors=(404,),
    ),
)
add(
    "/v1/dead-letters/{letter_id}/discard",
    "post",
    op(
        "Discard a dead letter (audited)",
        tag="dead-letters",
        scope="dlq:write",
        params=LETTER_ID,
        body_required=False,
        body={"type": "object", "properties": {"note": STRING}},
        ok={200: DEAD_LETTER},
        errors=(400, 404, 409, 415, 422),
    ),
)
