"""PostgreSQL: how retention takes a lock that writers wait on, and gives way to them.

A transaction waiting for a lock makes every writer that comes after it queue behind it. So
retention's statements that take the history tables (a day's drop, a swap's trigger, key or
check) wait at most `LOCK_TIMEOUT_MS` for their locks, well below PostgreSQL's default
`deadlock_timeout` (1 s): in any cycle with traffic, retention times out first and gives
way, never failing a publish or a claim. It pauses, then tries again, `LOCK_TRIES` times.

Such a transaction commits without waiting for its WAL to reach the disk
(`synchronous_commit = off`): the writers queued on its locks go on as soon as its commit
is written, not after an fsync that a checkpoint's writes can stretch to half a second (a
day's drop held the tables 774 ms, 442 of them in `COMMIT`). Nothing is lost by it: a crash
can undo only the last such commits, whole, and what they did (a day detached, a swap's
trigger or check) is then found undone and done again by the next run; any later commit
that depends on one is flushed with it, since the WAL is flushed in order. A transaction
that removes a table's files is flushed anyway (PostgreSQL forces that).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from psycopg.errors import LockNotAvailable
from sqlalchemy import Connection, text
from sqlalchemy.exc import OperationalError

# How long a lock is waited for before giving way: also the longest a give-way pauses the
# writers queued behind it.
LOCK_TIMEOUT_MS = 100
# Tries before the work is left for the next run, and the pause between them.
LOCK_TRIES = 20
LOCK_RETRY_PAUSE_S = 0.5

T = TypeVar("T")


class NotGranted(Exception):
    """The locks were not granted in `LOCK_TRIES` tries: the work is left as it was."""


def bound_waits(connection: Connection) -> None:
    """This transaction waits at most `LOCK_TIMEOUT_MS` for any lock."""
    connection.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_MS}ms'"))


def locked(connection: Connection, work: Callable[[], T], sleep: Callable[[float], None]) -> T:
    """`work` in one transaction whose lock waits are bounded (committed when it returns),
    tried again after a pause each time a lock was not granted in time.

    Raises:
        NotGranted: not granted in `LOCK_TRIES` tries.
    """
    tries = 0
    while True:
        tries += 1
        try:
            with connection.begin():
                bound_waits(connection)
                connection.execute(text("SET LOCAL synchronous_commit = off"))
                return work()
        except OperationalError as exc:
            if not isinstance(exc.orig, LockNotAvailable):
                raise
            if tries >= LOCK_TRIES:
                raise NotGranted(str(exc.orig)) from exc
            sleep(LOCK_RETRY_PAUSE_S)
