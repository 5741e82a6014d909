"""An answer's header block read without the `email` package, for the common case.

`http.client` reads a response's headers line by line (bounded: `_MAXLINE`, `_MAXHEADERS`),
then hands the block to `email.parser`, a general MIME parser: about 12 µs for two headers in
a hot loop, and on a worker at a trickle, where every delivery runs cold, ~160 µs of a
delivery's ~1.6 ms of CPU (py-spy, 100 events/s). An answer's head is almost always plain
`Name: value` lines, which need only a split. So `Response` reads the lines as `http.client`
does and builds the same `HTTPMessage` from them directly; any line that is not plain (folded
onto the next, a name with characters a header name cannot have, no colon, a bare CR inside)
sends the whole block to the standard parser instead, so every unusual answer is read exactly
as before, defects and all.
"""

from __future__ import annotations

import email.parser
import http.client
import re
import types
from typing import IO, Any

# A header name as `email.feedparser` recognises one: printable ASCII but the colon.
_NAME = re.compile(r"[\x21-\x39\x3b-\x7e]+")
_END = (b"\r\n", b"\n", b"")


def parse_headers(fp: IO[bytes], _class: type[Any] = http.client.HTTPMessage) -> Any:
    """`http.client.parse_headers`, with the plain case parsed here: the same message, the
    same errors for an over-long line or too many headers (`_read_headers` raises them)."""
    lines: list[bytes] = http.client._read_headers(fp)  # type: ignore[attr-defined]
    message = _class()
    for line in lines:
        if line in _END:
            break
        name, colon, rest = line.decode("iso-8859-1").partition(":")
        # A line ends at its LF (readline): only a bare CR can be left inside.
        value = rest.lstrip(" \t").rstrip("\r\n")
        if not colon or _NAME.fullmatch(name) is None or "\r" in value:
            return email.parser.Parser(_class=_class).parsestr(b"".join(lines).decode("iso-8859-1"))
        message[name] = value
    message.set_payload("")  # as the email parser leaves it: nothing after the head
    return message


def _begin_with(parse: Any) -> Any:
    """`HTTPResponse.begin` itself, its global `parse_headers` bound to `parse`: the status
    line, 1xx answers, chunking, length and keep-alive handled by the standard code."""
    begin = http.client.HTTPResponse.begin
    namespace = dict(begin.__globals__, parse_headers=parse)
    return types.FunctionType(
        begin.__code__, namespace, begin.__name__, begin.__defaults__, begin.__closure__
    )


class Response(http.client.HTTPResponse):
    """The standard response, its header block parsed by `parse_headers` above."""

    begin = _begin_with(parse_headers)
