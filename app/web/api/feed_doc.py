"""The API description of app/web/api/feed.py: a partner's events in commit order, and a pull
endpoint's acknowledgements."""

from __future__ import annotations

from app.web.api.events_doc import EVENT_PROPS
from app.web.api.partners_doc import ENDPOINT_WITH_LAG, EP, UID
from app.web.openapi import (
    LIMIT_PARAM,
    Schema,
    add,
    array,
    obj,
    op,
    query,
    schema,
)

FEED_CURSOR: Schema = {
    "type": "string",
    "description": "opaque; valid for the retention period (KURIR_RETAIN_EVENTS_DAYS)",
}
add(
    "/v1/partners/{uid}/feed",
    "get",
    op(
        "Read a partner's feed: its events in commit order",
        tag="feed",
        scope="read",
        params=[
            UID,
            query(
                "after",
                "the `next_cursor` of the previous answer; without it, from the "
                "oldest event within retention (a pull endpoint: from its last "
                "acknowledgement)",
                FEED_CURSOR,
            ),
            LIMIT_PARAM,
            query(
                "endpoint",
                "as this endpoint receives it: its subscribed types, each in the "
                "version it is pinned to",
            ),
        ],
        ok={
            200: schema(
                "FeedPage",
                obj(
                    {
                        "data": array(
                            schema(
                                "Envelope",
                                obj(
                                    {
                                        k: v
                                        for k, v in EVENT_PROPS.items()
                                        if k not in ("created_at", "ordering_key")
                                    },
                                    description="exactly the body a pushed webhook carries",
                                ),
                            )
                        ),
                        "next_cursor": FEED_CURSOR,
                    }
                ),
            )
        },
        description="A consumer paging with `next_cursor` while publishers write sees every event "
        "exactly once, in commit order: positions are given only to committed events. "
        "`next_cursor` is always given; an empty `data` means nothing new yet. A cursor "
        "older than the retention period answers 410 `cursor_expired`; a malformed one "
        "400 `invalid_cursor`. A pull endpoint read without a cursor whose "
        "acknowledgement lies behind the retention horizon answers 410 "
        "`backlog_expired` with `details: {horizon, skipped, oldest_event}` instead of "
        "skipping those events silently; `POST …/skip-expired` moves past them.",
        errors=(400, 404, 410),
    ),
)
add(
    "/v1/partners/{uid}/endpoints/{endpoint_id}/ack",
    "post",
    op(
        "Acknowledge a pull endpoint's feed up to a cursor",
        tag="feed",
        scope="endpoints:write",
        params=EP,
        body=schema("FeedAck", obj({"cursor": FEED_CURSOR})),
        ok={200: ENDPOINT_WITH_LAG},
        description="The position only moves forward: an older cursor (a late retry) is accepted "
        "and changes nothing. 409 `push_endpoint` for a push endpoint; 400 "
        "`invalid_cursor`; 410 `cursor_expired`.",
        errors=(400, 404, 409, 410, 415, 422),
    ),
)
add(
    "/v1/partners/{uid}/endpoints/{endpoint_id}/skip-expired",
    "post",
    op(
        "Move a pull endpoint past the events of its backlog that lie beyond retention",
        tag="feed",
        scope="endpoints:write",
        params=EP,
        ok={200: ENDPOINT_WITH_LAG},
        description="The way out of 410 `backlog_expired`: the acknowledgement moves to the last "
        "event created before the retention horizon, and past nothing younger. "
        "Audited (`endpoint.backlog_skipped`, with the count and the oldest event); "
        "with nothing to skip it changes nothing. 409 `push_endpoint` for a push "
        "endpoint.",
        errors=(404, 409),
    ),
)
