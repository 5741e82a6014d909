"""`kurir doctor`'s checks: a fleet's connection budget against what the servers allow.

The budget (app/budget.py) says what each kind of process opens at most; this module asks
PostgreSQL for `max_connections` less the connections reserved for superusers, Redis for
`maxclients`, and both for the connections Kurir's processes hold now (by their names), and
says whether the fleet fits.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from app import redis_client
from app.budget import Fleet, ProcessKind, application_name, fleet, postgres_room
from app.config import Settings
from app.db import prepare_threshold_of

PROBE_TIMEOUT_S = 5
NAME_PREFIX = "kurir-"


class StoreUnreachable(Exception):
    """A store could not be asked; the message says which and why."""

    def __init__(self, store: str, reason: str) -> None:
        super().__init__(f"{store} is unreachable: {reason}")
        self.store = store
        self.reason = reason


@dataclass(frozen=True)
class PostgresLimits:
    max_connections: int
    reserved: int  # superuser_reserved_connections (+ reserved_connections, PostgreSQL 16+)
    in_use: dict[str, int]  # connections now, by kind, named kurir-<kind>

    @property
    def room(self) -> int:
        return postgres_room(self.max_connections, self.reserved)


@dataclass(frozen=True)
class RedisLimits:
    maxclients: int
    in_use: dict[str, int]


def _by_kind(names: list[str]) -> dict[str, int]:
    counts = Counter(name[len(NAME_PREFIX) :] for name in names if name.startswith(NAME_PREFIX))
    return dict(sorted(counts.items()))


_PG_LIMITS = text(
    "SELECT current_setting('max_connections')::int, "
    "current_setting('superuser_reserved_connections')::int, "
    "coalesce(current_setting('reserved_connections', true), '0')::int"
)
_PG_IN_USE = text(
    "SELECT application_name FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


def postgres_limits(settings: Settings) -> PostgresLimits | None:
    """PostgreSQL's limits and Kurir's connections now; None on SQLite (no server).

    Raises:
        StoreUnreachable: the server does not answer.
    """
    if settings.is_sqlite:
        return None
    url, connect_args = prepare_threshold_of(settings.resolved_database_url)
    connect_args |= {
        "connect_timeout": PROBE_TIMEOUT_S,
        "application_name": application_name(ProcessKind.CLI),
    }
    engine = create_engine(url, poolclass=NullPool, connect_args=connect_args)
    try:
        with engine.connect() as connection:
            max_connections, superuser, reserved = connection.execute(_PG_LIMITS).one()
            names = [row[0] or "" for row in connection.execute(_PG_IN_USE)]
    except Exception as exc:
        raise StoreUnreachable("PostgreSQL", _first_line(exc)) from None
    finally:
        engine.dispose()
    return PostgresLimits(max_connections, superuser + reserved, _by_kind(names))


def redis_limits(settings: Settings) -> RedisLimits:
    """Redis's `maxclients` and Kurir's connections now.

    Raises:
        StoreUnreachable: the server does not answer.
    """
    client = redis_client.connect(
        settings.resolved_redis_url,
        socket_timeout=PROBE_TIMEOUT_S,
        socket_connect_timeout=PROBE_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
        client_name=application_name(ProcessKind.CLI),
    )
    try:
        try:
            configured: Any = client.config_get("maxclients")["maxclients"]
        except redis.ResponseError:  # CONFIG renamed or refused (managed Redis)
            configured = client.info("clients")["maxclients"]
        maxclients = int(configured)
        names = [entry.get("name", "") for entry in client.client_list()]
    except (redis.RedisError, OSError, KeyError) as exc:
        raise StoreUnreachable("Redis", _first_line(exc)) from None
    finally:
        client.close()
    return RedisLimits(maxclients, _by_kind(names))


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


@dataclass(frozen=True)
class Report:
    fleet: Fleet
    postgres: PostgresLimits | None  # None on SQLite
    redis: RedisLimits | None  # None when unreachable
    unreachable: tuple[StoreUnreachable, ...]
    sqlite: bool

    @property
    def postgres_over(self) -> bool:
        return self.postgres is not None and self.fleet.postgres > self.postgres.room

    @property
    def redis_over(self) -> bool:
        return self.redis is not None and self.fleet.redis > self.redis.maxclients

    @property
    def exit_code(self) -> int:
        """2: a store did not answer; 1: the fleet needs more than a server allows; 0: fits."""
        if self.unreachable:
            return 2
        return 1 if self.postgres_over or self.redis_over else 0

    def as_json(self) -> dict[str, Any]:
        postgres: dict[str, Any] | None = None
        if self.postgres is not None:
            postgres = {
                "max_connections": self.postgres.max_connections,
                "reserved": self.postgres.reserved,
                "available": self.postgres.room,
                "in_use": self.postgres.in_use,
                "over_budget": self.postgres_over,
            }
        redis_part: dict[str, Any] | None = None
        if self.redis is not None:
            redis_part = {
                "maxclients": self.redis.maxclients,
                "in_use": self.redis.in_use,
                "over_budget": self.redis_over,
            }
        return {
            "kinds": [
                {
                    "kind": line.budget.kind.value,
                    "count": line.count,
                    "processes_each": line.budget.processes,
                    "postgres_per_process": line.budget.postgres,
                    "redis_per_process": line.budget.redis,
                    "postgres": line.postgres,
                    "redis": line.redis,
                }
                for line in self.fleet.lines
            ],
            "total": {"postgres": self.fleet.postgres, "redis": self.fleet.redis},
            "database": "sqlite" if self.sqlite else "postgresql",
            "postgresql": postgres,
            "redis": redis_part,
            "unreachable": [{"store": u.store, "reason": u.reason} for u in self.unreachable],
            "exit_code": self.exit_code,
        }


def check(settings: Settings, counts: dict[ProcessKind, int]) -> Report:
    """The fleet of `counts` under `settings`, against both servers."""
    unreachable: list[StoreUnreachable] = []
    postgres: PostgresLimits | None = None
    redis_part: RedisLimits | None = None
    try:
        postgres = postgres_limits(settings)
    except StoreUnreachable as exc:
        unreachable.append(exc)
    try:
        redis_part = redis_limits(settings)
    except StoreUnreachable as exc:
        unreachable.append(exc)
    return Report(
        fleet(settings, counts), postgres, redis_part, tuple(unreachable), settings.is_sqlite
    )
