"""The sequencer: a feed position for every committed event, in one serialised order.

Why it is safe: a run holds a lock no other run can hold (PostgreSQL: an advisory lock taken
for the transaction, released by its commit; SQLite: the write lock `BEGIN IMMEDIATE` takes),
and only then reads the highest position given and the events still without one. Under READ
COMMITTED each statement sees what had committed when it started, so a run sees every earlier
run's positions and only committed events. Positions therefore grow with the runs, and a
reader's snapshot always holds a prefix of them: whatever it has not seen yet will get a
higher position than any it has. Inside one run events are numbered in id order (they are
all committed by then, so any order among them keeps the promise).

Why a publish does not pay for it: the event is written with `feed_seq` NULL (the column's
only index that sees NULLs is the small partial one of events still waiting), and no lock is
taken on the publish path. The cost moves to the run, one UPDATE per batch, done by the
reader just before it reads and by the scheduler every few seconds.
"""

from __future__ import annotations

import logging

from sqlalchemy import Connection, text

from app.db import Database

log = logging.getLogger(__name__)

# At most this many events numbered per transaction (a backlog is taken in several).
BATCH = 5000
# The PostgreSQL advisory lock of the sequencer ("kurirfeed" in ASCII, as a bigint).
LOCK_KEY = 0x6B75726972666565

HEAD = text("SELECT feed_seq FROM events WHERE feed_seq IS NOT NULL ORDER BY feed_seq DESC LIMIT 1")
_WAITING = text("SELECT 1 FROM events WHERE feed_seq IS NULL LIMIT 1")
_NUMBER = text(
    "UPDATE events SET feed_seq = :base + todo.n "
    "FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM events "
    "      WHERE feed_seq IS NULL ORDER BY id LIMIT :batch) AS todo "
    "WHERE events.id = todo.id"
)
_LOCK = text("SELECT pg_advisory_xact_lock(:key)")


def head(connection: Connection) -> int:
    """The highest position given so far (0 for an empty feed)."""
    return int(connection.execute(HEAD).scalar() or 0)


def sequence(db: Database, *, batch: int = BATCH) -> int:
    """Give a position to every event committed without one; returns how many were numbered.

    Nothing is locked or written when no event waits (the common case for a poll).
    """
    total = 0
    while True:
        if db.is_postgres:
            with db.autocommit() as connection:
                if connection.execute(_WAITING).first() is None:
                    return total
        numbered = _run(db, batch)
        total += numbered
        if numbered < batch:
            if total:
                log.debug("feed sequenced", extra={"events": total})
            return total


def _run(db: Database, batch: int) -> int:
    with db.begin() as session:
        return number(session.connection(), batch)


def number(connection: Connection, batch: int = BATCH) -> int:
    """One serialised run inside the caller's transaction: lock, read the head, number up to
    `batch` waiting events. The lock is held until that transaction ends."""
    if connection.dialect.name == "postgresql":
        # Its own statement: the UPDATE below must take its snapshot after the lock.
        connection.execute(_LOCK, {"key": LOCK_KEY})
    elif connection.execute(_WAITING).first() is None:
        return 0  # SQLite: the check runs under the write lock BEGIN IMMEDIATE took
    result = connection.execute(_NUMBER, {"base": head(connection), "batch": batch})
    return int(result.rowcount or 0)


def settled_head(connection: Connection) -> int:
    """Number everything committed so far (in the caller's transaction), then the head: the
    position before which nothing committed until now can land."""
    while number(connection) == BATCH:
        pass
    return head(connection)
