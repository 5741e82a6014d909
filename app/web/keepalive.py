"""Never hand a pooled client a dead socket: an answer given before the body was read closes.

Many answers come before the request body is read: 413 on ``Content-Length`` alone, 401 and
403 before a publish is parsed, 404/405 on a route that reads nothing, 415, a UI form without
its CSRF token. What is left of the body is still on the socket. gunicorn drains a little of
it after the answer and, when it cannot (more than 64 KiB, or too slow), closes the
connection, although the answer it just sent said ``Connection: keep-alive``; a
``requests.Session`` then sends its next request into a closed socket and gets "Remote end
closed connection without response".

:class:`UnreadBodyGuard` watches how much of the body the app read. When the app starts its
answer with body bytes unread, it asks the server, through the environ callable under
:data:`CLOSE_CONNECTION`, to close the connection and say so (``Connection: close``), which a
pooled client honours by dropping that socket. It does not drain: the body may be a
gigabyte, or trickle in forever, and nothing the app wants is in it. A WSGI app may not set
``Connection`` itself (hop-by-hop, PEP 3333; gunicorn drops it), hence the callable; the
glue for gunicorn is :func:`remember_request` plus :func:`with_gunicorn_close`, for granian
:func:`with_close_header`. Werkzeug's development server closes every connection anyway, so
it needs no glue.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

# The environ key under which the server offers "close this connection after the answer".
CLOSE_CONNECTION = "kurir.close_connection"

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class _TrackedInput:
    """``wsgi.input`` that records whether the body was read to its end."""

    def __init__(self, stream: IO[bytes], length: int | None) -> None:
        self._stream = stream
        self._remaining = length  # None: chunked, its end is seen only as an empty read
        self.finished = False

    def _account(self, data: bytes, asked: int | None) -> bytes:
        if self._remaining is not None:
            self._remaining -= len(data)
            if self._remaining <= 0:
                self.finished = True
        if (not data and asked != 0) or asked is None:
            self.finished = True  # end of stream (or a client that stopped short)
        return data

    def read(self, size: int | None = -1) -> bytes:
        asked = None if size is None or size < 0 else size
        return self._account(self._stream.read(size if size is not None else -1), asked)

    def readline(self, size: int | None = -1) -> bytes:
        line = self._stream.readline(size if size is not None else -1)
        return self._account(line, 1 if line else None)  # only an empty line is the end

    def readlines(self, hint: int | None = -1) -> list[bytes]:
        lines = self._stream.readlines(hint if hint is not None else -1)
        for line in lines:
            self._account(line, None)
        if hint is None or hint <= 0:
            self.finished = True
        return lines

    def __iter__(self) -> Iterator[bytes]:
        while True:
            line = self.readline()
            if not line:
                return
            yield line


def _declared_length(environ: dict[str, Any]) -> int | None:
    """Bytes the body declares (0 for none); None for a chunked body of unknown length."""
    if "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
        return None
    raw = environ.get("CONTENT_LENGTH") or "0"
    try:
        return max(int(raw), 0)
    except ValueError:
        return None  # the server refuses such a request before us; be safe if it did not


class UnreadBodyGuard:
    """WSGI middleware: an answer that leaves request body unread closes its connection."""

    def __init__(self, app: WsgiApp) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        length = _declared_length(environ)
        if length == 0:
            return self.app(environ, start_response)
        tracked = _TrackedInput(environ["wsgi.input"], length)
        environ["wsgi.input"] = tracked

        def start_response_closing_if_unread(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Any:
            if not tracked.finished:
                close = environ.get(CLOSE_CONNECTION)
                if close is not None:
                    close()
            return start_response(status, headers, exc_info)

        return self.app(environ, start_response_closing_if_unread)


# ----------------------------------------------------------------------------- gunicorn glue

# gunicorn hands the request object to its pre_request hook, not to the app; its gthread and
# sync workers call the hook and then the app on the same thread.
_serving = threading.local()


def remember_request(worker: Any, req: Any) -> None:
    """gunicorn ``pre_request`` hook: keep the request for :func:`with_gunicorn_close`."""
    _serving.request = req


def with_gunicorn_close(app: WsgiApp) -> WsgiApp:
    """Offer :data:`CLOSE_CONNECTION` to `app` under gunicorn.

    A request with ``must_close`` set makes gunicorn answer ``Connection: close`` and close
    the socket after the response (``gunicorn.http.message.Request.should_close``); the
    app's own ``Connection`` header would be dropped as hop-by-hop.
    """

    def wsgi(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        req = _serving.__dict__.pop("request", None)
        if req is not None:
            environ[CLOSE_CONNECTION] = lambda: setattr(req, "must_close", True)
        return app(environ, start_response)

    return wsgi


# ----------------------------------------------------------------------------- granian glue


def with_close_header(app: WsgiApp) -> WsgiApp:
    """Offer :data:`CLOSE_CONNECTION` to `app` under granian: it adds ``Connection: close``.

    granian's HTTP layer (hyper) closes a connection whose request body was left unread, but
    says so only when it has noticed in time: often the answer goes out without
    ``Connection: close`` and the socket closes right after, which a pooled client may
    reuse first. hyper honours the header when the app sends it, so the glue sends it.
    """

    def wsgi(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        closing: list[bool] = []
        environ[CLOSE_CONNECTION] = lambda: closing.append(True)

        def start_response_saying_close(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Any:
            if closing:
                headers = [(k, v) for k, v in headers if k.lower() != "connection"]
                headers.append(("Connection", "close"))
            return start_response(status, headers, exc_info)

        return app(environ, start_response_saying_close)

    return wsgi
