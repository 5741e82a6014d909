"""The plain header block is read as `http.client` reads it, without the email parser."""

from __future__ import annotations

import http.client
import io
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.net.response_head import Response, parse_headers

PLAIN = [
    b"Content-Length: 2\r\n",
    b"content-type: text/plain; charset=utf-8\r\n",
    b"X-Trailing-Space: kept   \r\n",
    b"X-Empty:\r\n",
    b"X-Tab:\tvalue\r\n",
    b"Set-Cookie: a=1\r\n",
    b"Set-Cookie: b=2\r\n",
    b"X-Latin: caf\xe9\r\n",
    b"X-Colons: a:b:c\r\n",
    b"X-Bare-LF: yes\n",
]
# Lines the fast path leaves to the standard parser.
IRREGULAR = [
    b"  folded onto the previous line\r\n",
    b"\tfolded with a tab\r\n",
    b"No colon here\r\n",
    b"Bad Name: space in the name\r\n",
    b": no name\r\n",
    b"From someone\r\n",
    b"X-Bare-CR: a\rb\r\n",
    b"\xff\xfe: high bytes\r\n",
]


def _view(message: Any) -> tuple[Any, ...]:
    """What a caller can see of a parsed head."""
    return (
        message.items(),
        [type(d).__name__ for d in message.defects],
        message.get_payload(),
        type(message),
    )


def _both(block: bytes) -> tuple[Any, Any]:
    return (
        _view(http.client.parse_headers(io.BytesIO(block))),
        _view(parse_headers(io.BytesIO(block))),
    )


@settings(max_examples=400, deadline=None)
@given(
    lines=st.lists(st.sampled_from(PLAIN + IRREGULAR), max_size=12),
    end=st.sampled_from([b"\r\n", b"\n", b""]),
    body=st.sampled_from([b"", b"ok", b"Not: a header\r\n"]),
)
def test_every_head_reads_as_the_standard_parser_reads_it(
    lines: list[bytes], end: bytes, body: bytes
) -> None:
    expected, got = _both(b"".join(lines) + end + body)
    assert got == expected


@pytest.mark.parametrize("line", IRREGULAR)
def test_an_irregular_line_anywhere_gives_the_standard_result(line: bytes) -> None:
    block = b"Content-Length: 2\r\n" + line + b"X-After: 1\r\n\r\n"
    expected, got = _both(block)
    assert got == expected


def test_plain_lines_are_split_here_in_order_with_duplicates_kept() -> None:
    message = parse_headers(io.BytesIO(b"A: 1\r\nSet-Cookie: x\r\nSet-Cookie: y\r\n\r\nrest"))
    assert message.items() == [("A", "1"), ("Set-Cookie", "x"), ("Set-Cookie", "y")]
    assert message.get_all("set-cookie") == ["x", "y"]


def test_the_limits_of_http_client_still_hold() -> None:
    too_many = b"".join(b"X-%d: v\r\n" % n for n in range(http.client._MAXHEADERS + 1))  # type: ignore[attr-defined]
    with pytest.raises(http.client.HTTPException, match="more than"):
        parse_headers(io.BytesIO(too_many + b"\r\n"))
    with pytest.raises(http.client.LineTooLong):
        parse_headers(io.BytesIO(b"X-Long: " + b"a" * 70_000 + b"\r\n\r\n"))


class _Socket:
    """Enough of a socket for `HTTPResponse`: it reads a canned answer."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self.data))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 100 Continue\r\nX-Skip: 1\r\n\r\nHTTP/1.1 204 No Content\r\nA: b\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nX-Folded: a\r\n b\r\n\r\nbody until close",
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
    ],
)
def test_a_response_begins_as_the_standard_one(answer: bytes) -> None:
    ours = Response(_Socket(answer), method="POST")  # type: ignore[arg-type]
    theirs = http.client.HTTPResponse(_Socket(answer), method="POST")  # type: ignore[arg-type]
    ours.begin()
    theirs.begin()
    seen = [
        (r.status, r.reason, r.version, r.getheaders(), r.chunked, r.length, r.will_close)
        for r in (ours, theirs)
    ]
    assert seen[0] == seen[1]
    assert ours.read() == theirs.read()
