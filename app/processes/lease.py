"""The scheduler lease in the database: take it, renew it, give it back.

Why a row in the database rather than a Redis lock or a PostgreSQL advisory lock: the database
is already the source of truth every scheduler reaches, on PostgreSQL and on the embedded
SQLite alike; an advisory lock lives in a session, which PgBouncer's transaction pooling hands
to other clients between transactions; a Redis lock would make a second store the arbiter and
lose the lease with a failover of a replicated Redis. Each call here is one short transaction.

Time: on PostgreSQL, "now" is the server's `clock_timestamp()`, so schedulers on machines whose
clocks disagree still agree on when a lease ran out. SQLite is one file on one machine: every
scheduler reads the same clock there.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    DateTime,
    Interval,
    Table,
    case,
    func,
    literal,
    or_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from app.clock import utcnow
from app.db import Database
from app.models import SchedulerLease, UTCDateTime

SCHEDULER = "scheduler"
_LEASES = cast(Table, SchedulerLease.__table__)


def _now_and_expiry(db: Database, ttl_s: float) -> tuple[ColumnElement[Any], ColumnElement[Any]]:
    if db.is_postgres:
        now = func.clock_timestamp(type_=DateTime(timezone=True))
        return now, now + literal(timedelta(seconds=ttl_s), Interval())
    moment = utcnow()
    return (
        literal(moment, UTCDateTime()),
        literal(moment + timedelta(seconds=ttl_s), UTCDateTime()),
    )


def hold(db: Database, holder: str, ttl_s: float, name: str = SCHEDULER) -> int | None:
    """Renew the lease if `holder` has it, take it if it ran out (or never existed); the epoch
    of the holder's term, or None when another holder's lease is still running.

    The caller must start its own clock before calling: the row's expiry is computed later
    than that, so a term the caller counts from its start ends no later than the row's.
    """
    now, expires = _now_and_expiry(db, ttl_s)
    table = _LEASES
    mine = table.c.holder == holder
    take_or_renew = (
        update(table)
        .where(table.c.name == name, or_(mine, table.c.expires_at < now))
        .values(
            holder=holder,
            epoch=case((mine, table.c.epoch), else_=table.c.epoch + 1),
            acquired_at=case((mine, table.c.acquired_at), else_=now),
            expires_at=expires,
        )
        .returning(table.c.epoch)
    )
    with db.begin() as session:
        epoch = session.execute(take_or_renew).scalar()
        if epoch is not None:
            return int(epoch)
        maker: Any = postgresql.insert if db.is_postgres else sqlite.insert
        first = (
            maker(table)
            .values(name=name, holder=holder, epoch=1, acquired_at=now, expires_at=expires)
            .on_conflict_do_nothing(index_elements=["name"])
            .returning(table.c.epoch)
        )
        epoch = session.execute(first).scalar()
    return None if epoch is None else int(epoch)


def release(db: Database, holder: str, name: str = SCHEDULER) -> bool:
    """End `holder`'s term now, so a standby takes over at its next try instead of waiting for
    the lease to run out. Whether there was a term to end."""
    now, _ = _now_and_expiry(db, 0)
    with db.begin() as session:
        result = session.execute(
            update(SchedulerLease)
            .where(SchedulerLease.name == name, SchedulerLease.holder == holder)
            .values(expires_at=now)
        )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def current(db: Database, name: str = SCHEDULER) -> SchedulerLease | None:
    """The lease row as it stands (who holds it, until when), for tests and diagnostics."""
    with db.begin() as session:
        return session.get(SchedulerLease, name)
