"""REDIS_URL forms: the Sentinel URL's parts, and the kind of client each form makes."""

from __future__ import annotations

import pytest
import redis.backoff
from redis.connection import SSLConnection
from redis.sentinel import SentinelConnectionPool

from app.redis_client import (
    DEFAULT_SENTINEL_PORT,
    MasterConnection,
    MasterSSLConnection,
    RedisUrlError,
    SentinelMasterRedis,
    SentinelTarget,
    check_url,
    connect,
    parse_sentinel_url,
    redact,
)


def test_a_sentinel_url_names_the_sentinels_the_master_and_the_db() -> None:
    target = parse_sentinel_url("redis+sentinel://s1:26380,s2,10.0.0.3:26381/kurir/3")
    assert target == SentinelTarget(
        sentinels=(("s1", 26380), ("s2", DEFAULT_SENTINEL_PORT), ("10.0.0.3", 26381)),
        master="kurir",
        db=3,
    )


def test_credentials_are_the_masters_and_percent_decoded() -> None:
    target = parse_sentinel_url("redis+sentinel://app:p%40ss%3Aword@s1/main")
    assert (target.username, target.password, target.db) == ("app", "p@ss:word", 0)
    only_password = parse_sentinel_url("redis+sentinel://:secret@s1/main")
    assert (only_password.username, only_password.password) == (None, "secret")


def test_ipv6_sentinels_and_tls() -> None:
    target = parse_sentinel_url("rediss+sentinel://[::1]:26379,[fe80::2]/m%20x")
    assert target.sentinels == (("::1", 26379), ("fe80::2", DEFAULT_SENTINEL_PORT))
    assert (target.master, target.ssl) == ("m x", True)


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("redis+sentinel://s1:26379", "names no master"),
        ("redis+sentinel://s1:26379/", "names no master"),
        ("redis+sentinel:///kurir", "names no sentinel"),
        ("redis+sentinel://user:pw@/kurir", "names no sentinel"),
        ("redis+sentinel://s1,,s2/kurir", "has no host"),
        ("redis+sentinel://:26379/kurir", "has no host"),
        ("redis+sentinel://s1:x/kurir", "no valid port"),
        ("redis+sentinel://s1:0/kurir", "no valid port"),
        ("redis+sentinel://s1:65536/kurir", "no valid port"),
        ("redis+sentinel://[::1]x/kurir", "is not host:port"),
        ("redis+sentinel://[::1/kurir", "not a valid URL"),
        ("redis+sentinel://s1/kurir/db1", "path must be"),
        ("redis+sentinel://s1/kurir/0/1", "path must be"),
        ("redis+sentinel://s1/kurir?db=1", "no ?options"),
        ("redis+sentinel://s1/kurir#x", "no ?options"),
    ],
)
def test_malformed_sentinel_urls_say_what_is_wrong(url: str, complaint: str) -> None:
    with pytest.raises(RedisUrlError, match=complaint.replace("?", r"\?")):
        check_url(url)


@pytest.mark.parametrize("url", ["http://h:6379", "redis:/h", "sentinel://s1/kurir", "h:6379"])
def test_other_schemes_are_refused(url: str) -> None:
    with pytest.raises(RedisUrlError, match="must be a redis://"):
        check_url(url)


def test_plain_urls_pass_and_keepalive_is_left_off_unix_sockets() -> None:
    for url in ("redis://h:6379/0", "rediss://u:p@h/1", "unix:///run/redis.sock?db=2"):
        check_url(url)
    unix = connect(
        "unix:///run/redis.sock", socket_timeout=1, socket_connect_timeout=1, keepalive=True
    )
    tcp = connect("redis://h:6379/0", socket_timeout=1, socket_connect_timeout=1, keepalive=True)
    try:
        assert "socket_keepalive" not in unix.connection_pool.connection_kwargs
        assert tcp.connection_pool.connection_kwargs["socket_keepalive"] is True
    finally:
        unix.close()
        tcp.close()


def test_a_sentinel_url_makes_a_master_client_that_asks_the_sentinels() -> None:
    """Nothing is contacted until the first command; the client's pool finds the master."""
    client = connect(
        "redis+sentinel://:pw@s1:26380,s2/kurir/4",
        socket_timeout=5,
        socket_connect_timeout=5,
        keepalive=True,
    )
    try:
        assert isinstance(client, SentinelMasterRedis)
        pool = client.connection_pool
        assert isinstance(pool, SentinelConnectionPool)
        assert (pool.service_name, pool.is_master) == ("kurir", True)
        # Reconnects ask the sentinels again (see test_redis_sentinel.py for why it matters).
        assert pool.connection_class is MasterConnection
        kwargs = pool.connection_kwargs
        assert (kwargs["db"], kwargs["password"], kwargs["socket_timeout"]) == (4, "pw", 5)
        assert kwargs["retry"].get_retries() == 3  # a READONLY reply is retried on the new master
        addresses = [
            (
                s.connection_pool.connection_kwargs["host"],
                s.connection_pool.connection_kwargs["port"],
            )
            for s in pool.sentinel_manager.sentinels
        ]
        assert addresses == [("s1", 26380), ("s2", 26379)]
        # Sentinels are asked without the master's password, and briefly.
        sentinel_kwargs = pool.sentinel_manager.sentinels[0].connection_pool.connection_kwargs
        assert sentinel_kwargs.get("password") is None
        assert sentinel_kwargs["socket_timeout"] == 1.0
    finally:
        client.close()


def test_rediss_sentinel_talks_tls_to_the_master_and_the_sentinels() -> None:
    client = connect("rediss+sentinel://s1/kurir", socket_timeout=5, socket_connect_timeout=5)
    try:
        pool = client.connection_pool
        assert pool.connection_class is MasterSSLConnection
        assert "ssl" not in pool.connection_kwargs
        sentinel = pool.sentinel_manager.sentinels[0].connection_pool
        assert issubclass(sentinel.connection_class, SSLConnection)
    finally:
        client.close()


def test_redact_hides_only_the_password() -> None:
    assert (
        redact("redis+sentinel://app:secret@s1,s2/kurir") == "redis+sentinel://app:***@s1,s2/kurir"
    )
    assert redact("redis+sentinel://s1/kurir") == "redis+sentinel://s1/kurir"
    assert redact("redis://user@h/0") == "redis://user@h/0"


def test_every_client_retries_three_times_after_short_pauses(monkeypatch) -> None:
    """A retry mends a dropped connection, whatever the transport. While Redis is down each
    command must fail soon (a publish's enqueue is left to the sweeper), not after
    redis-py's own pauses of up to 2, 4 and 8 seconds."""
    monkeypatch.setattr(redis.backoff.random, "random", lambda: 1.0)  # the longest jitter
    for url in ("redis://h:6379/0", "unix:///run/redis.sock"):
        client = connect(url, socket_timeout=1, socket_connect_timeout=1)
        try:
            retry = client.connection_pool.connection_kwargs["retry"]
            assert retry.get_retries() == 3
            pauses = [retry._backoff.compute(failures) for failures in (1, 2, 3)]
            assert pauses == sorted(pauses) and sum(pauses) <= 0.2, pauses
        finally:
            client.close()
