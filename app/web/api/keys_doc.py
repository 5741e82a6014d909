"""The API description of app/web/api/keys.py: who-am-I, API keys, and the audit trail."""

from __future__ import annotations

from app.web.openapi import (
    ANY_OBJECT,
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

add(
    "/v1/me",
    "get",
    op(
        "Who am I: the calling key and its scopes",
        tag="keys",
        scope="read",
        ok={
            200: obj(
                {
                    "id": STRING,
                    "name": STRING,
                    "scopes": array(STRING),
                    "partner": dict(
                        OPT_STRING, description="uid of the partner the key is bound to, if any"
                    ),
                }
            )
        },
    ),
)
API_KEY = schema(
    "ApiKey",
    obj(
        {
            "id": STRING,
            "name": STRING,
            "prefix": {
                "type": "string",
                "description": "the first characters of the key, to tell keys apart; never the key",
            },
            "scopes": array(STRING),
            "partner": OPT_STRING,
            "created_at": TIMESTAMP,
            "last_used_at": dict(OPT_TIMESTAMP, description="updated at most once a minute"),
            "revoked_at": OPT_TIMESTAMP,
        }
    ),
)
KEY_ID = [path_param("key_id", "API key id")]
add(
    "/v1/keys",
    "get",
    op(
        "List API keys, newest first (never the keys themselves)",
        tag="keys",
        scope="admin",
        params=PAGE_PARAMS,
        ok={200: schema("ApiKeyPage", page_of("ApiKey"))},
        errors=(400,),
    ),
)
add(
    "/v1/keys/{key_id}",
    "get",
    op(
        "Read an API key",
        tag="keys",
        scope="admin",
        params=KEY_ID,
        ok={200: API_KEY},
        errors=(404,),
    ),
)
add(
    "/v1/keys/{key_id}",
    "delete",
    op(
        "Revoke an API key: every API process refuses it within a second",
        tag="keys",
        scope="admin",
        params=KEY_ID,
        ok={200: API_KEY},
        errors=(404, 409),
    ),
)
AUDIT_RECORD = schema(
    "AuditRecord",
    obj(
        {
            "id": STRING,
            "actor": {
                "type": "string",
                "description": "key:<name>, operator:<email>, cli[:<user>], portal:<uid> or system",
            },
            "action": {"type": "string", "examples": ["endpoint.disabled"]},
            "subject_type": STRING,
            "subject_id": STRING,
            "details": ANY_OBJECT,
            "created_at": TIMESTAMP,
        }
    ),
)
add(
    "/v1/audit",
    "get",
    op(
        "The audit trail, newest first: every state change, by whom",
        tag="keys",
        scope="read",
        params=[
            query("subject", "only changes to this id (an endpoint, a key, ...)"),
            query("action", "only this action, e.g. endpoint.secret_rotated"),
            *PAGE_PARAMS,
        ],
        ok={200: schema("AuditRecordPage", page_of("AuditRecord"))},
        errors=(400,),
    ),
)
