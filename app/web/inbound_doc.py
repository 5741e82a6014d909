"""The API description of app/web/inbound.py: the public door for partner callbacks (no API
key: the source's signature is the credential)."""

from __future__ import annotations

from app.web.openapi import ANY_OBJECT, add, op, path_param

add(
    "/inbound/{source}",
    "post",
    op(
        "Receive a partner callback (signature verified over the raw body)",
        tag="inbound",
        scope=None,
        params=[path_param("source", "source name")],
        body={"description": "whatever the partner sends; verified before it is parsed"},
        body_required=False,
        ok={202: ANY_OBJECT, 200: ANY_OBJECT},
        errors=(400, 401, 404, 413, 503),
    ),
)
