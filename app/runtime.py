"""A process's handles on its stores: settings, database, Redis and the secret box.

Every face (api, worker, scheduler, CLI) builds one Runtime at start. RQ jobs receive only
primitive ids, so they find the worker's Runtime through `current()`.
"""

from __future__ import annotations

import threading
from functools import cached_property

import redis

from app import redis_client
from app.config import Settings, load_settings
from app.crypto import SecretBox, load_secret_box
from app.db import Database

REDIS_SOCKET_TIMEOUT_S = 5.0


class Runtime:
    """Lazily opened connections; cheap to build, safe to share between threads."""

    def __init__(self, settings: Settings, *, database: Database | None = None) -> None:
        self.settings = settings
        self._database = database

    @cached_property
    def db(self) -> Database:
        if self._database is not None:
            return self._database
        pool = max(10, self.settings.worker_threads + 2)
        return Database(self.settings.resolved_database_url, pool_size=pool)

    @cached_property
    def redis(self) -> redis.Redis:
        return redis_client.connect(
            self.settings.resolved_redis_url,
            socket_timeout=REDIS_SOCKET_TIMEOUT_S,
            socket_connect_timeout=REDIS_SOCKET_TIMEOUT_S,
            health_check_interval=30,
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
