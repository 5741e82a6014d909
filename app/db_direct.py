"""Core statements run on the driver: compiled once, executed on a pooled connection in
autocommit, for the hot paths whose whole write is one atomic statement (a publish, a
partner's callback).

Through SQLAlchemy's `Connection` a statement costs the client more CPU than its round trip:
the compiled-cache lookup, `construct_params`, the execution context, the result object, and
an autocommit checkout that switches the connection's isolation level and back. Measured
in-process, the publish statement run here cost ~0.25 ms less (docs/benchmarks.md, "Where a
publish's time goes"). What SQLAlchemy does that matters is kept: the statement is SQLAlchemy
Core compiled by the engine's own dialect, with its bind and result processors (UTC times,
JSON); the connection comes from the engine's pool, so its checkout events run (the ping
after idle, app/db.py); a disconnect invalidates the connection; and every driver error is
raised as SQLAlchemy's (`sqlalchemy.exc.DBAPIError` and its subclasses), so callers catch
what they always caught.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

from sqlalchemy import Engine
from sqlalchemy import exc as sa_exc
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

Processor = Callable[[Any], Any]


class DirectStatement:
    """One statement, compiled for `engine`'s dialect; `rows` runs it in autocommit."""

    def __init__(self, statement: ClauseElement, engine: Engine) -> None:
        dialect = engine.dialect
        compiled = cast(SQLCompiler, statement.compile(dialect=dialect))
        self.engine = engine
        self.sql = compiled.string
        self._binds: dict[str, Processor] = {}
        for key, bind in compiled.binds.items():
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None:
                self._binds[key] = processor
        columns = getattr(statement, "exported_columns", ())
        self._results: list[Processor | None] = [
            column.type.dialect_impl(dialect).result_processor(dialect, None) for column in columns
        ]

    def rows(self, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Every row the statement returns, its values processed as SQLAlchemy would.

        Raises:
            sqlalchemy.exc.DBAPIError: what the driver raised, as SQLAlchemy raises it
                (OperationalError, IntegrityError, …); `connection_invalidated` on a
                disconnect, after which the pool no longer hands that connection out.
        """
        binds = self._binds
        args = {
            key: (binds[key](value) if key in binds else value) for key, value in params.items()
        }
        engine = self.engine
        try:
            proxied = engine.raw_connection()
        except engine.dialect.loaded_dbapi.Error as exc:
            # A new connection that could not be made (the server gone): raised as
            # `engine.connect()` raises it, so callers' handling of an unreachable store holds.
            raise sa_exc.DBAPIError.instance(
                None,
                None,
                exc,
                engine.dialect.loaded_dbapi.Error,
                hide_parameters=True,
                connection_invalidated=True,
                dialect=engine.dialect,
            ) from exc
        try:
            driver: Any = proxied.driver_connection
            try:
                driver.autocommit = True
                fetched = driver.execute(self.sql, args).fetchall()
            except engine.dialect.loaded_dbapi.Error as exc:
                raise self._translated(exc, proxied, args) from exc
        finally:
            _give_back(proxied)
        if not any(self._results):
            return fetched
        processors = self._results
        return [
            tuple(p(v) if p is not None else v for p, v in zip(processors, row, strict=False))
            for row in fetched
        ]

    def _translated(self, exc: Any, proxied: Any, args: dict[str, Any]) -> Exception:
        dialect = self.engine.dialect
        invalidated = dialect.is_disconnect(exc, proxied.dbapi_connection, None)
        if invalidated:
            proxied.invalidate(exc)
        return sa_exc.DBAPIError.instance(
            self.sql,
            args,
            exc,
            dialect.loaded_dbapi.Error,
            hide_parameters=True,
            connection_invalidated=invalidated,
            dialect=dialect,
        )


def _give_back(proxied: Any) -> None:
    """Back to the pool in transaction mode, as the pool hands connections out; one that
    cannot be switched back (broken) is invalidated instead of pooled."""
    if proxied.is_valid:
        try:
            proxied.driver_connection.autocommit = False
        except Exception as exc:
            proxied.invalidate(exc)
    proxied.close()
