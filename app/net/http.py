"""Outbound HTTP with the SSRF guard built in: pinned addresses, no redirects, hard deadlines.

A failed exchange is a value (:class:`HttpResult`) whose ``error`` names what went wrong:

- ``timeout``: the total deadline passed (connect, DNS, a trickled answer: all one budget);
- ``connection_error``: refused, reset, or closed before or in the middle of the answer;
- ``protocol_error``: the peer answered, but not in HTTP: a bad status line, a header line
  over 64 KiB, more than 100 headers, broken chunk framing;
- ``tls_error``, ``blocked_address`` (the SSRF guard), ``invalid_url``, ``invalid_request``.

An answer in HTTP with any status is not an error here: the caller judges the status.
"""

from __future__ import annotations

import contextlib
import heapq
import http.client
import http.cookiejar
import itertools
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import requests
import requests.adapters
import urllib3
from requests.structures import CaseInsensitiveDict
from requests.utils import check_header_validity
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import (
    ClosedPoolError,
    ConnectTimeoutError,
    MaxRetryError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
)

from app.net import guard
from app.net.guard import GuardPolicy, Resolver
from app.net.response_head import Response

MAX_BODY_BYTES = 4096
_READ_CHUNK = 1024
_LARGE_READ_CHUNK = 64 * 1024

ERROR_TIMEOUT = "timeout"
ERROR_CONNECTION = "connection_error"
ERROR_BLOCKED = "blocked_address"
ERROR_TLS = "tls_error"
ERROR_INVALID_URL = "invalid_url"
ERROR_INVALID_REQUEST = "invalid_request"
ERROR_PROTOCOL = "protocol_error"

# Framing and routing headers are ours: a caller's value could desynchronise the exchange.
_OWNED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})


@dataclass
class HttpResult:
    """The outcome of one request (for a delivery, recorded as an attempt); network failures
    are values, not raises."""

    status: int | None
    body: bytes
    duration_ms: int
    error: str | None
    request_headers: dict[str, str]
    response_headers: dict[str, str] = field(default_factory=dict)
    error_detail: str | None = None
    # The response body went on past the bytes kept in `body`.
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """Delivered means a 2xx that also arrived completely within the deadline."""
        return self.error is None and self.status is not None and 200 <= self.status <= 299

    @property
    def retry_after(self) -> str | None:
        """The raw Retry-After header, which the retry policy parses."""
        return self.response_headers.get("retry-after")


class _Deadline:
    """One exchange's wall-clock budget; when it passes, its sockets are shut down."""

    def __init__(self, at: float) -> None:
        self.at = at
        self.fired = False
        self.done = False
        self._lock = threading.Lock()
        self._conns: list[Any] = []

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self.at - time.monotonic())

    def track(self, conn: Any) -> None:
        """Watch a connection used by this exchange (and cut it at once if already late)."""
        with self._lock:
            if self.done:
                return
            if conn not in self._conns:
                self._conns.append(conn)
            late = self.fired
        if late:
            _shutdown(conn)

    def fire(self) -> None:
        """Interrupt whatever read or write the exchange is blocked in."""
        with self._lock:
            if self.done:
                return
            self.fired = True
            conns = list(self._conns)
        for conn in conns:
            _shutdown(conn)

    def finish(self) -> bool:
        """Stop watching; returns whether the deadline fired before the exchange ended."""
        with self._lock:
            self.done = True
            self._conns.clear()
            return self.fired


def _shutdown(conn: Any) -> None:
    """Shut the socket down at the OS level, which wakes a thread blocked on it."""
    for sock in (getattr(conn, "sock", None), getattr(conn, "_kurir_raw_sock", None)):
        if sock is None:
            continue
        # socket.socket.shutdown, not SSLSocket's: act on the fd, leave TLS state alone.
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


# A finished exchange leaves its deadline in the watchdog's heap until that deadline would
# have passed (up to the longest timeout). Past this many entries the finished ones are
# dropped at once, so the heap holds about what is in flight, not timeout x attempt rate.
WATCHDOG_COMPACT_AT = 4096


class _Watchdog:
    """A single timer thread enforcing every exchange's deadline, instead of a thread each."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Deadline]] = []
        self._compact_at = WATCHDOG_COMPACT_AT
        self._counter = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False

    def arm(self, deadline: _Deadline) -> None:
        """Schedule a deadline, starting the timer thread lazily."""
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._closed = False
                self._thread = threading.Thread(
                    target=self._run, name="kurir-http-watchdog", daemon=True
                )
                self._thread.start()
            if len(self._heap) >= self._compact_at:
                self._heap = [entry for entry in self._heap if not entry[2].done]
                heapq.heapify(self._heap)
                # Compact again only once the live part has doubled: O(1) per arm on average.
                self._compact_at = max(WATCHDOG_COMPACT_AT, 2 * len(self._heap))
            # The timer thread sleeps until the earliest deadline: it needs waking only when
            # this one comes sooner (rarely, as timeouts are alike), not once per exchange.
            sooner = not self._heap or deadline.at < self._heap[0][0]
            heapq.heappush(self._heap, (deadline.at, next(self._counter), deadline))
            if sooner:
                self._cond.notify()

    def close(self) -> None:
        """Stop the timer thread."""
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify()

    def _run(self) -> None:
        """Fire deadlines in order; finished ones are skipped when they come up."""
        while True:
            with self._cond:
                while not self._closed:
                    while self._heap and self._heap[0][2].done:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._cond.wait()
                        continue
                    wait = self._heap[0][0] - time.monotonic()
                    if wait <= 0:
                        break
                    self._cond.wait(wait)
                if self._closed:
                    return
                _, _, due = heapq.heappop(self._heap)
            due.fire()


_current = threading.local()


def _track_current(conn: Any) -> None:
    """Register a connection with the deadline of the exchange running on this thread."""
    deadline: _Deadline | None = getattr(_current, "deadline", None)
    if deadline is not None:
        deadline.track(conn)


class _WatchedMixin:
    """Hooks that put every socket an exchange touches under its deadline; answers read by
    `response_head.Response` (the plain header block without the `email` parser)."""

    sock: Any
    response_class: type[http.client.HTTPResponse] = Response

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()  # type: ignore[misc]
        self._kurir_raw_sock = sock
        _track_current(self)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        _track_current(self)
        super().request(*args, **kwargs)  # type: ignore[misc]

    def getresponse(self) -> Any:
        _track_current(self)
        return super().getresponse()  # type: ignore[misc]


class _WatchedHTTPConnection(_WatchedMixin, HTTPConnection):
    """Plain connection under deadline watch."""


class _WatchedHTTPSConnection(_WatchedMixin, HTTPSConnection):
    """TLS connection under deadline watch."""


class _WatchedHTTPConnectionPool(HTTPConnectionPool):
    """Pool whose connections are under deadline watch."""

    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSConnectionPool(HTTPSConnectionPool):
    """TLS pool whose connections are under deadline watch."""

    ConnectionCls = _WatchedHTTPSConnection


class PinnedAdapter(requests.adapters.HTTPAdapter):
    """Connects to the IP put in the URL while TLS uses the original host for SNI and checks."""

    def __init__(self, hostname: str, **kwargs: Any) -> None:
        self._hostname = hostname
        super().__init__(**kwargs)

    def init_poolmanager(
        self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any
    ) -> None:
        """Build the pool manager with watched pools and the hostname TLS must verify."""
        # SNI and OpenSSL's hostname check use the original name, never the pinned IP
        # (urllib3 drops this keyword for plain-http pools).
        pool_kwargs.setdefault("server_hostname", self._hostname)
        super().init_poolmanager(connections, maxsize, block=block, **pool_kwargs)
        self.poolmanager.pool_classes_by_scheme = {
            "http": _WatchedHTTPConnectionPool,
            "https": _WatchedHTTPSConnectionPool,
        }


class _ResolveTimeout(guard.ResolutionError):
    """The DNS lookup did not finish within the exchange's deadline."""


# What HTTPAdapter passes to its pool: no retries, and none for reads (urllib3 then raises a
# connect failure as MaxRetryError and a read failure as itself).
_NO_RETRIES = urllib3.Retry(0, read=False)

_SEND_ERRORS = (
    requests.exceptions.RequestException,
    urllib3.exceptions.HTTPError,
    http.client.HTTPException,
    OSError,
    ValueError,
)


def _host_header(host: str, scheme: str, port: int) -> str:
    """The Host header a client would send for the original URL (zone ids never go out)."""
    bare = host.split("%", 1)[0]
    shown = f"[{bare}]" if ":" in bare else bare
    default = guard.ALLOWED_SCHEMES[scheme]
    return shown if port == default else f"{shown}:{port}"


def _pinned_url(url: str, ip: str, port: int) -> str:
    """Rewrite the URL to the checked address so nothing downstream resolves the name again."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    if ":" in ip:
        addr, _, zone = ip.partition("%")
        literal = f"[{addr}%25{zone}]" if zone else f"[{addr}]"
    else:
        literal = ip
    netloc = f"{userinfo}@{literal}:{port}" if userinfo else f"{literal}:{port}"
    return urlunsplit((parts.scheme.lower(), netloc, parts.path or "/", parts.query, ""))


def _causes(exc: BaseException) -> list[BaseException]:
    """The exception and everything it wraps (requests and urllib3 nest them in args)."""
    found: list[BaseException] = []
    stack = [exc]
    while stack and len(found) < 16:
        current = stack.pop(0)
        if any(current is seen for seen in found):
            continue
        found.append(current)
        stack.extend(arg for arg in current.args if isinstance(arg, BaseException))
        for linked in (getattr(current, "reason", None), current.__cause__, current.__context__):
            if isinstance(linked, BaseException):
                stack.append(linked)
    return found


def _is_protocol_violation(exc: BaseException) -> bool:
    """Whether the peer sent bytes that are not an HTTP response (not merely hung up)."""
    causes = _causes(exc)
    # RemoteDisconnected is a BadStatusLine and IncompleteRead an HTTPException, but both
    # mean the peer closed the connection: a connection error, not a protocol one...
    if any(isinstance(c, http.client.RemoteDisconnected) for c in causes):
        return False
    if any(isinstance(c, urllib3.exceptions.InvalidChunkLength) for c in causes):
        return True
    if any(isinstance(c, http.client.IncompleteRead) for c in causes):
        # ...unless http.client raised it while failing to parse a chunk size.
        return any(isinstance(c, ValueError) for c in causes)
    # BadStatusLine, LineTooLong, "got more than 100 headers", ...
    return any(isinstance(c, http.client.HTTPException) for c in causes)


def _classify(exc: BaseException) -> str:
    """Map requests/urllib3 exceptions onto the attempt error classes."""
    if isinstance(exc, requests.exceptions.SSLError):
        return ERROR_TLS
    if isinstance(exc, requests.exceptions.Timeout):
        return ERROR_TIMEOUT
    if isinstance(exc, urllib3.exceptions.SSLError):
        return ERROR_TLS
    if isinstance(exc, urllib3.exceptions.TimeoutError | TimeoutError):
        return ERROR_TIMEOUT
    if _is_protocol_violation(exc):
        return ERROR_PROTOCOL
    if isinstance(exc, requests.exceptions.InvalidURL):
        return ERROR_INVALID_URL
    if isinstance(exc, requests.exceptions.InvalidHeader | ValueError):
        return ERROR_INVALID_REQUEST
    return ERROR_CONNECTION


def _as_requests_error(exc: BaseException) -> BaseException:
    """The exception `requests.adapters.HTTPAdapter.send` would raise for this urllib3 one.

    The exchange calls the adapter's urllib3 pool directly (see `_Route`); mapping its
    exceptions the way the adapter does keeps every error class exactly as before.
    """
    if isinstance(exc, ProtocolError | OSError):
        return requests.exceptions.ConnectionError(exc)
    if isinstance(exc, MaxRetryError):
        reason = exc.reason
        if isinstance(reason, ConnectTimeoutError) and not isinstance(reason, NewConnectionError):
            return requests.exceptions.ConnectTimeout(exc)
        if isinstance(reason, urllib3.exceptions.ResponseError):
            return requests.exceptions.RetryError(exc)
        if isinstance(reason, urllib3.exceptions.SSLError):
            return requests.exceptions.SSLError(exc)
        return requests.exceptions.ConnectionError(exc)
    if isinstance(exc, ClosedPoolError):
        return requests.exceptions.ConnectionError(exc)
    if isinstance(exc, urllib3.exceptions.SSLError):
        return requests.exceptions.SSLError(exc)
    if isinstance(exc, ReadTimeoutError):
        return requests.exceptions.ReadTimeout(exc)
    if isinstance(exc, urllib3.exceptions.InvalidHeader):
        return requests.exceptions.InvalidHeader(exc)
    return exc


@dataclass(frozen=True)
class _Route:
    """What stays the same between requests of one method to one URL at one checked address,
    worked out once by `requests` itself: the adapter's urllib3 pool (TLS settings applied),
    the request target as requests quotes it, and the headers the session adds (its defaults,
    Basic auth from credentials in the URL). Each request then costs a header merge and the
    pool's `urlopen`, not a `PreparedRequest` and a `Response` (a large share of a bare POST's
    CPU; docs/delivery.md has the figures).
    """

    pool: HTTPConnectionPool
    target: str
    defaults: tuple[tuple[str, str], ...]
    authorization: str | None

    @property
    def open(self) -> bool:
        """An evicted pool is closed by its pool manager; the route must then be built anew."""
        return self.pool.pool is not None

    def headers(self, method: str, body: bytes | None, headers: dict[str, str]) -> dict[str, str]:
        """The headers requests would send: its defaults overridden by the caller's (same
        position, the caller's spelling), then Content-Length, then the URL's Basic auth."""
        merged: dict[str, tuple[str, str]] = {
            name.lower(): (name, value) for name, value in self.defaults
        }
        for name, value in headers.items():
            check_header_validity((name, value))
            merged[name.lower()] = (name, value)
        if body:
            merged["content-length"] = ("Content-Length", str(len(body)))
        elif method not in ("GET", "HEAD"):
            merged["content-length"] = ("Content-Length", "0")
        if self.authorization is not None:
            merged["authorization"] = ("Authorization", self.authorization)
        return dict(merged.values())


# Routes kept per origin (one per method, URL and checked address), cleared past this.
MAX_ROUTES_PER_ORIGIN = 256


class _Origin:
    """One endpoint origin: its requests.Session (one pooled adapter) and prepared routes."""

    def __init__(self, session: requests.Session) -> None:
        self.session = session
        self.routes: dict[tuple[str, str, str], _Route] = {}


def _is_connect_failure(exc: BaseException) -> bool:
    """Tell whether nothing was sent, so trying the next checked address is safe."""
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return True
    if isinstance(exc, requests.exceptions.ConnectionError):
        reason = getattr(exc.args[0], "reason", None) if exc.args else None
        return isinstance(reason, NewConnectionError)
    return False


class Transport:
    """Sends webhook POSTs (and reconcile GETs), one requests.Session per origin for
    connection reuse."""

    def __init__(
        self,
        *,
        resolver: Resolver = guard.default_resolver,
        ca_certs: str | None = None,
        pool_maxsize: int = 10,
        max_sessions: int = 256,
        resolver_threads: int = 16,
    ) -> None:
        self._resolver = resolver
        self._verify: bool | str = ca_certs if ca_certs else True
        self._pool_maxsize = pool_maxsize
        self._max_sessions = max_sessions
        # One session per origin, least recently used evicted past `max_sessions`.
        self._sessions: OrderedDict[tuple[str, str, int], _Origin] = OrderedDict()
        self._lock = threading.Lock()
        self._watchdog = _Watchdog()
        # Its work queue holds at most one lookup per thread sending through this transport
        # (each waits for its own, up to its deadline), so it is bounded by the caller's pool.
        self._dns = ThreadPoolExecutor(max_workers=resolver_threads, thread_name_prefix="kurir-dns")

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release pooled connections and helper threads."""
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for origin in sessions:
            origin.session.close()
        self._watchdog.close()
        self._dns.shutdown(wait=False, cancel_futures=True)

    def _origin(self, scheme: str, host: str, port: int) -> _Origin:
        """Return the endpoint origin's session, creating it and evicting the least used."""
        key = (scheme, host, port)
        evicted: _Origin | None = None
        with self._lock:
            origin = self._sessions.get(key)
            if origin is not None:
                self._sessions.move_to_end(key)
                return origin
            session = requests.Session()
            session.trust_env = False  # no proxies or netrc from the environment
            session.max_redirects = 0
            session.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
            session.headers = CaseInsensitiveDict({"Accept": "*/*", "Accept-Encoding": "identity"})
            adapter = PinnedAdapter(
                host.split("%", 1)[0],
                pool_connections=4,
                pool_maxsize=self._pool_maxsize,
            )
            session.mount("http://", adapter)
            session.mount("https://", adapter)
            origin = self._sessions[key] = _Origin(session)
            if len(self._sessions) > self._max_sessions:
                _, evicted = self._sessions.popitem(last=False)
        if evicted is not None:
            evicted.session.close()
        return origin

    def _route(self, origin: _Origin, method: str, url: str, ip: str, port: int) -> _Route:
        """The prepared route for this request, built by requests on first use.

        Raises what `requests` raises for a URL it cannot send to (classified by the caller).
        """
        key = (method, url, ip)
        route = origin.routes.get(key)
        if route is not None and route.open:
            return route
        pinned = _pinned_url(url, ip, port)
        session = origin.session
        prepared = session.prepare_request(requests.Request(method, pinned))
        adapter = cast(requests.adapters.HTTPAdapter, session.get_adapter(pinned))
        try:
            pool = cast(
                HTTPConnectionPool,
                adapter.get_connection_with_tls_context(prepared, self._verify, proxies={}),
            )
        except urllib3.exceptions.LocationValueError as exc:
            raise requests.exceptions.InvalidURL(exc) from exc
        adapter.cert_verify(pool, pinned, self._verify, None)
        template = dict(prepared.headers)
        authorization = template.pop("Authorization", None)
        template.pop("Content-Length", None)
        route = _Route(
            pool=pool,
            target=prepared.path_url,
            defaults=tuple(template.items()),
            authorization=authorization,
        )
        with self._lock:
            if len(origin.routes) >= MAX_ROUTES_PER_ORIGIN:
                origin.routes.clear()
            origin.routes[key] = route
        return route

    def _bounded_resolver(self, deadline: _Deadline) -> Resolver:
        """Wrap the resolver so a hanging DNS lookup cannot outlive the deadline."""

        def resolve(host: str, port: int) -> list[str]:
            future = self._dns.submit(self._resolver, host, port)
            try:
                return future.result(timeout=deadline.remaining())
            except FutureTimeout as exc:
                future.cancel()
                raise _ResolveTimeout(f"resolving {host} took too long") from exc

        return resolve

    def post(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        timeout_s: float,
        policy: GuardPolicy,
        connect_timeout_s: float = 5.0,
    ) -> HttpResult:
        """POST once within timeout_s overall; never raises for network problems."""
        return self.send("POST", url, body, headers, timeout_s, policy, connect_timeout_s)

    def send(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: dict[str, str],
        timeout_s: float,
        policy: GuardPolicy,
        connect_timeout_s: float = 5.0,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> HttpResult:
        """One request within timeout_s overall, to an address the guard checked, keeping at
        most `max_body_bytes` of the response; never raises for network problems.
        """
        started = time.monotonic()
        deadline = _Deadline(started + timeout_s)
        sent_headers = {k: v for k, v in headers.items() if k.lower() not in _OWNED_HEADERS}

        def result(
            error: str | None,
            detail: str | None = None,
            status: int | None = None,
            data: bytes = b"",
            request_headers: dict[str, str] | None = None,
            response_headers: dict[str, str] | None = None,
            truncated: bool = False,
        ) -> HttpResult:
            return HttpResult(
                status=status,
                body=data[:max_body_bytes],
                duration_ms=int((time.monotonic() - started) * 1000),
                error=error,
                request_headers=request_headers if request_headers is not None else sent_headers,
                response_headers=response_headers or {},
                error_detail=detail,
                truncated=truncated,
            )

        try:
            scheme, host, port = guard.split_url(url, policy)
            addresses = guard.check_host(host, port, policy, self._bounded_resolver(deadline))
        except guard.InvalidURL as exc:
            return result(ERROR_INVALID_URL, str(exc))
        except guard.BlockedAddress as exc:
            return result(ERROR_BLOCKED, exc.reason)
        except _ResolveTimeout as exc:
            return result(ERROR_TIMEOUT, str(exc))
        except OSError as exc:
            return result(ERROR_CONNECTION, str(exc))

        origin = self._origin(scheme, host, port)
        sent_headers["Host"] = _host_header(host, scheme, port)
        last: HttpResult | None = None
        for ip in addresses:
            if deadline.remaining() <= 0:
                break
            outcome, connect_failed = self._exchange(
                origin,
                method,
                url,
                ip,
                port,
                body,
                sent_headers,
                deadline,
                connect_timeout_s,
                max_body_bytes,
                result,
            )
            if not connect_failed:
                return outcome
            last = outcome
        if last is None:
            return result(ERROR_TIMEOUT, "deadline passed before connecting")
        if last.error != ERROR_TIMEOUT and deadline.remaining() <= 0:
            last.error = ERROR_TIMEOUT
        return last

    def _exchange(
        self,
        origin: _Origin,
        method: str,
        url: str,
        ip: str,
        port: int,
        body: bytes | None,
        headers: dict[str, str],
        budget: _Deadline,
        connect_timeout_s: float,
        max_body_bytes: int,
        result: Callable[..., HttpResult],
    ) -> tuple[HttpResult, bool]:
        """One try against one checked address: (result, whether it failed before sending)."""
        try:
            route = self._route(origin, method, url, ip, port)
            request_headers = route.headers(method, body, headers)
        except (requests.exceptions.RequestException, ValueError) as exc:
            return result(_classify(exc), str(exc)), False

        # A fresh watch per try (same wall-clock end), so a fallback address is watched too.
        deadline = _Deadline(budget.at)
        _current.deadline = deadline
        self._watchdog.arm(deadline)
        response: urllib3.BaseHTTPResponse | None = None
        try:
            remaining = deadline.remaining()
            if remaining <= 0:
                deadline.finish()
                late = result(ERROR_TIMEOUT, "deadline passed", request_headers=request_headers)
                return late, True
            try:
                response = route.pool.urlopen(
                    method,
                    route.target,
                    body=body or None,
                    headers=request_headers,
                    redirect=False,
                    assert_same_host=False,
                    preload_content=False,
                    decode_content=False,
                    retries=_NO_RETRIES,
                    chunked=False,
                    timeout=urllib3.Timeout(
                        connect=min(connect_timeout_s, remaining), read=remaining
                    ),
                )
            except _SEND_ERRORS as raw_exc:
                failure = _as_requests_error(raw_exc)
                fired = deadline.finish()
                send_error = ERROR_TIMEOUT if fired else _classify(failure)
                return (
                    result(send_error, str(failure), request_headers=request_headers),
                    not fired and _is_connect_failure(failure),
                )

            status = response.status
            answer = response.headers
            response_headers = {name.lower(): answer[name] for name in answer}
            data, complete, read_error = _read_capped(response, max_body_bytes)
            fired = deadline.finish()
            error: str | None = None
            detail: str | None = None
            if fired:
                error, detail = ERROR_TIMEOUT, "deadline passed while reading the response"
            elif read_error is not None:
                error, detail = _classify(read_error), str(read_error)
            if complete and error is None:
                response.release_conn()
            else:
                response.close()
                response.release_conn()
            response = None
            return (
                result(
                    error,
                    detail,
                    status,
                    data,
                    request_headers,
                    response_headers,
                    truncated=not complete and read_error is None,
                ),
                False,
            )
        finally:
            deadline.finish()
            _current.deadline = None
            if response is not None:
                response.close()
                response.release_conn()


def _read_capped(
    raw: urllib3.BaseHTTPResponse, limit: int
) -> tuple[bytes, bool, BaseException | None]:
    """Read at most `limit` bytes undecoded: (data, reached end of body, error if any)."""
    buf = bytearray()
    step = _READ_CHUNK if limit <= _LARGE_READ_CHUNK else _LARGE_READ_CHUNK
    try:
        while len(buf) <= limit:
            chunk = raw.read(step, decode_content=False)
            if not chunk:
                return bytes(buf[:limit]), True, None
            buf += chunk
    except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError, ValueError) as exc:
        return bytes(buf[:limit]), False, exc
    return bytes(buf[:limit]), False, None
