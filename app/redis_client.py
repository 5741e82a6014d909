"""The one place a Redis client is made from `REDIS_URL`.

Plain URLs (`redis://`, `rediss://`, `unix://`) go to redis-py's `from_url`. A Sentinel URL,

    redis+sentinel://[[user]:password@]host[:port][,host[:port]…]/<master>[/<db>]

(`rediss+sentinel://` for TLS to the sentinels and the master), names the sentinels to ask
and the master group they watch; the client returned asks them where the master is before
each new connection, and again whenever the server it talks to stops being the master (a
failover), so the API, the workers and the scheduler follow a failover without a restart.
Credentials in the URL are the master's; the sentinels are asked without a password.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.connection import SSLConnection
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection

PLAIN_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379
# A sentinel answers "where is the master" from memory: a slow or dead one is skipped for the
# next sooner than a data command would be given up on.
SENTINEL_TIMEOUT_S = 1.0


class RedisUrlError(ValueError):
    """A REDIS_URL that cannot be used; the message says what is wrong with it."""


@dataclass(frozen=True)
class SentinelTarget:
    """What a Sentinel URL says: whom to ask, for which master, and how to talk to it."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    ssl: bool = False


def is_sentinel_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in SENTINEL_SCHEMES


def redact(url: str) -> str:
    """`url` with the password hidden, for messages."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, hosts = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{hosts}"


def check_url(url: str) -> None:
    """Raise RedisUrlError unless `url` is a Redis URL Kurir can connect with."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in SENTINEL_SCHEMES:
        parse_sentinel_url(url)
    elif scheme not in PLAIN_SCHEMES:
        raise RedisUrlError(
            "must be a redis://, rediss://, unix:// or redis+sentinel://host:port,…/<master> URL"
        )


def parse_sentinel_url(url: str) -> SentinelTarget:
    """The sentinels, master name, db and credentials of a `redis+sentinel://` URL."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. an unbalanced [ in an IPv6 host
        raise RedisUrlError(f"is not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in SENTINEL_SCHEMES:
        raise RedisUrlError(f"is not a Sentinel URL (scheme {parts.scheme!r})")
    if parts.query or parts.fragment:
        raise RedisUrlError("a Sentinel URL takes no ?options or #fragment")
    username, password, hosts = _credentials(parts)
    sentinels = tuple(_host_port(item) for item in hosts.split(","))
    segments = parts.path.split("/")[1:] if parts.path else []
    if not segments or not segments[0]:
        raise RedisUrlError("names no master: add /<master name> after the sentinels")
    if len(segments) > 2 or (len(segments) == 2 and not segments[1].isdigit()):
        raise RedisUrlError("path must be /<master name> or /<master name>/<db number>")
    return SentinelTarget(
        sentinels=sentinels,
        master=unquote(segments[0]),
        db=int(segments[1]) if len(segments) == 2 else 0,
        username=username,
        password=password,
        ssl=scheme == "rediss+sentinel",
    )


def _credentials(parts: SplitResult) -> tuple[str | None, str | None, str]:
    """(username, password, the host list) from the URL's authority."""
    userinfo, _, hosts = parts.netloc.rpartition("@")
    if not hosts:
        raise RedisUrlError("names no sentinel: expected host:port[,host:port…]")
    if not userinfo:
        return None, None, hosts
    user, colon, secret = userinfo.partition(":")
    return unquote(user) or None, unquote(secret) if colon else None, hosts


def _host_port(item: str) -> tuple[str, int]:
    """One `host[:port]` of the sentinel list; `[v6 address]:port` too."""
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else rest
        if not host or (rest and not rest.startswith(":")):
            raise RedisUrlError(f"sentinel {item!r} is not host:port")
    else:
        host, _, port_text = item.partition(":")
    if not host:
        raise RedisUrlError(f"sentinel {item!r} has no host")
    if not port_text:
        return host, DEFAULT_SENTINEL_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise RedisUrlError(f"sentinel {item!r} has no valid port")
    return host, int(port_text)


class MasterConnection(SentinelManagedConnection):
    """A connection to whichever server the sentinels name as master, asked anew every time
    it (re)connects.

    redis-py asks them only when the pool hands a connection out: a connection that breaks
    in the middle of a command (the demoted master's READONLY, or its connections killed by
    the sentinels) is reopened by the command's retries to the same old address, so every
    retry meets the demoted master again and the command fails after all its backoffs
    (redis/redis-py#3874). Reconnecting through `connect()` makes the first retry land on
    the new master.
    """

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self._sock:
            self.connect()
        super().send_packed_command(command, check_health=check_health)


class MasterSSLConnection(MasterConnection, SSLConnection):
    """`MasterConnection` over TLS (`rediss+sentinel://`)."""


class SentinelMasterRedis(redis.Redis):
    """The client `master_for` returns; closing it also closes its clients of the sentinels,
    which redis-py leaves open (they belong to the `Sentinel`, not to the client)."""

    def close(self) -> None:
        super().close()
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        if isinstance(manager, Sentinel):
            manager.close()


# The longest pause before a retry, and the first one's scale (doubling after each).
RETRY_BACKOFF_CAP_S = 0.1
RETRY_BACKOFF_BASE_S = 0.01


def default_retry() -> Retry:
    """3 retries, as redis-py gives a plain client over TCP; a Unix socket client (`kurir
    up`'s embedded Redis) and a Sentinel client get none by default. Every Kurir client
    gets these unless told otherwise, so a dropped connection is made again under the same
    command whatever the transport, and the command that meets a demoted master (READONLY)
    is retried on the new one (the sentinels name it before the old one is demoted).

    Pauses of at most 0.02, 0.04 and 0.08 s, not redis-py's (up to 2, 4 and 8 s): a retry
    here mends a dropped connection, and waiting longer mends nothing. While Redis is down
    every command would otherwise wait seconds before it fails: a publish or a callback,
    whose job the sweeper enqueues later anyway, answered 202 after 7 s on average."""
    return Retry(
        ExponentialWithJitterBackoff(cap=RETRY_BACKOFF_CAP_S, base=RETRY_BACKOFF_BASE_S), 3
    )


def connect(
    url: str,
    *,
    socket_timeout: float,
    socket_connect_timeout: float,
    health_check_interval: int = 0,
    keepalive: bool = False,
    retry: Retry | None = None,
    client_name: str | None = None,
    max_connections: int | None = None,
    pool_timeout_s: float | None = None,
) -> redis.Redis:
    """A client for `url` (any form `check_url` accepts) with these socket settings.

    `keepalive` turns on TCP keepalive (long blocking reads); a Unix socket takes none.
    `retry` replaces the default retry policy (fail-fast side channels pass `Retry(…, 0)`).
    `client_name` names every connection (`CLIENT SETNAME`, seen in `CLIENT LIST`).
    `max_connections` caps the client's pool: with a plain URL a thread that finds them all
    in use waits up to `pool_timeout_s` (default: the socket timeout), then gets
    `redis.ConnectionError`; with a Sentinel URL it gets the error at once.
    """
    options: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": socket_connect_timeout,
        "health_check_interval": health_check_interval,
    }
    options["retry"] = retry if retry is not None else default_retry()
    if client_name is not None:
        options["client_name"] = client_name
    if not is_sentinel_url(url):
        if keepalive and not url.startswith("unix://"):
            options["socket_keepalive"] = True
        if max_connections is None:
            return redis.Redis.from_url(url, **options)
        pool = redis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=socket_timeout if pool_timeout_s is None else pool_timeout_s,
            **options,
        )
        capped = redis.Redis(connection_pool=pool)
        capped.auto_close_connection_pool = True
        return capped
    if max_connections is not None:
        options["max_connections"] = max_connections
    target = parse_sentinel_url(url)
    if keepalive:
        options["socket_keepalive"] = True
    sentinel = Sentinel(
        list(target.sentinels),
        sentinel_kwargs={
            "socket_timeout": min(socket_timeout, SENTINEL_TIMEOUT_S),
            "socket_connect_timeout": min(socket_connect_timeout, SENTINEL_TIMEOUT_S),
            "ssl": target.ssl,
        },
    )
    client: redis.Redis = sentinel.master_for(
        target.master,
        redis_class=SentinelMasterRedis,
        connection_class=MasterSSLConnection if target.ssl else MasterConnection,
        db=target.db,
        username=target.username,
        password=target.password,
        **options,
    )
    return client
