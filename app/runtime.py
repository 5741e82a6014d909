"""A process's handles on its stores: settings, database, Redis and the secret box.

Every face (api, worker, scheduler, CLI) builds one Runtime at start, saying which kind of
process it is: its pools are sized by that kind's budget (app/budget.py) and its connections
named after it. RQ jobs receive only primitive ids, so they find the worker's Runtime through
`current()`.
"""

from __future__ import annotations

import threading
from functools import cached_property

import redis

from app import redis_client
from app.budget import Budget, ProcessKind, application_name, budget_for
from app.config import Settings, load_settings
from app.crypto import SecretBox, load_secret_box
from app.db import Database

REDIS_SOCKET_TIMEOUT_S = 5.0


class Runtime:
    """Lazily opened connections; cheap to build, safe to share between threads."""

    def __init__(
        self,
        settings: Settings,
        *,
        kind: ProcessKind = ProcessKind.EMBEDDED,
        database: Database | None = None,
    ) -> None:
        self.settings = settings
        self.kind = kind
        self.budget: Budget = budget_for(settings, kind)
        self._database = database

    @property
    def name(self) -> str:
        """What this process calls itself to PostgreSQL and Redis (`kurir-<kind>`)."""
        return application_name(self.kind)

    @cached_property
    def db(self) -> Database:
        if self._database is not None:
            return self._database
        return Database(
            self.settings.resolved_database_url,
            pool_size=self.budget.postgres,
            pool_timeout_s=self.settings.db_pool_timeout_s,
            application_name=self.name,
        )

    @cached_property
    def redis(self) -> redis.Redis:
        return redis_client.connect(
            self.settings.resolved_redis_url,
            socket_timeout=REDIS_SOCKET_TIMEOUT_S,
            socket_connect_timeout=REDIS_SOCKET_TIMEOUT_S,
            health_check_interval=30,
            client_name=self.name,
            max_connections=self.budget.redis_pool,
            pool_timeout_s=self.settings.db_pool_timeout_s,
        )

    @cached_property
    def secret_box(self) -> SecretBox:
        return load_secret_box(self.settings.secret_key, self.settings.data_dir)

    def close(self) -> None:
        if "db" in self.__dict__ and self._database is None:
            self.db.dispose()
        if "redis" in self.__dict__:
            self.redis.close()


_current: Runtime | None = None
_lock = threading.Lock()


def install(runtime: Runtime) -> None:
    """Make `runtime` the one `current()` returns in this process (workers, tests)."""
    global _current
    with _lock:
        _current = runtime


def current() -> Runtime:
    """The process's Runtime, built from the environment on first use."""
    global _current
    with _lock:
        if _current is None:
            _current = Runtime(load_settings())
        return _current
