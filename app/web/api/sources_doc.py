"""The API description of app/web/api/sources.py: inbound sources, their secrets, the handlers
they may select, and the state of their resources. Signature schemes are the verifiers'
own list (`app.services.sources.SCHEMES`)."""

from __future__ import annotations

from app.services.sources import SCHEMES
from app.web.openapi import (
    ANY_OBJECT,
    BOOLEAN,
    INTEGER,
    OPT_INTEGER,
    OPT_STRING,
    OPT_TIMESTAMP,
    PAGE_PARAMS,
    STRING,
    TIMESTAMP,
    add,
    array,
    obj,
    op,
    page_of,
    path_param,
    query,
    schema,
)

SOURCE = schema(
    "Source",
    obj(
        {
            "id": STRING,
            "name": STRING,
            "scheme": STRING,
            "tolerance_s": INTEGER,
            "mapping": ANY_OBJECT,
            "receive_path": STRING,
            "secrets": array(ANY_OBJECT),
            "created_at": TIMESTAMP,
        },
        strict=False,
    ),
)
SOURCE_NAME = path_param("name", "source name")
add(
    "/v1/sources",
    "post",
    op(
        "Configure an inbound source",
        tag="inbound",
        scope="sources:write",
        body={
            "type": "object",
            "required": ["name", "scheme"],
            "properties": {
                "name": STRING,
                "scheme": {"type": "string", "enum": list(SCHEMES)},
                "secret": STRING,
                "secrets": array(STRING),
                "tolerance_s": INTEGER,
                "mapping": ANY_OBJECT,
                "allow_gaps": BOOLEAN,
                "handlers": array({"oneOf": [STRING, ANY_OBJECT]}),
                "reconcile_url": OPT_STRING,
            },
        },
        ok={201: SOURCE},
        errors=(400, 409, 413, 415, 422),
    ),
)
add(
    "/v1/inbound-handlers",
    "get",
    op(
        "The handlers a source may select by name (KURIR_INBOUND_HANDLERS)",
        tag="inbound",
        scope="read",
        ok={200: obj({"data": array(obj({"name": STRING, "path": STRING}))})},
    ),
)
add(
    "/v1/sources",
    "get",
    op(
        "List inbound sources",
        tag="inbound",
        scope="read",
        params=PAGE_PARAMS,
        ok={200: schema("SourcePage", page_of("Source"))},
        errors=(400,),
    ),
)
add(
    "/v1/sources/{name}",
    "get",
    op(
        "Read an inbound source",
        tag="inbound",
        scope="read",
        params=[SOURCE_NAME],
        ok={200: SOURCE},
        errors=(404,),
    ),
)
add(
    "/v1/sources/{name}/secrets",
    "post",
    op(
        "Add (or rotate to) a verification secret",
        tag="inbound",
        scope="sources:write",
        params=[SOURCE_NAME],
        body={"type": "object", "properties": {"secret": STRING, "rotate": BOOLEAN}},
        ok={201: SOURCE},
        errors=(400, 404, 415, 422),
    ),
)
add(
    "/v1/sources/{name}/resources/{resource_id}",
    "get",
    op(
        "Current state of one resource of a source",
        tag="inbound",
        scope="read",
        params=[
            SOURCE_NAME,
            path_param("resource_id", "resource id (may contain /)"),
            query("resource_type", "when several resource types share the id"),
        ],
        ok={
            200: schema(
                "ResourceState",
                obj(
                    {
                        "status": OPT_STRING,
                        "version": OPT_INTEGER,
                        "occurred_at": OPT_TIMESTAMP,
                        "updated_at": TIMESTAMP,
                    },
                    strict=False,
                ),
            )
        },
        errors=(404, 409),
    ),
)
