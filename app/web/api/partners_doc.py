"""The API description of app/web/api/partners.py: partners, their keys and portal links, and
their endpoints.

The endpoint vocabulary (states, modes, ordering, on_dead) comes from `app.services.endpoints`,
the partner-key scopes from `app.models` and `app.services.actor`, the portal link bounds from
`app.services.portal`; the downgrade chain limit is quoted from `app.event_types.downgrades` (see
tests/unit/test_layering.py).
"""

from __future__ import annotations

from app.event_types import downgrades, filters
from app.models import SCOPES
from app.services import portal
from app.services.actor import PARTNER_SCOPES
from app.vocabulary import (
    DisabledBy,
    EndpointMode,
    EndpointState,
    OnDead,
    Ordering,
    SignatureKind,
)
from app.web.api.dead_letters_doc import RESEND_JOB
from app.web.api.deliveries_doc import DELIVERY
from app.web.openapi import (
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

PARTNER = schema(
    "Partner",
    obj(
        {
            "id": STRING,
            "uid": STRING,
            "name": STRING,
            "operational_events": {
                "type": "boolean",
                "description": "opted in to Kurir's operational events about its own "
                "endpoints, sent to those of its endpoints subscribed to them by name",
            },
            "created_at": TIMESTAMP,
            "updated_at": TIMESTAMP,
        }
    ),
)
PARTNER_CREATE = schema(
    "PartnerCreate",
    obj(
        {
            "uid": {
                "type": "string",
                "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,199}$",
                "description": "chosen by the publisher, unique",
            },
            "name": {"type": "string", "minLength": 1, "maxLength": 400},
        },
        required=["uid"],
    ),
)
PARTNER_UPDATE = schema(
    "PartnerUpdate",
    obj(
        {
            "name": {"type": "string", "minLength": 1, "maxLength": 400},
            "operational_events": {"type": "boolean"},
        },
        required=[],
    ),
)
UID = path_param("uid", "partner uid")
# The scopes a partner-bound key may hold, in the order `app.models.SCOPES` lists them.
PARTNER_KEY_SCOPES = [scope for scope in SCOPES if scope in PARTNER_SCOPES]

add(
    "/v1/partners",
    "post",
    op(
        "Create a partner",
        tag="partners",
        scope="endpoints:write",
        body=PARTNER_CREATE,
        description="The uid `kurir-operators` is Kurir's own (its endpoints receive "
        "operational events): 422 `reserved_partner`.",
        ok={201: PARTNER},
        errors=(400, 409, 413, 415, 422),
    ),
)
add(
    "/v1/partners",
    "get",
    op(
        "List partners, newest first",
        tag="partners",
        scope="read",
        params=PAGE_PARAMS,
        ok={200: schema("PartnerPage", page_of("Partner"))},
        errors=(400,),
    ),
)
add(
    "/v1/partners/{uid}",
    "get",
    op(
        "Read a partner",
        tag="partners",
        scope="read",
        params=[UID],
        ok={200: PARTNER},
        errors=(404,),
    ),
)
add(
    "/v1/partners/{uid}",
    "patch",
    op(
        "Change a partner (only the fields given)",
        tag="partners",
        scope="endpoints:write",
        params=[UID],
        body=PARTNER_UPDATE,
        description="`operational_events: true` opts the partner in to Kurir's operational "
        "events (`endpoint.disabled`, `delivery.exhausted`, …) about its own endpoints, "
        "delivered to those of its endpoints that subscribe to them by name. A partner's own "
        "key may change only this flag (403 otherwise).",
        ok={200: PARTNER},
        errors=(400, 403, 404, 413, 415, 422),
    ),
)

add(
    "/v1/partners/{uid}/keys",
    "post",
    op(
        "Create an API key bound to this partner (the key is in this answer only)",
        tag="partners",
        scope="admin",
        params=[UID],
        description="A partner key reaches only this partner's endpoints, events, deliveries and "
        "dead letters; anything else answers 404. It can hold `read`, "
        "`endpoints:write` and `dlq:write` (default: all three), never publish or "
        "manage event types, sources, operators or keys.",
        body=schema(
            "PartnerKeyCreate",
            obj(
                {
                    "name": {"type": "string", "minLength": 1, "maxLength": 200},
                    "scopes": array({"type": "string", "enum": PARTNER_KEY_SCOPES}),
                },
                required=["name"],
            ),
        ),
        ok={
            201: schema(
                "ApiKeyWithKey",
                obj(
                    {
                        "id": STRING,
                        "name": STRING,
                        "prefix": STRING,
                        "scopes": array(STRING),
                        "partner": STRING,
                        "created_at": TIMESTAMP,
                        "last_used_at": OPT_TIMESTAMP,
                        "revoked_at": OPT_TIMESTAMP,
                        "key": {
                            "type": "string",
                            "description": "the key itself: shown once, stored hashed",
                        },
                    }
                ),
            )
        },
        errors=(400, 404, 413, 415, 422),
    ),
)
add(
    "/v1/partners/{uid}/portal-links",
    "post",
    op(
        "Make a one-time magic link to the partner portal",
        tag="partners",
        scope="endpoints:write",
        params=[UID],
        body_required=False,
        description="The link opens `/portal` for this partner only, once, until `expires_at` "
        "(default KURIR_PORTAL_LINK_TTL_SECONDS, 15 min; at most 24 h, and at most "
        "1 h when a partner key mints it). Its token is stored hashed. Revoking the "
        "key that minted it revokes it while unused and ends the session it opened. "
        "Embed it in an `<iframe>` from an origin listed in "
        "KURIR_PORTAL_FRAME_ANCESTORS, or send it to the partner. Without "
        "KURIR_PUBLIC_URL, a request that did not come in on a loopback address is "
        "refused (`503 public_url_required`): the link's host would come from the "
        "request.",
        body=schema(
            "PortalLinkCreate",
            obj(
                {
                    "expires_in_s": {
                        "type": "integer",
                        "minimum": portal.LINK_TTL_MIN_S,
                        "maximum": portal.LINK_TTL_MAX_S,
                    },
                    "read_only": {
                        "type": "boolean",
                        "description": "the session sees everything and changes nothing: no "
                        "form is shown, every change is refused (403). Default false",
                    },
                    "features": nullable(
                        array(
                            {"type": "string", "enum": list(portal.FEATURES)},
                            description="the portal sections the session sees (default "
                            "all); the others are absent from its pages and answer 404. "
                            "Unknown names are 422 `invalid_field`",
                        )
                    ),
                },
                required=[],
            ),
        ),
        ok={
            201: schema(
                "PortalLink",
                obj(
                    {
                        "id": STRING,
                        "partner": STRING,
                        "url": {"type": "string", "format": "uri"},
                        "expires_at": TIMESTAMP,
                        "created_at": TIMESTAMP,
                        "read_only": {"type": "boolean"},
                        "features": array(
                            {"type": "string", "enum": list(portal.FEATURES)},
                            description="the sections the session sees",
                        ),
                    }
                ),
            )
        },
        errors=(400, 404, 415, 422, 503),
    ),
)
add(
    "/v1/partners/{uid}/portal-sessions",
    "delete",
    op(
        "End every portal session and revoke every unused portal link of this partner",
        tag="partners",
        scope="admin",
        params=[UID],
        description="Takes effect at once in every API process: the portal reads its session "
        "on each request. `ended` counts the sessions that were still live, "
        "`revoked` the links that could still have been used. Revoking an API key "
        "(`DELETE /v1/keys/{id}`) does the same for what that key minted.",
        ok={
            200: schema(
                "PortalRevocation",
                obj(
                    {
                        "ended": {
                            "type": "integer",
                            "minimum": 0,
                            "description": "live portal sessions ended",
                        },
                        "revoked": {
                            "type": "integer",
                            "minimum": 0,
                            "description": "unused, unexpired links revoked",
                        },
                    }
                ),
            )
        },
        errors=(403, 404),
    ),
)


# ---------------------------------------------------------------------------- endpoints

_HEADERS: Schema = {
    "type": "object",
    "additionalProperties": {"type": "string"},
    "maxProperties": 20,
    "description": "custom headers; no CR/LF, no webhook-*, content-type, "
    "content-length, host, transfer-encoding, user-agent",
}
_HEADERS_SHOWN: Schema = {
    "type": "object",
    "additionalProperties": nullable(STRING),
    "description": "every custom header by name; values are write-only "
    "(null) unless listed in public_headers",
}
_HEADERS_CHANGE: Schema = {
    "type": "object",
    "additionalProperties": nullable(STRING),
    "maxProperties": 20,
    "description": "replaces the custom headers; a null value keeps that header's stored value",
}
_PUBLIC_HEADERS: Schema = array(
    STRING, description="custom headers whose values reads may show (the others are write-only)"
)
_VERSIONS: Schema = {
    "type": "object",
    "additionalProperties": {"type": "integer", "minimum": 1},
    "description": "contract version pinned per event type; other types "
    "arrive in the version published. 422 "
    "`version_unavailable` (`details.type`) when no chain of "
    f"at most {downgrades.MAX_HOPS} downgrades makes it from "
    "the type's newest version",
}
_EVENT_TYPES: Schema = nullable(array(STRING, minItems=1))
_EVENT_TYPES["description"] = "names of registered event types; null subscribes to all"
_TIMEOUT: Schema = {"type": "integer", "minimum": 1, "maximum": 30}
_RATE: Schema = nullable({"type": "integer", "minimum": 1})
_ORDERING: Schema = {
    "type": "string",
    "enum": list(Ordering),
    "description": "key: one ordering key's events arrive one at a time, in "
    "publish-commit order, with webhook-sequence and "
    "webhook-previous-id headers (default none)",
}
_ON_DEAD: Schema = {
    "type": "string",
    "enum": list(OnDead),
    "description": "for ordered endpoints, what a dead delivery does to the "
    "rest of its key: skip goes on with the next, block holds "
    "the key until its dead letter is resent or discarded "
    "(default skip)",
}
_SEND_TRACEPARENT: Schema = {
    "type": "boolean",
    "description": "while tracing is on (OpenTelemetry), every attempt to this endpoint "
    "carries a W3C `traceparent` header: the attempt's span, in the publisher's trace. "
    "Default false: internal trace ids are not sent to partners. Only operators (not a "
    "partner's own keys or portal: 403 `operator_only_field`) may turn it on",
}
_AUTO_RECOVER: Schema = {
    "type": "boolean",
    "description": "default true: when Kurir disabled the endpoint after failures, the first "
    "2xx answer to a `kurir.endpoint.probe` re-enables it and replays what it parked, in "
    "publish order (unless KURIR_AUTO_RECOVER is off). False: probes are still sent and "
    "recorded, the endpoint stays disabled",
}
SECRET: Schema = {
    "type": "string",
    "pattern": "^whsec_",
    "description": "whsec_ + base64 of 24-64 random bytes",
}
_SIGNATURE: Schema = {
    "type": "string",
    "enum": list(SignatureKind),
    "description": "how webhooks are signed (Standard Webhooks): hmac, `v1,<base64>` with the "
    "shared whsec_ secret; ed25519, `v1a,<base64>` with a key pair Kurir makes, whose private "
    "key (whsk_, kept encrypted) is never shown and whose public key (whpk_) the partner "
    "verifies with. Default hmac; changed by a rotation (POST …/secret/rotate "
    '{"signature": …}), never by PATCH',
}
PUBLIC_KEY: Schema = {
    "type": "string",
    "pattern": "^whpk_",
    "description": "whpk_ + base64 of the 32-byte Ed25519 public key",
}
_PUBLIC_KEYS: Schema = array(
    obj({"public_key": PUBLIC_KEY, "created_at": TIMESTAMP, "expires_at": OPT_TIMESTAMP}),
    description="an ed25519 endpoint's keys that sign now, newest first: after a rotation "
    "the previous one too, until `expires_at`; trust each (empty for hmac)",
)
_VERIFY: Schema = {
    "type": "boolean",
    "description": "the endpoint must prove it controls its URL before it is sent anything: "
    "it starts in pending_verification and gets a signed `kurir.endpoint.verify` event whose "
    '`data.challenge` it answers, echoing `{"challenge": …}` in a 2xx body or posting it to '
    "POST …/verify. Unanswered for 72 h, it is disabled (reason unverified). A new host in "
    "its url asks again. Default `KURIR_VERIFY_ENDPOINTS` (false); fixed at creation "
    "(422 `verify_immutable`); refused for a pull endpoint",
}
_MODE: Schema = {
    "type": "string",
    "enum": list(EndpointMode),
    "description": "push: Kurir POSTs every event; pull: nothing is sent, the "
    "partner reads GET /v1/partners/{uid}/feed?endpoint={id} and "
    "acknowledges. Fixed at creation.",
}
LAG = schema(
    "PullLag",
    obj(
        {
            "events": dict(
                INTEGER, description="events in the endpoint's feed not acknowledged yet"
            ),
            "oldest_unacknowledged_at": OPT_TIMESTAMP,
            "oldest_unacknowledged_age_s": nullable({"type": "number", "minimum": 0}),
            "acknowledged_at": dict(
                OPT_TIMESTAMP, description="when the last acknowledgement moved the position"
            ),
            "expired_events": dict(
                INTEGER,
                description="of `events`, those created before the "
                "retention horizon: reads without a cursor "
                "answer 410 `backlog_expired` until they are "
                "skipped",
            ),
        },
        description="what a pull endpoint's consumer is behind",
    ),
)
_FILTER: Schema = nullable(
    {
        "type": "string",
        "maxLength": filters.MAX_LENGTH,
        "description": "a JMESPath expression over the event (`data`, `type`, `version`, "
        "`resource`) that must be truthy for the endpoint to get it, e.g. "
        "``data.amount > `1000` && data.currency == 'EUR'``; null or blank: every event. "
        "Checked when set (422 `invalid_filter`, under the bounds downgrades have); "
        "evaluated once per publish with at most "
        f"{filters.MAX_WORK} units of work, past which (or on a type error) it does not "
        "match. Push endpoints only",
    }
)
_ENDPOINT_PROPS: dict[str, Schema] = {
    "id": STRING,
    "partner": {"type": "string", "description": "the partner uid"},
    "url": nullable({"type": "string", "format": "uri", "description": "null for a pull endpoint"}),
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
    "send_traceparent": _SEND_TRACEPARENT,
    "filter": _FILTER,
    "signature": _SIGNATURE,
    "public_key": nullable(
        dict(PUBLIC_KEY, description="an ed25519 endpoint's current public key; null for hmac")
    ),
    "public_keys": _PUBLIC_KEYS,
    "state": {
        "type": "string",
        "enum": list(EndpointState),
        "description": "pending_verification: it is sent nothing but its ownership challenge "
        "until it answers it; what is published meanwhile waits and flows once it is verified",
    },
    "verify": _VERIFY,
    "verified_at": dict(OPT_TIMESTAMP, description="when it last proved it controls its URL"),
    "verification": nullable(
        obj(
            {
                "started_at": TIMESTAMP,
                "expires_at": dict(
                    TIMESTAMP, description="when it is disabled (reason unverified) if unanswered"
                ),
                "challenge_sent_at": dict(
                    OPT_TIMESTAMP, description="when the current challenge was last sent"
                ),
                "challenge_attempts": INTEGER,
                "next_send_at": dict(
                    OPT_TIMESTAMP,
                    description="when it is sent again (null once the endpoint answered 2xx)",
                ),
                "last_error": OPT_STRING,
            },
            description="where the ownership challenge stands; null unless "
            "state is pending_verification",
        )
    ),
    "disabled_reason": OPT_STRING,
    "disabled_at": OPT_TIMESTAMP,
    "disabled_by": nullable(
        {
            "type": "string",
            "enum": list(DisabledBy),
            "description": "who disabled it: an operator (UI, admin key, "
            "CLI; a partner's credentials cannot enable it "
            "again), the partner, Kurir's health monitor "
            "after failures, or the verification (reason unverified: its challenge went "
            "unanswered; enabling it sends a new one)",
        }
    ),
    "consecutive_failures": {"type": "integer", "minimum": 0},
    "last_success_at": OPT_TIMESTAMP,
    "last_failure_at": OPT_TIMESTAMP,
    "auto_recover": _AUTO_RECOVER,
    "probe_next_at": dict(
        OPT_TIMESTAMP,
        description="when the next `kurir.endpoint.probe` is due; null unless Kurir disabled "
        "it after failures and is still probing it",
    ),
    "probe_count": {
        "type": "integer",
        "minimum": 0,
        "description": "probes sent since it was disabled",
    },
    "created_at": TIMESTAMP,
    "updated_at": TIMESTAMP,
}
ENDPOINT = schema("Endpoint", obj(_ENDPOINT_PROPS))
ENDPOINT_WITH_LAG = schema(
    "EndpointWithLag",
    obj(
        {**_ENDPOINT_PROPS, "lag": LAG},
        required=list(_ENDPOINT_PROPS),
        description="`lag` for a pull endpoint only",
    ),
)
ENDPOINT_WITH_SECRET = schema(
    "EndpointWithSecret",
    obj(
        {**_ENDPOINT_PROPS, "secret": SECRET},
        required=list(_ENDPOINT_PROPS),
        description="`secret` only in the answers to create and rotate of an hmac endpoint "
        "(an ed25519 one answers with `public_key`)",
    ),
)
ENDPOINT_CREATE = schema(
    "EndpointCreate",
    obj(
        {
            "url": {
                "type": "string",
                "format": "uri",
                "maxLength": 2048,
                "description": "http(s); refused when it resolves to an internal address or "
                "carries user:password@ (send credentials in a header). Required "
                "for a push endpoint, refused for a pull endpoint",
            },
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
            "send_traceparent": _SEND_TRACEPARENT,
            "auto_recover": _AUTO_RECOVER,
            "filter": _FILTER,
            "signature": _SIGNATURE,
            "verify": _VERIFY,
            "secret": dict(
                SECRET,
                description="optional; generated when absent. Refused (422 "
                "`secret_not_allowed`) with signature ed25519: Kurir makes that key pair",
            ),
        },
        required=[],
    ),
)
ENDPOINT_UPDATE = schema(
    "EndpointUpdate",
    obj(
        {
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
            "send_traceparent": _SEND_TRACEPARENT,
            "auto_recover": _AUTO_RECOVER,
            "filter": _FILTER,
            "signature": dict(
                _SIGNATURE,
                description="may repeat the current kind; another is 422 "
                "`signature_changes_by_rotation` (rotate instead)",
            ),
        },
        required=[],
    ),
)
EP = [UID, path_param("endpoint_id", "endpoint id")]
_EP_PATH = "/v1/partners/{uid}/endpoints/{endpoint_id}"

add(
    "/v1/partners/{uid}/endpoints",
    "post",
    op(
        "Create an endpoint (answer includes its secret)",
        tag="endpoints",
        scope="endpoints:write",
        params=[UID],
        body=ENDPOINT_CREATE,
        description="A partner has at most `KURIR_MAX_ENDPOINTS_PER_PARTNER` live endpoints "
        "(default 50): one more is 422 `endpoint_limit`. A partner's own keys create "
        "at most `KURIR_PARTNER_ENDPOINT_CREATES_PER_MINUTE` a minute: more is 429 "
        "`rate_limited` with `Retry-After`.",
        ok={201: ENDPOINT_WITH_SECRET},
        errors=(400, 404, 413, 415, 422, 429),
    ),
)
add(
    "/v1/partners/{uid}/endpoints",
    "get",
    op(
        "List a partner's endpoints, newest first",
        tag="endpoints",
        scope="read",
        params=[UID, query("state", "enabled, disabled or pending_verification"), *PAGE_PARAMS],
        ok={200: schema("EndpointPage", page_of("Endpoint"))},
        errors=(400, 404),
    ),
)
add(
    _EP_PATH,
    "get",
    op(
        "Read an endpoint (a pull endpoint with its lag)",
        tag="endpoints",
        scope="read",
        params=EP,
        ok={200: ENDPOINT_WITH_LAG},
        errors=(404,),
    ),
)
add(
    _EP_PATH,
    "patch",
    op(
        "Change an endpoint (only the fields given)",
        tag="endpoints",
        scope="endpoints:write",
        params=EP,
        body=ENDPOINT_UPDATE,
        ok={200: ENDPOINT},
        errors=(400, 404, 413, 415, 422),
    ),
)
add(
    _EP_PATH,
    "delete",
    op(
        "Remove an endpoint (its history stays)",
        tag="endpoints",
        scope="endpoints:write",
        params=EP,
        ok={204: None},
        errors=(404,),
    ),
)
add(
    f"{_EP_PATH}/enable",
    "post",
    op(
        "Enable an endpoint",
        tag="endpoints",
        scope="endpoints:write",
        params=EP,
        description="A partner's key cannot enable an endpoint an operator disabled "
        "(`disabled_by: operator`): 409 `disabled_by_operator`. One the health "
        "monitor or the partner disabled, it can. An endpoint with `verify` that never "
        "verified (disabled as unverified) is not enabled but made to verify again: "
        "state pending_verification, with a new challenge. 409 `pending_verification` "
        "for one waiting for verification: it is enabled by answering its challenge.",
        ok={200: ENDPOINT},
        errors=(404, 409),
    ),
)
add(
    f"{_EP_PATH}/disable",
    "post",
    op(
        "Disable an endpoint: new events are parked as dead letters",
        tag="endpoints",
        scope="endpoints:write",
        params=EP,
        body_required=False,
        body=schema(
            "EndpointDisable", obj({"reason": {"type": "string", "maxLength": 200}}, required=[])
        ),
        ok={200: ENDPOINT},
        errors=(400, 404, 415, 422),
    ),
)
add(
    f"{_EP_PATH}/secret/rotate",
    "post",
    op(
        "Rotate the secret; the old one keeps signing for the rotation overlap",
        tag="endpoints",
        scope="endpoints:write",
        params=EP,
        description="Makes a new key of the endpoint's kind, or of the kind `signature` names "
        "(switching hmac and ed25519): the previous key keeps signing beside it until the "
        "overlap (`KURIR_SECRET_ROTATION_OVERLAP_SECONDS`) ends, so webhooks carry one "
        "signature per live key (`v1a,… v1,…`). An hmac rotation answers with the new "
        "`secret`; an ed25519 one with the new `public_key`.",
        body_required=False,
        body=schema(
            "SecretRotate",
            obj(
                {
                    "secret": dict(
                        SECRET, description="hmac only: the new secret (generated when absent)"
                    ),
                    "signature": dict(
                        _SIGNATURE, description="the new key's kind (default: the endpoint's)"
                    ),
                },
                required=[],
            ),
        ),
        ok={200: ENDPOINT_WITH_SECRET},
        errors=(400, 404, 415, 422),
    ),
)
add(
    f"{_EP_PATH}/test",
    "post",
    op(
        "Send a `kurir.test` event to this endpoint only",
        tag="endpoints",
        scope="endpoints:write",
        params=EP,
        description="Through the normal delivery engine (signed, retried, recorded); follow it "
        "with GET /v1/deliveries/{id}. 409 `endpoint_disabled` for a disabled "
        "endpoint (enable it first), 409 `pending_verification` for one waiting for "
        "verification, 409 `pull_endpoint` for a pull endpoint. A "
        "partner's own keys send at most `KURIR_PARTNER_TEST_SENDS_PER_MINUTE` a "
        "minute: more is 429 `rate_limited` with `Retry-After`; while the rate "
        "limiter (Redis) is unreachable they are refused, 503 `unavailable`.",
        ok={202: DELIVERY},
        errors=(404, 409, 429, 503),
    ),
)
_SAMPLE_EVENT: Schema = obj(
    {
        "type": STRING,
        "version": {"type": "integer", "minimum": 1},
        "data": {"type": "object"},
        "resource": nullable({"type": "object"}),
    },
    required=["type", "data"],
    description="an event as a publish would carry it (version default 1)",
)
add(
    f"{_EP_PATH}/filter-test",
    "post",
    op(
        "Try a filter on sample events",
        tag="endpoints",
        scope="read",
        params=EP,
        body_required=False,
        description="Judges `filter` (default: the endpoint's own) as a publish would, on "
        "`event` (an event, or the id of one of the partner's events) or, without one, on "
        "the example of each event type the endpoint subscribes to (its newest version) "
        "and the partner's latest events of those types. Nothing is changed. 422 "
        "`invalid_filter` for an expression that would be refused, or when there is no "
        "filter to try.",
        body=schema(
            "FilterTest",
            obj(
                {
                    "filter": _FILTER,
                    "event": {"oneOf": [_SAMPLE_EVENT, {"type": "string"}]},
                },
                required=[],
            ),
        ),
        ok={
            200: schema(
                "FilterTestResult",
                obj(
                    {
                        "filter": STRING,
                        "matched": dict(INTEGER, description="how many samples matched"),
                        "samples": array(
                            obj(
                                {
                                    "source": {
                                        "type": "string",
                                        "enum": ["given", "event", "example", "recent"],
                                    },
                                    "type": STRING,
                                    "version": INTEGER,
                                    "event": OPT_STRING,
                                    "matched": {"type": "boolean"},
                                    "error": dict(
                                        OPT_STRING,
                                        description="why it could not run on this sample "
                                        "(it then does not match)",
                                    ),
                                }
                            )
                        ),
                    }
                ),
            )
        },
        errors=(400, 404, 415, 422),
    ),
)
add(
    f"{_EP_PATH}/probe",
    "post",
    op(
        "Probe this endpoint now",
        tag="endpoints",
        scope="endpoints:write",
        params=EP,
        description="Sends a `kurir.endpoint.probe` (signed like any delivery; never a delivery "
        "or a dead letter) in the background; the result is in the endpoint's probe history, "
        "and a 2xx re-enables an endpoint with `auto_recover`. Only for an endpoint Kurir "
        "disabled after failures and still probes: otherwise 409 `endpoint_not_probed`.",
        ok={202: ENDPOINT},
        errors=(404, 409),
    ),
)
add(
    f"{_EP_PATH}/recover",
    "post",
    op(
        "Resend what of this endpoint did not succeed in a window",
        tag="endpoints",
        scope="endpoints:write",
        params=EP,
        body=obj(
            {
                "since": dict(TIMESTAMP, description="published at or after (RFC 3339)"),
                "until": dict(OPT_TIMESTAMP, description="published before; default: now"),
            },
            required=["since"],
        ),
        description="Every delivery of this endpoint whose event was published in the window "
        "and did not succeed — open dead letters and deliveries still retrying — is resent "
        "once, in publish order, one after the other (so at the endpoint's rate), as one "
        "audited operation; follow it at GET /v1/operations/{id}. Running it again over the "
        "same window resends only what has failed again since. Also needs `dlq:write`. "
        "409 `endpoint_disabled` (enable it first), 409 `pull_endpoint`.",
        ok={
            202: schema(
                "RecoverStarted",
                obj({"operation": RESEND_JOB, "status_url": STRING}),
            )
        },
        errors=(400, 404, 409, 415, 422),
    ),
)
add(
    f"{_EP_PATH}/verify",
    "post",
    op(
        "Answer the endpoint's ownership challenge",
        tag="endpoints",
        scope="endpoints:write",
        params=EP,
        description="For receivers that cannot echo the challenge: post the `data.challenge` "
        "of the latest `kurir.endpoint.verify` event, with the partner's own key, its "
        "portal, or an operator's key. The endpoint is enabled and what was published "
        "while it waited is sent, in publish order. 422 `challenge_mismatch` for any other "
        "value (nothing changes); 409 `not_pending_verification` when it waits for nothing.",
        body=schema(
            "VerifyChallenge",
            obj({"challenge": {"type": "string", "minLength": 1, "maxLength": 200}}),
        ),
        ok={200: ENDPOINT},
        errors=(400, 404, 409, 413, 415, 422),
    ),
)
add(
    f"{_EP_PATH}/verify/resend",
    "post",
    op(
        "Send a new ownership challenge",
        tag="endpoints",
        scope="endpoints:write",
        params=EP,
        description="A fresh challenge is sent now; the previous one no longer counts. The "
        "72 h window does not restart. 409 `not_pending_verification` when the endpoint "
        "waits for nothing. A partner's own keys count it against "
        "`KURIR_PARTNER_TEST_SENDS_PER_MINUTE` (429 `rate_limited`).",
        body_required=False,
        body=schema("VerifyResend", obj({}, required=[])),
        ok={202: ENDPOINT},
        errors=(400, 404, 409, 415, 429, 503),
    ),
)
add(
    f"{_EP_PATH}/blocked-keys",
    "get",
    op(
        "List the ordering keys this endpoint holds behind a dead delivery",
        tag="endpoints",
        scope="read",
        params=[*EP, *PAGE_PARAMS],
        description="Only for `ordering: key` with `on_dead: block`. Each key's head is its "
        "first dead delivery after which nothing of the key went out; `waiting` counts "
        "the deliveries held behind it. Resending the head's dead letter (POST "
        "/v1/dead-letters/{id}/resend) or discarding it (…/discard) releases the key.",
        ok={
            200: schema(
                "BlockedKeyPage",
                obj(
                    {
                        "data": array(
                            obj(
                                {
                                    "ordering_key": STRING,
                                    "sequence": {"type": "integer", "minimum": 1},
                                    "delivery": STRING,
                                    "event": STRING,
                                    "dead_letter": STRING,
                                    "reason": STRING,
                                    "waiting": {"type": "integer", "minimum": 0},
                                }
                            )
                        ),
                        "next_cursor": OPT_STRING,
                    }
                ),
            )
        },
        errors=(400, 404),
    ),
)
add(
    f"{_EP_PATH}/secret",
    "get",
    op(
        "Read the current secret",
        tag="endpoints",
        scope="endpoints:write",
        params=EP,
        description="An ed25519 endpoint has no secret to share: 409 `no_shared_secret` "
        "(its private key never leaves Kurir; `public_key` is on the endpoint).",
        ok={
            200: schema(
                "Secret",
                obj(
                    {
                        "id": STRING,
                        "endpoint": STRING,
                        "secret": SECRET,
                        "created_at": TIMESTAMP,
                        "expires_at": OPT_TIMESTAMP,
                    }
                ),
            )
        },
        errors=(404, 409),
    ),
)
