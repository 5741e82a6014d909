"""A pooled client is never handed a dead socket after an early answer, under `kurir api`.

Each case sends a request that is answered before its body is read (or after reading it),
on a `requests.Session` whose connection is already open, then sends a second request on the
same Session. The second must succeed: on the same connection when the answer said
keep-alive, on a fresh one when it said ``Connection: close``. Bodies are over 64 KiB, more
than gunicorn drains on its own after an answer.

The server is the real `kurir api` on SQLite, under each HTTP server installed (gunicorn
gthread with Kurir's glue, granian by its own HTTP layer): what is tested is how the HTTP
connection is handled, which does not depend on the database behind it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from tests.support.api_process import SERVERS, Api, serve_api

BIG = 200 * 1024  # over gunicorn's own post-answer drain (64 KiB), under the payload limit
OVER_LIMIT = 300 * 1024  # over KURIR_MAX_PAYLOAD_BYTES (256 KiB by default)
JSON = "application/json"


@pytest.fixture(scope="module", params=SERVERS)
def api(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[Api]:
    yield from serve_api(
        tmp_path_factory, redis_url, "--workers", "1", "--threads", "4", server=request.param
    )


def _chunks(total: int, size: int = 16 * 1024) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        yield b"x" * min(size, total - sent)
        sent += size


def _local_port(response: requests.Response) -> int:
    """The client port of the socket a (streamed, unread) answer came on.

    http.client lets go of a connection whose answer says ``Connection: close`` as soon as
    the headers are read; the socket then lives on only under the response's reader.
    """
    connection = response.raw.connection
    sock = connection.sock if connection is not None else None
    if sock is None:
        sock = response.raw._fp.fp.raw._sock
    return int(sock.getsockname()[1])


Case = Callable[[Api], dict[str, Any]]

CASES: dict[str, Case] = {
    "publish-413-content-length": lambda a: dict(
        method="POST",
        path="/v1/partners/acme/events",
        data=b"x" * OVER_LIMIT,
        headers={"Authorization": f"Bearer {a.admin}", "Content-Type": JSON},
        status=413,
    ),
    "publish-413-chunked": lambda a: dict(
        method="POST",
        path="/v1/partners/acme/events",
        data=_chunks(OVER_LIMIT),
        headers={"Authorization": f"Bearer {a.admin}", "Content-Type": JSON},
        status=413,
    ),
    "other-route-413": lambda a: dict(
        method="POST",
        path="/v1/partners",
        data=b"x" * OVER_LIMIT,
        headers={"Authorization": f"Bearer {a.admin}", "Content-Type": JSON},
        status=413,
    ),
    "401-missing-key": lambda a: dict(
        method="POST",
        path="/v1/partners/acme/events",
        data=b"x" * BIG,
        headers={"Content-Type": JSON},
        status=401,
    ),
    "401-invalid-key": lambda a: dict(
        method="POST",
        path="/v1/partners/acme/events",
        data=b"x" * BIG,
        headers={"Authorization": "Bearer kurir_not_a_key", "Content-Type": JSON},
        status=401,
    ),
    "403-scope": lambda a: dict(  # a valid publish, so the scope is what refuses it
        method="POST",
        path="/v1/partners/acme/events",
        data=json.dumps(
            {"type": "order.created", "version": 1, "data": {"pad": "x" * BIG}}
        ).encode(),
        headers={"Authorization": f"Bearer {a.reader}", "Content-Type": JSON},
        status=403,
    ),
    "415-content-type": lambda a: dict(
        method="POST",
        path="/v1/partners/acme/events",
        data=b"x" * BIG,
        headers={"Authorization": f"Bearer {a.admin}", "Content-Type": "text/plain"},
        status=415,
    ),
    "404-unknown-path": lambda a: dict(
        method="POST", path="/v1/no-such-thing", data=b"x" * BIG, headers={}, status=404
    ),
    "405-method": lambda a: dict(
        method="PUT",
        path="/v1/partners",
        data=b"x" * BIG,
        headers={"Authorization": f"Bearer {a.admin}"},
        status=405,
    ),
    "inbound-401-signature": lambda a: dict(
        method="POST",
        path="/inbound/shop",
        data=b"x" * BIG,
        headers={"X-Hub-Signature-256": "sha256=" + "0" * 64},
        status=401,
    ),
    "inbound-404-source": lambda a: dict(
        method="POST", path="/inbound/nowhere", data=b"x" * BIG, headers={}, status=404
    ),
    "inbound-413": lambda a: dict(
        method="POST", path="/inbound/shop", data=b"x" * OVER_LIMIT, headers={}, status=413
    ),
    "ui-post-without-csrf": lambda a: dict(
        method="POST",
        path="/ui/login",
        data=b"x" * BIG,
        headers={"Content-Type": "application/octet-stream"},
        status=400,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_next_request_on_the_same_session_succeeds_after_an_early_answer(
    api: Api, case: str
) -> None:
    spec = CASES[case](api)
    status = spec.pop("status")
    path = spec.pop("path")
    with requests.Session() as session:
        warm = session.get(f"{api.url}/healthz", timeout=10, stream=True)
        first_port = _local_port(warm)
        warm.content  # noqa: B018 - read to the end, so the connection returns to the pool

        answer = session.request(url=f"{api.url}{path}", timeout=30, stream=True, **spec)
        assert answer.status_code == status, answer.text[:300]
        assert _local_port(answer) == first_port  # the early answer came on the open socket
        said = answer.headers.get("Connection", "").lower()
        answer.content  # noqa: B018 - read to the end, so the connection returns to the pool

        following = session.get(f"{api.url}/healthz", timeout=10, stream=True)
        assert following.status_code == 200
        if said != "close":
            assert _local_port(following) == first_port  # kept alive, and reused


def test_answer_after_reading_the_whole_body_keeps_the_connection(api: Api) -> None:
    """The guard closes only when body bytes are left: a read body keeps its connection."""
    with requests.Session() as session:
        answer = session.post(
            f"{api.url}/v1/partners/acme/events",
            data=b"{" + b" " * BIG,
            headers={"Authorization": f"Bearer {api.admin}", "Content-Type": JSON},
            timeout=30,
            stream=True,
        )
        assert answer.status_code == 400
        first_port = _local_port(answer)
        # Kept alive: gunicorn says so, granian (HTTP/1.1) leaves it implicit.
        assert answer.headers.get("Connection", "keep-alive").lower() == "keep-alive"
        answer.content  # noqa: B018
        following = session.get(f"{api.url}/healthz", timeout=10, stream=True)
        assert following.status_code == 200 and _local_port(following) == first_port
