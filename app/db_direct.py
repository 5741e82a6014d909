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

from collections import namedtuple
from collections.abc import Callable, Mapping
from typing import Any, cast

from sqlalchemy import Engine
from sqlalchemy import exc as sa_exc
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

Processor = Callable[[Any], Any]


class DirectStatement:
    """One statement, compiled for `engine`'s dialect; `rows`, `records` and `run` run it in
    autocommit."""

    def __init__(self, statement: ClauseElement, engine: Engine) -> None:
        dialect = engine.dialect
        compiled = cast(SQLCompiler, statement.compile(dialect=dialect))
        self.engine = engine
        self.sql = compiled.string
        self._binds: dict[str, Processor] = {}
        # By the names the SQL renders (an anonymous parameter's is made at compile time).
        names = compiled.bind_names
        for bind, key in names.items():
            if bind.expanding:
                raise ValueError(f"{key}: an expanding IN list is rendered per execution")
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None:
                self._binds[key] = processor
        # The values the statement carries itself (`state == 'pending'`), processed once.
        values = compiled.construct_params(_check=False)
        self._fixed: dict[str, Any] = {
            key: self._binds[key](values[key]) if key in self._binds else values[key]
            for bind, key in names.items()
            if not bind.required
        }
        columns = getattr(statement, "exported_columns", ())
        self._results: list[Processor | None] = [
            column.type.dialect_impl(dialect).result_processor(dialect, None) for column in columns
        ]
        # `records` rows: named by the columns' keys (labels), as SQLAlchemy's rows are.
        self._record: Any = namedtuple(  # type: ignore[misc]
            "Record", [str(column.key) for column in columns], rename=True
        )

    def rows(self, params: Mapping[str, Any], held: Held | None = None) -> list[tuple[Any, ...]]:
        """Every row the statement returns, its values processed as SQLAlchemy would; run on
        `held`'s connection when given.

        Raises:
            sqlalchemy.exc.DBAPIError: what the driver raised, as SQLAlchemy raises it
                (OperationalError, IntegrityError, …); `connection_invalidated` on a
                disconnect, after which the pool no longer hands that connection out.
        """
        fetched = self._call(params, fetch=True, held=held)
        if not any(self._results):
            return fetched
        processors = self._results
        return [
            tuple(p(v) if p is not None else v for p, v in zip(processors, row, strict=False))
            for row in fetched
        ]

    def records(self, params: Mapping[str, Any], held: Held | None = None) -> list[Any]:
        """`rows`, each a named tuple whose fields are the statement's column names (read
        as `row.id`, as from SQLAlchemy's rows)."""
        make = self._record._make
        return [make(row) for row in self.rows(params, held)]

    def run(self, params: Mapping[str, Any], held: Held | None = None) -> int:
        """Run a statement that returns no rows; the driver's row count. Raises as `rows`."""
        return int(self._call(params, fetch=False, held=held))

    def _call(self, params: Mapping[str, Any], *, fetch: bool, held: Held | None) -> Any:
        """The statement run once in autocommit, on `held`'s connection or on one checked out
        of the pool for it: its rows with `fetch`, else its row count."""
        binds = self._binds
        args = dict(self._fixed)
        args.update(
            (key, binds[key](value) if key in binds else value) for key, value in params.items()
        )
        proxied = held.connection(self.engine) if held is not None else _checkout(self.engine)
        try:
            driver: Any = proxied.driver_connection
            try:
                if held is None:
                    driver.autocommit = True
                cursor = driver.execute(self.sql, args)
                return cursor.fetchall() if fetch else cursor.rowcount
            except self.engine.dialect.loaded_dbapi.Error as exc:
                raise self._translated(exc, proxied, args, held) from exc
        finally:
            if held is None:
                _give_back(proxied)

    def _translated(
        self, exc: Any, proxied: Any, args: dict[str, Any], held: Held | None
    ) -> Exception:
        dialect = self.engine.dialect
        invalidated = dialect.is_disconnect(exc, proxied.dbapi_connection, None)
        if invalidated:
            proxied.invalidate(exc)
            if held is not None:
                held.release()
        return sa_exc.DBAPIError.instance(
            self.sql,
            args,
            exc,
            dialect.loaded_dbapi.Error,
            hide_parameters=True,
            connection_invalidated=invalidated,
            dialect=dialect,
        )


class Held:
    """One pooled connection kept checked out, in autocommit, across the statements of one
    caller that runs them one after another (the engine's claim, under its lock; the writer
    thread), and given back (`release`) when that caller goes idle and before it opens a
    transaction, so that it never holds two of its process's budget.

    At a trickle every claim and every flush is a statement of its own, and a checkout and a
    checkin around each cost more CPU than the statement's own client work (the pool's
    bookkeeping and events, the driver's switch to autocommit and back). Not thread-safe:
    one caller at a time. A disconnect gives the connection up (invalidated); the next
    statement checks out a new one, as does a statement for another engine (a runtime's
    database can be replaced, in tests and embedded use).
    """

    def __init__(self) -> None:
        self._engine: Engine | None = None
        self._proxied: Any = None

    def connection(self, engine: Engine) -> Any:
        """The held connection to `engine`, checked out (and switched to autocommit) when
        none is."""
        if self._proxied is not None and self._engine is not engine:
            self.release()
        if self._proxied is None:
            proxied = _checkout(engine)
            try:
                proxied.driver_connection.autocommit = True
            except Exception:
                _give_back(proxied)
                raise
            self._proxied, self._engine = proxied, engine
        return self._proxied

    @property
    def holding(self) -> bool:
        return self._proxied is not None

    def release(self) -> None:
        """Back to the pool (after a disconnect, the invalidated connection is dropped)."""
        proxied, self._proxied = self._proxied, None
        if proxied is not None:
            _give_back(proxied)


def _checkout(engine: Engine) -> Any:
    """A pooled connection; a new one that could not be made (the server gone) raises as
    `engine.connect()` raises it, so callers' handling of an unreachable store holds."""
    try:
        return engine.raw_connection()
    except engine.dialect.loaded_dbapi.Error as exc:
        raise sa_exc.DBAPIError.instance(
            None,
            None,
            exc,
            engine.dialect.loaded_dbapi.Error,
            hide_parameters=True,
            connection_invalidated=True,
            dialect=engine.dialect,
        ) from exc


def _give_back(proxied: Any) -> None:
    """Back to the pool in transaction mode, as the pool hands connections out; one that
    cannot be switched back (broken) is invalidated instead of pooled."""
    if proxied.is_valid:
        try:
            proxied.driver_connection.autocommit = False
        except Exception as exc:
            proxied.invalidate(exc)
    proxied.close()
