"""Foreign-key triggers skipped for the rest of a PostgreSQL transaction, where the role may.

Retention deletes a row's children itself, in foreign-key order, with the rows locked so that
nothing new can refer to them meanwhile, and puts kept rows back unchanged with their parents
while the tables they refer to are locked. The checks and cascades those writes would fire
can then find nothing, yet they cost most of the write: a deleted event's cascade probes
`deliveries` on every daily partition (0.09 ms an event with 18 partitions, nine tenths of
the delete), a put-back row's check looks its parent up again.

`session_replication_role = replica` turns them off; only a superuser may set it, or on
PostgreSQL 15 a role granted `SET ON PARAMETER session_replication_role`. Without the right
the triggers fire, as for any write: both ways are correct, one is cheaper.
"""

from __future__ import annotations

from psycopg.errors import InsufficientPrivilege
from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError


def skip(connection: Connection) -> bool:
    """Skip them until `restore` or the end of the transaction; whether the role could."""
    try:
        with connection.begin_nested():
            connection.execute(text("SET LOCAL session_replication_role = replica"))
    except DBAPIError as exc:
        if not isinstance(exc.orig, InsufficientPrivilege):
            raise
        return False
    return True


def restore(connection: Connection) -> None:
    """Fire them again for the rest of the transaction (its later writes are not retention's
    own deletes)."""
    connection.execute(text("SET LOCAL session_replication_role = origin"))
