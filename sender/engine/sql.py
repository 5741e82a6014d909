"""Small SQL helpers shared by the claim and the recorder."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

from sqlalchemy import ColumnElement, Table, any_, bindparam
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session

# Ids per IN (...) list: well under every driver's parameter limit.
QUERY_CHUNK = 500


def table(model: Any) -> Table:
    """A model's Table, typed as one (the ORM types `__table__` as a FromClause)."""
    return cast(Table, model.__table__)


def chunks(items: Sequence[str], size: int = QUERY_CHUNK) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def ids_in(column: Any, name: str, postgres: bool) -> ColumnElement[bool]:
    """SQL: `column` is one of the list bound as `name`.

    On PostgreSQL `column = ANY(:name)`, one array parameter: the statement's text is the same
    for every list, so SQLAlchemy renders nothing per execution and psycopg prepares it (the
    server then skips its parse and plan), where an expanding IN list is rendered afresh, and
    is a new statement to the server, for every length. SQLite has no arrays: an IN list.
    """
    if postgres:
        return cast(
            ColumnElement[bool],
            column == any_(bindparam(name, type_=postgresql.ARRAY(column.type))),
        )
    return cast(ColumnElement[bool], column.in_(bindparam(name, expanding=True)))


def transient(exc: BaseException) -> bool:
    """Deadlocks, lost connections, a locked SQLite: worth retrying as they are."""
    return isinstance(exc, OperationalError) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    )


def insert_for(session: Session) -> Any:
    """The dialect's INSERT, which knows ON CONFLICT."""
    return insert_for_dialect(session.get_bind().dialect.name)


def insert_for_dialect(name: str) -> Any:
    """The INSERT of the dialect called `name`, for statements built once per dialect."""
    return postgresql.insert if name == "postgresql" else sqlite.insert
