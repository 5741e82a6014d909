"""UnreadBodyGuard asks the server to close exactly when body bytes are left unread."""

from __future__ import annotations

import io
from typing import Any

import pytest

from app.web.keepalive import CLOSE_CONNECTION, UnreadBodyGuard


def _run(
    body: bytes, *, reads: list[int | None], chunked: bool = False, readline: bool = False
) -> bool:
    """Serve one request whose app makes `reads`; True when the guard asked to close."""
    closed: list[bool] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        stream = environ["wsgi.input"]
        for size in reads:
            if readline:
                stream.readline(size if size is not None else -1)
            else:
                stream.read(size)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    environ: dict[str, Any] = {
        "wsgi.input": io.BytesIO(body),
        CLOSE_CONNECTION: lambda: closed.append(True),
    }
    if chunked:
        environ["HTTP_TRANSFER_ENCODING"] = "chunked"
    elif body:
        environ["CONTENT_LENGTH"] = str(len(body))
    assert list(UnreadBodyGuard(app)(environ, lambda *a: None)) == [b"ok"]
    return bool(closed)


def test_a_request_without_a_body_keeps_its_connection() -> None:
    assert _run(b"", reads=[]) is False


@pytest.mark.parametrize("reads", [[None], [10, 100], [5, 5]])
def test_a_body_read_to_its_length_keeps_the_connection(reads: list[int | None]) -> None:
    assert _run(b"0123456789", reads=reads) is False


@pytest.mark.parametrize("reads", [[], [4], [9]])
def test_an_answer_with_body_bytes_unread_closes(reads: list[int | None]) -> None:
    assert _run(b"0123456789", reads=reads) is True


def test_a_chunked_body_is_finished_only_when_its_end_was_read() -> None:
    assert _run(b"abc", reads=[3], chunked=True) is True  # end not seen yet
    assert _run(b"abc", reads=[3, 3], chunked=True) is False  # the empty read is the end
    assert _run(b"abc", reads=[None], chunked=True) is False


def test_lines_count_as_reads() -> None:
    assert _run(b"a\nb\n", reads=[None], readline=True) is True
    assert _run(b"a\nb\n", reads=[None, None], readline=True) is False


def test_without_a_server_hook_the_answer_is_untouched() -> None:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("413 Content Too Large", [])
        return [b"no"]

    environ = {"wsgi.input": io.BytesIO(b"x" * 10), "CONTENT_LENGTH": "10"}
    assert list(UnreadBodyGuard(app)(environ, lambda *a: None)) == [b"no"]


def _served_with_close_header(call_close: bool, headers: list[tuple[str, str]]) -> list[Any]:
    """The headers granian is handed when the app (did or did not) ask to close."""
    from app.web.keepalive import with_close_header

    seen: list[Any] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        if call_close:
            environ[CLOSE_CONNECTION]()
        start_response("413 Payload Too Large", list(headers))
        return [b"no"]

    environ: dict[str, Any] = {}
    wrapped = with_close_header(app)
    assert list(wrapped(environ, lambda status, hs, exc=None: seen.extend(hs))) == [b"no"]
    return seen


def test_granian_glue_says_connection_close_only_when_asked() -> None:
    plain = [("Content-Type", "application/json")]
    assert _served_with_close_header(False, plain) == plain
    assert _served_with_close_header(True, plain) == [*plain, ("Connection", "close")]
    # one Connection header, never two that disagree
    assert _served_with_close_header(True, [("Connection", "keep-alive")]) == [
        ("Connection", "close")
    ]
