"""Hand-written nasty input on every operation, and a flood of forged inbound signatures.

Every operation of /openapi.json gets, with an admin key: path parameters and query values
that are 1 MB long, hold NUL, a lone surrogate (as raw UTF-8 of one), unicode, a huge or
negative number, a malformed cursor; bodies nested 10,000 deep, with lone surrogates, NUL,
duplicate keys, bad UTF-8, non-finite or 5,000-digit numbers, 1 MB strings, and valid JSON
under the wrong content types; and each string and number of a valid body replaced by
those. Then `POST /inbound/{source}` gets `FUZZ_SIGNATURES` (default 10,000) random
signature headers per scheme on PostgreSQL, a tenth of that on SQLite (verification reads
the source, then refuses before any write: the second backend adds little but time). The
figures: 0 responses >= 500, every error in the `{"error": {code, message, details}}` shape,
0 stored inbound rows.
"""

from __future__ import annotations

import base64
import json
import os
import random
import string
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import func, select

from app.models import InboundEvent
from app.runtime import Runtime
from app.web.openapi import document
from tests.support.fuzz import Tally
from tests.support.inbound import (
    OTHER_SECRETS,
    SCHEMES,
    callback,
    create_source,
    sign,
)

SIGNATURES = int(os.environ.get("FUZZ_SIGNATURES", "10000"))
MEGA = "a" * 1_000_000
LONE_SURROGATE_UTF8 = "%ED%A0%80"  # what a lone U+D800 would be in UTF-8: not valid UTF-8
PATH_VALUES = {
    "1MB": MEGA,
    "nul": "%00",
    "surrogate": LONE_SURROGATE_UTF8,
    "int8": str(2**45),
    "unicode": quote("ünï-🚀-名"),
    "dots": "..%2F..",
    "space": "%20",
}
QUERY_VALUES = {
    "1MB": MEGA,
    "nul": "%00",
    "surrogate": LONE_SURROGATE_UTF8,
    "unicode": quote("ünï-🚀"),
    "huge": "9" * 5000,
    "negative": "-1",
    "float": "1e400",
    "cursor-garbage": "!!!~~~",
    "cursor-b64": "Zm9vYmFy",
    "empty": "",
}
NESTED = b"[" * 10_000 + b"]" * 10_000
RAW_BODIES = {
    "nested-10k": NESTED,
    "nested-10k-object": b'{"a":' * 10_000 + b"1" + b"}" * 10_000,
    "lone-surrogate": b'{"name": "\\ud800", "uid": "x\\udfff"}',
    "lone-surrogate-key": b'{"\\ud800": 1}',
    "nul": b'{"name": "a\\u0000b", "uid": "\\u0000"}',
    "nul-key": b'{"a\\u0000": 1}',
    "duplicate-keys": b'{"uid": "dup", "uid": "dup2", "name": "n", "name": 5}',
    "bad-utf8": b'{"name": "\xff\xfe\xed\xa0\x80"}',
    "empty": b"",
    "null": b"null",
    "array": b"[]",
    "string": b'"just a string"',
    "nan": b'{"a": NaN}',
    "infinite": b'{"a": 1e400}',
    "huge-int": b'{"a": ' + b"9" * 5000 + b"}",
    "1MB-string": b'{"name": "' + MEGA.encode() + b'"}',
    "truncated": b'{"name": "x',
}
CONTENT_TYPES = [
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data",
    "application/xml",
    None,
    "application/json; charset=latin-1",
    "application/json; charset=utf-16",
]
VALID_BODY = json.dumps({"uid": "valid", "name": "Valid"}).encode()
# A valid body per write operation; each of its leaves is then replaced with nasty values.
VALID_BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/v1/event-types"): {
        "name": "t.x",
        "version": 1,
        "schema": {"type": "object"},
        "description": "d",
    },
    ("post", "/v1/event-types/{name}/{version}/deprecate"): {"sunset_at": "2030-01-01T00:00:00Z"},
    ("post", "/v1/partners"): {"uid": "p1", "name": "P"},
    ("post", "/v1/partners/{uid}/endpoints"): {
        "url": "http://127.0.0.1:9/h",
        "description": "d",
        "headers": {"X-A": "b"},
        "timeout_s": 5,
        "rate_limit_per_s": 3,
        "event_types": ["order.created"],
    },
    ("patch", "/v1/partners/{uid}/endpoints/{endpoint_id}"): {
        "url": "http://127.0.0.1:9/h2",
        "description": "d2",
        "timeout_s": 7,
    },
    ("post", "/v1/partners/{uid}/endpoints/{endpoint_id}/disable"): {"reason": "r"},
    ("post", "/v1/partners/{uid}/events"): {
        "type": "order.created",
        "version": 1,
        "data": {"order_id": "o", "amount": 1},
        "correlation_id": "c",
        "resource": {"type": "order", "id": "o", "version": 1},
        "occurred_at": "2026-01-01T00:00:00Z",
    },
    ("post", "/v1/dead-letters/resend"): {
        "filter": {"partner": "acme", "q": "x", "status_code": 500}
    },
    ("post", "/v1/sources"): {"name": "src", "scheme": "github", "secret": "s", "tolerance_s": 300},
    ("post", "/v1/sources/{name}/secrets"): {"secret": "another"},
}
NASTY_STRINGS = {
    "nul": "a\x00b",
    "1MB": MEGA,
    "unicode": "ünï-🚀-名",
    "empty": "",
    "control": "\x01\x1f\x7f",
    "rtl": "\u202eevil",
}
NASTY_NUMBERS = {
    "huge": 10**30,
    "int4+1": 2**31,
    "int8": 2**45,
    "negative": -1,
    "zero": 0,
    "float": 1.5,
    "bool": True,
}


def _operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, methods in document()["paths"].items():
        for method, operation in methods.items():
            yield method, path, operation


def _fill(path: str, seeded: dict[str, str], override: dict[str, str] | None = None) -> str:
    values = {"name": "order.created", "version": "1"} if "/event-types/" in path else {}
    if path.startswith("/v1/sources/"):
        values = {"name": "shop"}
    if path.startswith("/v1/inbound-events/"):
        values = {"event_id": seeded["inbound_event_id"]}
    if path.startswith("/inbound/"):
        values = {"source": "shop"}
    filled = path
    for name in [part[1:-1] for part in path.split("/") if part.startswith("{")]:
        value = (override or {}).get(name, values.get(name, seeded.get(name, "x")))
        filled = filled.replace("{" + name + "}", str(value))
    return filled


def _leaves(value: Any, trail: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*trail, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaves(item, (*trail, index))
    else:
        yield trail, value


def _replaced(value: Any, trail: tuple[Any, ...], new: Any) -> Any:
    if not trail:
        return new
    copy = json.loads(json.dumps(value))
    target = copy
    for step in trail[:-1]:
        target = target[step]
    target[trail[-1]] = new
    return copy


def test_nasty_input_on_every_operation_answers_4xx_in_the_error_shape(
    client: Any, seeded: dict[str, str], auth: dict[str, str], backend: str
) -> None:
    tally = Tally()

    def send(
        method: str,
        url: str,
        data: bytes | None = None,
        content_type: str | None = "application/json",
        label: str = "",
    ) -> None:
        headers = dict(auth)
        if content_type is not None:
            headers["Content-Type"] = content_type
        response = client.open(url, method=method.upper(), data=data, headers=headers)
        tally.check(
            f"{label} {method.upper()} {url[:120]}",
            response.status_code,
            response.content_type,
            response.get_data(),
        )

    for method, path, operation in _operations():
        has_body = "requestBody" in operation
        body = VALID_BODY if has_body else None
        names = [part[1:-1] for part in path.split("/") if part.startswith("{")]
        for name in names:
            for kind, value in PATH_VALUES.items():
                send(method, _fill(path, seeded, {name: value}), body, label=f"path {name}={kind}")
        for param in operation.get("parameters", []):
            if param["in"] != "query":
                continue
            for kind, value in QUERY_VALUES.items():
                send(
                    method,
                    f"{_fill(path, seeded)}?{param['name']}={value}",
                    body,
                    label=f"query {param['name']}={kind}",
                )
        send(
            method,
            f"{_fill(path, seeded)}?limit={'9' * 400}&cursor=%00&unknown=%ED%A0%80",
            body,
            label="query mix",
        )
        if not has_body:
            continue
        url = _fill(path, seeded)
        for kind, raw in RAW_BODIES.items():
            send(method, url, raw, label=f"body {kind}")
        valid = VALID_BODIES.get((method, path), {"uid": "v", "name": "v"})
        for content_type in CONTENT_TYPES:
            send(
                method,
                url,
                json.dumps(valid).encode(),
                content_type,
                label=f"content type {content_type}",
            )
        for trail, leaf in _leaves(valid):
            nasty: dict[str, Any] = dict(NASTY_STRINGS)
            nasty.update(NASTY_NUMBERS)
            nasty.update({"null": None, "object": {"x": [1, {"y": None}]}, "list": [leaf]})
            for kind, new in nasty.items():
                if isinstance(leaf, str) and kind == "1MB" and path.endswith("/events"):
                    new = "a" * 300_000  # over the publish limit as a whole body: a 413
                send(
                    method,
                    url,
                    json.dumps(_replaced(valid, trail, new)).encode(),
                    label=f"field {'/'.join(map(str, trail))}={kind}",
                )
    # Unicode uids: created, read back, listed.
    for uid in ("ünï", "名前", "a b", "🚀", "x" * 300):
        send(
            "post",
            "/v1/partners",
            json.dumps({"uid": uid, "name": uid}).encode(),
            label=f"unicode uid {uid[:10]}",
        )
        send("get", f"/v1/partners/{quote(uid)}", label=f"unicode uid read {uid[:10]}")
        send(
            "get",
            f"/v1/partners/{quote(uid)}/events?limit=250",
            label=f"unicode uid events {uid[:10]}",
        )
    print(
        f"\nnasty input ({backend}): {tally.requests} requests; statuses "
        f"{dict(sorted(tally.by_status.items()))}; {tally.problem_count} broke the rules"
    )
    assert tally.problems == []


# ---------------------------------------------------------------------------- inbound flood


def _random_token(rng: random.Random, alphabet: str, low: int = 0, high: int = 90) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(low, high)))


PRINTABLE = string.ascii_letters + string.digits + string.punctuation + " "
LATIN1 = PRINTABLE + "éüß\xa0\xff"
HEXISH = string.hexdigits + "xyz=,; "
B64ISH = string.ascii_letters + string.digits + "+/=-_ ,"


def _b64(rng: random.Random, n: int = 32) -> str:
    return base64.b64encode(rng.randbytes(n)).decode()


def _random_signature(scheme: str, rng: random.Random, now: int) -> list[tuple[str, str]]:
    """Signature headers a forger or a broken client might send for `scheme`."""
    stamp = rng.choice(
        [
            str(now),
            str(now - 10_000),
            str(now + 10_000),
            "",
            "-1",
            "1e9",
            "9" * rng.randint(1, 5000),
            _random_token(rng, PRINTABLE, 1, 20),
            f"{now}.5",
            f" {now} ",
        ]
    )
    junk = _random_token(rng, rng.choice([PRINTABLE, LATIN1, HEXISH, B64ISH]))
    if scheme == "standard-webhooks":
        pieces = [
            rng.choice(
                [
                    f"v1,{_b64(rng)}",
                    "v1",
                    "v1,a,b",
                    f"v2,{_b64(rng)}",
                    f"v1a,{_b64(rng, 64)}",
                    f"v1,{junk}",
                    junk,
                    "v1,",
                    ",",
                    f"v1,{_b64(rng, rng.randint(0, 200))}",
                ]
            )
            for _ in range(rng.choice([1, 1, 2, 5, 50]))
        ]
        headers = [
            ("webhook-id", rng.choice(["msg_1", "", junk, "x" * 5000])),
            ("webhook-timestamp", stamp),
            ("webhook-signature", " ".join(pieces)),
        ]
    elif scheme == "stripe":
        parts = [
            rng.choice(
                [
                    f"t={stamp}",
                    f"v1={rng.randbytes(32).hex()}",
                    f"v0={junk}",
                    f"v1={junk}",
                    "t=",
                    "v1=",
                    junk,
                    f"t={stamp},t={now}",
                    f"v1={rng.randbytes(rng.randint(0, 64)).hex()}",
                ]
            )
            for _ in range(rng.choice([1, 2, 3, 10]))
        ]
        headers = [("Stripe-Signature", rng.choice([",", ";", ", "]).join(parts))]
    elif scheme == "github":
        headers = [
            (
                "X-Hub-Signature-256",
                rng.choice(
                    [
                        f"sha256={rng.randbytes(32).hex()}",
                        f"sha1={rng.randbytes(20).hex()}",
                        f"sha256={junk}",
                        f"SHA256={rng.randbytes(32).hex()}",
                        "sha256=",
                        junk,
                        f"sha256={rng.randbytes(32).hex().upper()}",
                    ]
                ),
            )
        ]
    else:
        headers = [
            (
                "X-Shopify-Hmac-Sha256",
                rng.choice(
                    [
                        _b64(rng),
                        _b64(rng, rng.randint(0, 100)),
                        junk,
                        "",
                        "====",
                        rng.randbytes(32).hex(),
                    ]
                ),
            )
        ]
    if rng.random() < 0.1:
        headers = headers + headers  # the same header twice
    if rng.random() < 0.05:
        headers = []
    return headers


@pytest.mark.parametrize("scheme", SCHEMES)
def test_forged_signatures_never_store_and_never_fail_the_server(
    runtime: Runtime, client: Any, scheme: str, backend: str
) -> None:
    create_source(runtime, f"src-{scheme}", scheme)
    rng = random.Random(f"{scheme}-{backend}")  # noqa: S311 - reproducible fuzz input
    tally = Tally()
    now = int(time.time())
    bodies = [
        callback(scheme, event_id=f"evt-{i}", resource_id=str(100 + i), version=1)
        for i in range(20)
    ]
    count = SIGNATURES if backend == "postgresql" else SIGNATURES // 10
    for i in range(count):
        body, base_headers = bodies[i % len(bodies)]
        headers = [*base_headers, *_random_signature(scheme, rng, now)]
        if rng.random() < 0.02:  # a genuine signature, by a key that is not the source's
            headers = sign(scheme, OTHER_SECRETS[scheme], body, base_headers)
        response = client.post(f"/inbound/src-{scheme}", data=body, headers=headers)
        tally.check(
            f"{scheme} #{i} {headers[-3:]!r}"[:300],
            response.status_code,
            response.content_type,
            response.get_data(),
        )
        if response.status_code != 401:
            tally.problems.append(f"{scheme} #{i}: {response.status_code} for {headers!r}"[:300])
    with runtime.db.begin() as session:
        stored = session.scalar(select(func.count()).select_from(InboundEvent))
    print(
        f"\nforged {scheme} signatures ({backend}): {tally.requests} requests, statuses "
        f"{tally.by_status}, {stored} rows stored"
    )
    assert tally.problems == []
    assert stored == 0
