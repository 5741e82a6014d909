"""PostgreSQL: deliveries and attempts are partitioned by day; the scheduler makes the days
ahead, retention drops whole past days and keeps every unfinished row, and an upgrade from
unpartitioned tables keeps every row."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import func, make_url, select, text, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from app import migrate
from app.clock import utcnow
from app.config import normalise_database_url
from app.db import Database
from app.feed.sequencer import sequence
from app.ids import id_at
from app.lifecycle import archive, drop, giveway, partitions, purge, swap, triggers
from app.lifecycle.partitions import ATTEMPTS, DELIVERIES
from app.models import (
    DEAD,
    DELIVERING,
    DL_DISCARDED,
    DL_OPEN,
    PENDING,
    RETRYING,
    SUCCEEDED,
    Attempt,
    DeadLetter,
    DeadLetterAudit,
    Delivery,
    Endpoint,
    Event,
)
from app.processes.scheduler import make_partitions
from app.runtime import Runtime
from app.vocabulary import EndpointMode, RetentionKind
from tests.integration.test_lifecycle import History, _ids
from tests.support.migrations import migrated_back

DAY = timedelta(days=1)


@pytest.fixture
def pg_runtime(runtime: Any) -> Any:
    if not runtime.db.is_postgres:
        pytest.skip("PostgreSQL only: SQLite keeps plain tables and batch deletes")
    return runtime


@pytest.fixture(params=["copied", "swapped"])
def way(request: Any, monkeypatch: Any) -> str:
    """The two ways a dropped day's kept rows go: copied under the locks into the default
    partition, or (a day keeping at least `swap.SWAP_MIN_ROWS`) swapped, a kept partition
    of their own taking the day's place. Tests with this fixture run both."""
    monkeypatch.setattr(swap, "SWAP_MIN_ROWS", 1 if request.param == "swapped" else 10**9)
    return str(request.param)


def _kept_home(way: str, day: datetime) -> str:
    """Where a day's kept deliveries are after its drop, the `way` it went."""
    if way == "copied":
        return "deliveries_default"
    return partitions.name_for(DELIVERIES, day, partitions.KEPT)


def _nothing_left_of_a_swap(runtime: Any) -> None:
    """No trigger, change log, default partition's check or unattached copy is left."""
    with runtime.db.engine.connect() as connection:
        assert not connection.execute(
            text("SELECT tgname FROM pg_trigger WHERE tgname = :n"), {"n": swap.TRIGGER}
        ).all()
        assert not connection.execute(
            text("SELECT conname FROM pg_constraint WHERE conname LIKE '%\\_default\\_not\\_%'")
        ).all()
        assert not connection.execute(
            text(
                "SELECT relname FROM pg_class WHERE relkind = 'r' AND NOT relispartition "
                "AND relname ~ :p"
            ),
            {"p": partitions.DAY_NAME_PATTERN},
        ).all()


def _days(runtime: Any, spec: partitions.Spec) -> set[str]:
    with runtime.db.engine.connect() as connection:
        return {f"{p.start:%Y-%m-%d}" for p in partitions.partitions(connection, spec)}


def _make_days(runtime: Any, *days: datetime) -> None:
    with runtime.db.engine.begin() as connection:
        for day in days:
            for spec in partitions.SPECS:
                partitions.create(connection, spec, day)


def _a_past_day(runtime: Any) -> tuple[datetime, datetime]:
    """A day 80 days back, its partitions made, and a `now` 60 days after it: the day is
    past every retention horizon, so a run at `now` drops it."""
    t0 = utcnow() - 80 * DAY
    _make_days(runtime, t0)
    return t0, t0 + 60 * DAY


def _attempts_expire_first(make_rt: Any, migrated: Any) -> tuple[Runtime, datetime]:
    """A runtime whose attempts expire after 7 days and events after 30, and a day 100 days
    back with its partitions made."""
    if not migrated.db.is_postgres:
        pytest.skip("PostgreSQL only")
    runtime = make_rt(retain_attempts_days=7, retain_events_days=30)
    t0 = utcnow() - 100 * DAY
    _make_days(runtime, t0)
    return runtime, t0


@contextmanager
def _a_writer_holding(runtime: Any, delivery_id: str) -> Iterator[None]:
    """A transaction holding a delivery locked (as a claim locks what it takes) while the
    block runs; afterwards it writes the row and commits, so it is shown unharmed."""
    writer = runtime.db.engine.connect()
    try:
        transaction = writer.begin()
        writer.execute(
            text("SELECT id FROM deliveries WHERE id = :i FOR UPDATE"), {"i": delivery_id}
        ).one()
        yield
        writer.execute(
            text("UPDATE deliveries SET updated_at = updated_at WHERE id = :i"), {"i": delivery_id}
        )
        transaction.commit()
    finally:
        writer.close()


def _where(runtime: Any, table: str, row_id: str) -> str:
    with runtime.db.engine.connect() as connection:
        return str(
            connection.execute(
                text(f"SELECT tableoid::regclass::text FROM {table} WHERE id = :i"),  # noqa: S608
                {"i": row_id},
            ).scalar()
        )


def _row_versions(runtime: Any, table: str) -> dict[str, tuple[str, str]]:
    """Each row's place and the transaction that wrote it: unchanged only if never rewritten."""
    with runtime.db.engine.connect() as connection:
        rows = connection.execute(text(f"SELECT id, ctid::text, xmin::text FROM {table}"))  # noqa: S608
        return {row.id: (row.ctid, row.xmin) for row in rows}


def test_the_scheduler_makes_today_and_the_week_ahead(pg_runtime) -> None:
    today = partitions.day_start(utcnow())
    with pg_runtime.db.engine.begin() as connection:
        # Attempts' days first: each refers to its deliveries' day by a key.
        for spec in (ATTEMPTS, DELIVERIES):
            for part in partitions.partitions(connection, spec):
                if part.start > today + DAY:
                    connection.execute(
                        text(f"ALTER TABLE {spec.table} DETACH PARTITION {part.name}")
                    )
                    connection.execute(text(f"DROP TABLE {part.name}"))
    make_partitions(pg_runtime)
    week = {f"{today + n * DAY:%Y-%m-%d}" for n in range(partitions.AHEAD_DAYS + 1)}
    assert week <= _days(pg_runtime, DELIVERIES)
    assert week <= _days(pg_runtime, ATTEMPTS)
    assert make_partitions(pg_runtime) == 0  # nothing missing: nothing made
    # A new delivery lands in its day, not in the default partition.
    with pg_runtime.db.begin() as session:
        h = History(session)
        _, delivery_id = h.story(h.endpoint(), SUCCEEDED, utcnow())
    assert _where(pg_runtime, "deliveries", delivery_id) == partitions.name_for(DELIVERIES, today)


def test_retention_drops_past_days_whole_and_keeps_every_unfinished_row(
    pg_runtime, fk_triggers, way
) -> None:
    t0, now = _a_past_day(pg_runtime)
    with pg_runtime.db.begin() as session:
        h = History(session)
        push = h.endpoint()
        ordered = h.endpoint(ordering="key", on_dead="block")
        pull = h.endpoint(mode=EndpointMode.PULL, event_types=["order.created"])
        pull.url = ""
        pull_id = pull.id
        gone = [h.story(push, SUCCEEDED, t0 + n * timedelta(minutes=1)) for n in range(5)]
        gone.append(h.story(push, DEAD, t0, letter=DL_DISCARDED, resolved_at=t0 - 70 * DAY))
        kept = {
            "pending": h.story(push, PENDING, t0),
            "delivering": h.story(push, DELIVERING, t0),
            "retrying": h.story(push, RETRYING, t0),
            "open_letter": h.story(push, DEAD, t0, letter=DL_OPEN),
            "key_blocker": h.story(
                ordered, DEAD, t0, letter=DL_OPEN, ordering_key="k", ordering_seq=1
            ),
            "key_held": h.story(ordered, PENDING, t0, ordering_key="k", ordering_seq=2),
            # finished, but the pull endpoint has not acknowledged it (ids after the rest,
            # so feed positions after theirs)
            "unread": h.story(push, SUCCEEDED, t0 + 2 * timedelta(hours=1)),
        }
        # The feed's head is always kept: let a young event hold it.
        young = h.story(push, SUCCEEDED, now - DAY)
    sequence(pg_runtime.db)
    with pg_runtime.db.begin() as session:
        unread_seq = session.get_one(Event, kept["unread"][0]).feed_seq
        session.execute(
            update(Endpoint).where(Endpoint.id == pull_id).values(acked_seq=unread_seq - 1)
        )
    day = f"{partitions.day_start(t0):%Y-%m-%d}"
    assert day in _days(pg_runtime, DELIVERIES)
    letters_before = _row_versions(pg_runtime, "dead_letters")
    audit_before = _row_versions(pg_runtime, "dead_letter_audit")

    report = purge.run(pg_runtime, now=now, sleep=lambda _s: None)

    assert day not in _days(pg_runtime, DELIVERIES)
    assert day not in _days(pg_runtime, ATTEMPTS)
    # Past both horizons, the day is dropped once: its deliveries, their attempts with them.
    drops = [b for b in report.batches if b.source == f"drop:{day}"]
    assert [b.kind for b in drops] == [RetentionKind.EVENTS]
    with pg_runtime.db.begin() as session:
        assert _ids(session, Delivery) == {d for _, d in kept.values()} | {young[1]}
        assert _ids(session, Event) == {e for e, _ in kept.values()} | {young[0]}
        # Attempts follow their own rule: those of finished deliveries go (unread's too).
        attempted = set(session.scalars(select(Attempt.delivery_id)))
        finished = {kept["unread"][1]}
        assert attempted == {d for _, d in kept.values()} - finished | {young[1]}
        letters = {row.delivery_id: row.state for row in session.scalars(select(DeadLetter))}
        assert letters == {kept["open_letter"][1]: DL_OPEN, kept["key_blocker"][1]: DL_OPEN}
        assert session.scalar(select(func.count()).select_from(DeadLetterAudit)) == 2
    # The kept deliveries' letters and their audit were never moved (no key refers into the
    # day): the same row versions, where they were.
    kept_letters = _row_versions(pg_runtime, "dead_letters")
    assert len(kept_letters) == 2 and kept_letters.items() <= letters_before.items()
    kept_audit = _row_versions(pg_runtime, "dead_letter_audit")
    assert len(kept_audit) == 2 and kept_audit.items() <= audit_before.items()
    # Copied: put back through the parent; their day is gone, so the default. Swapped: in
    # the day's kept partition, with their attempts in its attempts' one.
    for _, delivery_id in kept.values():
        assert _where(pg_runtime, "deliveries", delivery_id) == _kept_home(way, t0)
    assert report.purged[RetentionKind.EVENTS] == len(gone)
    assert report.purged[RetentionKind.ATTEMPTS] == len(gone) + 1  # and unread's
    _nothing_left_of_a_swap(pg_runtime)


@pytest.fixture
def scratch_url() -> Iterator[str]:
    """A database of its own beside the test database, dropped afterwards."""
    import os

    raw = os.environ.get("TEST_DATABASE_URL")
    if not raw:
        pytest.skip("PostgreSQL: TEST_DATABASE_URL is unset")
    base = make_url(normalise_database_url(raw))
    name = f"{base.database}_upgrade"
    admin = Database(base.set(database="postgres").render_as_string(hide_password=False))
    with admin.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield base.set(database=name).render_as_string(hide_password=False)
    with admin.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def test_upgrading_unpartitioned_tables_keeps_every_row(scratch_url) -> None:
    migrate.upgrade(scratch_url, "0019_search")
    old = Database(scratch_url)
    t0 = utcnow()
    stories: dict[str, tuple[str, str]] = {}
    try:
        with old.begin() as session:
            h = History(session)
            push = h.endpoint()
            for n, state in enumerate((SUCCEEDED, PENDING, RETRYING, DEAD, SUCCEEDED)):
                at = t0 - n * 9 * DAY
                stories[f"{state}-{n}"] = h.story(
                    push, state, at, letter=DL_OPEN if state == DEAD else None
                )
        with old.engine.connect() as connection:
            before = {
                t: connection.execute(text(f"SELECT id FROM {t} ORDER BY id")).scalars().all()  # noqa: S608
                for t in ("events", "deliveries", "attempts", "dead_letters")
            }
    finally:
        old.dispose()

    migrate.upgrade(scratch_url)
    migrate.check(scratch_url)

    new = Database(scratch_url)
    try:
        with new.engine.connect() as connection:
            after = {
                t: connection.execute(text(f"SELECT id FROM {t} ORDER BY id")).scalars().all()  # noqa: S608
                for t in before
            }
            assert partitions.is_partitioned(connection, "deliveries")
            assert partitions.is_partitioned(connection, "attempts")
            oldest = partitions.partitions(connection, DELIVERIES)[0].start
        assert after == before
        assert oldest == partitions.day_start(t0 - 36 * DAY)
        # Every row is in its own day's partition, and the foreign keys still cascade.
        for _, delivery_id in stories.values():
            with new.engine.connect() as connection:
                where = connection.execute(
                    text("SELECT tableoid::regclass::text FROM deliveries WHERE id = :i"),
                    {"i": delivery_id},
                ).scalar()
            assert where is not None and where.startswith("deliveries_p")
        with new.begin() as session:
            event_id, delivery_id = stories["dead-3"]
            session.execute(Event.__table__.delete().where(Event.id == event_id))  # type: ignore[attr-defined]
        with new.begin() as session:
            assert session.get(Delivery, delivery_id) is None
            assert session.scalar(select(func.count()).select_from(DeadLetter)) == 0
    finally:
        new.dispose()


def _attempt_keys(runtime: Any) -> dict[str, str]:
    """Per table holding attempts (the parent or a partition), what its own foreign key to
    deliveries refers to."""
    with runtime.db.engine.connect() as connection:
        return dict(
            connection.execute(
                text(
                    "SELECT c.conrelid::regclass::text, c.confrelid::regclass::text "
                    "FROM pg_constraint c WHERE c.contype = 'f' AND c.conparentid = 0 "
                    "AND c.conrelid::regclass::text LIKE 'attempts%'"
                )
            ).all()
        )


def _an_attempt_for(runtime: Any, delivery_id: str) -> None:
    with runtime.db.begin() as session:
        session.add(
            Attempt(
                delivery_id=delivery_id,
                n=9,
                started_at=utcnow(),
                duration_ms=1,
                url="http://127.0.0.1:9/hook",
                request_headers={},
            )
        )


def test_0023_attempts_refer_to_their_own_day_of_deliveries_and_keep_every_row(
    migrated,
) -> None:
    """0023 replaces the parents' key with one per attempts partition: a day's attempts refer
    to that day's deliveries, the default partition to all of them. Every row stays, and an
    attempt naming no delivery is still refused, in a day's partition or the default."""
    if not migrated.db.is_postgres:
        pytest.skip("PostgreSQL only: SQLite keeps plain tables")
    with migrated_back(migrated, "0022_letter_delivery_no_fk") as database:
        assert _attempt_keys(database) == {"attempts": "deliveries"}
        t0 = utcnow() - 3 * DAY
        with database.db.begin() as session:
            h = History(session)
            push = h.endpoint()
            story = h.story(push, SUCCEEDED, t0)
        with database.db.engine.connect() as connection:
            before = connection.execute(text("SELECT id FROM attempts ORDER BY id")).all()

        migrate.upgrade(database.url)
        migrate.check(database.url)

        keys = _attempt_keys(database)
        assert "attempts" not in keys
        with database.db.engine.connect() as connection:
            days = partitions.partitions(connection, ATTEMPTS)
            assert connection.execute(text("SELECT id FROM attempts ORDER BY id")).all() == before
        assert days and keys == {
            **{p.name: partitions.name_for(DELIVERIES, p.start) for p in days},
            "attempts_default": "deliveries",
        }
        with database.db.begin() as session:
            assert session.scalar(select(func.count()).select_from(Attempt)) == 1
        # Still refused: an attempt of a day whose delivery does not exist, and one that
        # lands in the default partition (its day has no partition).
        for missing in (
            id_at("dlv", t0),
            id_at("dlv", t0 - 5000 * DAY),
        ):
            with pytest.raises(IntegrityError):
                _an_attempt_for(database, missing)
        _an_attempt_for(database, story[1])

        command.downgrade(migrate.alembic_config(database.url), "0022_letter_delivery_no_fk")
        assert _attempt_keys(database) == {"attempts": "deliveries"}


def test_days_made_ahead_carry_their_attempts_key(pg_runtime) -> None:
    """A day the scheduler makes refers to its own day of deliveries; an attempt for a
    delivery of another day cannot land in it, nor can a deliveries day go under its
    attempts."""
    today = partitions.day_start(utcnow())
    keys = _attempt_keys(pg_runtime)
    for n in range(partitions.AHEAD_DAYS + 1):
        day = today + n * DAY
        assert keys[partitions.name_for(ATTEMPTS, day)] == partitions.name_for(DELIVERIES, day)
    with pg_runtime.db.begin() as session:
        h = History(session)
        _, delivery_id = h.story(h.endpoint(), SUCCEEDED, utcnow())
    _an_attempt_for(pg_runtime, delivery_id)
    with pytest.raises(IntegrityError):
        _an_attempt_for(pg_runtime, id_at("dlv", today + 2 * DAY))
    name = partitions.name_for(DELIVERIES, today)
    with pg_runtime.db.engine.begin() as connection:
        connection.execute(text(f"ALTER TABLE deliveries DETACH PARTITION {name}"))
        with pytest.raises(DBAPIError, match="other objects depend on it"):
            connection.execute(text(f"DROP TABLE {name}"))
        connection.rollback()


def test_an_attempts_day_drops_while_a_writer_holds_deliveries(make_rt, migrated) -> None:
    """An attempts day's key refers to its own deliveries day only, so its drop locks that
    day, not `deliveries`: a publish or a claim holding the table (here a row of today,
    locked as a claim locks it) does not hold the drop back, nor is it held by it."""
    runtime, t0 = _attempts_expire_first(make_rt, migrated)
    with runtime.db.begin() as session:
        h = History(session)
        push = h.endpoint()
        h.story(push, SUCCEEDED, t0)
        young = h.story(push, SUCCEEDED, utcnow())
    sequence(runtime.db)
    day = f"{partitions.day_start(t0):%Y-%m-%d}"
    with _a_writer_holding(runtime, young[1]):
        report = purge.run(
            runtime, now=t0 + 20 * DAY, sleep=lambda _s: None, kinds=[RetentionKind.ATTEMPTS]
        )
        assert day not in _days(runtime, ATTEMPTS)
        assert report.purged[RetentionKind.ATTEMPTS] == 1
    assert day in _days(runtime, DELIVERIES)


def _tables_named_as_days(runtime: Any) -> set[str]:
    with runtime.db.engine.connect() as connection:
        return set(
            connection.execute(
                text("SELECT relname FROM pg_class WHERE relkind = 'r' AND relname ~ :p"),
                {"p": partitions.DAY_NAME_PATTERN},
            ).scalars()
        )


def test_a_dropped_day_leaves_no_table_and_a_run_removes_what_a_dead_one_left(
    pg_runtime, way
) -> None:
    """The locked step only detaches a day; its tables are removed after the commit. A
    retention process that died between the two left detached tables behind: the next run
    removes them, and nothing that is still a partition."""
    t0, now = _a_past_day(pg_runtime)
    with pg_runtime.db.begin() as session:
        h = History(session)
        push = h.endpoint()
        h.story(push, SUCCEEDED, t0)
        h.story(push, SUCCEEDED, now - DAY)
    sequence(pg_runtime.db)
    gone = {partitions.name_for(spec, t0) for spec in partitions.SPECS}
    assert gone <= _tables_named_as_days(pg_runtime)
    # As a run that died after its commit leaves them: detached, keys dropped, files kept.
    left = partitions.day_start(t0 - 400 * DAY)
    _make_days(pg_runtime, left)
    with pg_runtime.db.engine.begin() as connection:
        for spec in (ATTEMPTS, DELIVERIES):
            partitions.detach(connection, spec.table, partitions.name_for(spec, left))
    stranded = {partitions.name_for(spec, left) for spec in partitions.SPECS}
    assert stranded <= _tables_named_as_days(pg_runtime)

    purge.run(pg_runtime, now=now, sleep=lambda _s: None, kinds=[RetentionKind.EVENTS])

    after = _tables_named_as_days(pg_runtime)
    assert not after & (gone | stranded)
    with pg_runtime.db.engine.connect() as connection:
        attached = {
            p.name
            for s in partitions.SPECS
            for sort in (partitions.DAY, partitions.KEPT)
            for p in partitions.partitions(connection, s, sort)
        }
    assert after == attached  # every table named as a day left is still a partition
    assert f"{partitions.day_start(t0):%Y-%m-%d}" not in _days(pg_runtime, DELIVERIES)


def test_between_two_days_a_run_pauses_400_times_as_long_as_the_last_held_its_locks(
    pg_runtime,
) -> None:
    """At most one part of the time in 401 is locked by drops, so at most one publish in 400
    can meet one: the publishes' p99 is never set by the drops."""
    t0, now = _a_past_day(pg_runtime)
    _make_days(pg_runtime, t0 + DAY)
    with pg_runtime.db.begin() as session:
        h = History(session)
        push = h.endpoint()
        h.story(push, SUCCEEDED, t0)
        h.story(push, SUCCEEDED, t0 + DAY)
        h.story(push, SUCCEEDED, now - DAY)
    sequence(pg_runtime.db)
    pauses: list[float] = []
    dropped = list(drop.run(pg_runtime, RetentionKind.EVENTS, t0 + 3 * DAY, sleep=pauses.append))
    assert len(dropped) >= 2 and len(pauses) == len(dropped) - 1
    for day, pause in zip(dropped, pauses, strict=False):
        assert pause == pytest.approx(max(0.5, 400 * day.locked_ms / 1000.0))


def test_attempts_go_by_their_own_days_and_what_they_left_goes_with_the_deliveries(
    make_rt, migrated
) -> None:
    runtime, t0 = _attempts_expire_first(make_rt, migrated)
    with runtime.db.begin() as session:
        h = History(session)
        push = h.endpoint()
        done = h.story(push, SUCCEEDED, t0)
        retrying = h.story(push, RETRYING, t0)
        young = h.story(push, SUCCEEDED, utcnow())  # holds the feed's head
    sequence(runtime.db)
    day = f"{partitions.day_start(t0):%Y-%m-%d}"

    # Attempts past 7 days, events not yet past 30: only the attempts' day goes.
    report = purge.run(runtime, now=t0 + 20 * DAY, sleep=lambda _s: None)
    assert day not in _days(runtime, ATTEMPTS)
    assert day in _days(runtime, DELIVERIES)
    assert report.purged[RetentionKind.ATTEMPTS] == 1
    with runtime.db.begin() as session:
        assert set(session.scalars(select(Attempt.delivery_id))) == {retrying[1], young[1]}
    assert _where(runtime, "deliveries", done[1]) == partitions.name_for(DELIVERIES, t0)

    # Then the events' horizon passes: the deliveries' day goes, the retrying one stays
    # with its attempt.
    purge.run(runtime, now=t0 + 40 * DAY, sleep=lambda _s: None)
    assert day not in _days(runtime, DELIVERIES)
    with runtime.db.begin() as session:
        assert _ids(session, Delivery) == {retrying[1], young[1]}
        assert set(session.scalars(select(Attempt.delivery_id))) == {retrying[1], young[1]}
        assert _ids(session, Event) == {retrying[0], young[0]}


def test_a_drop_gives_way_to_traffic_holding_its_tables_and_never_fails_it(pg_runtime, way) -> None:
    """A writer holding the deliveries table (as a claim or a publish does) keeps its
    transaction: the drop waits a bounded time, gives way, and drops the day once it is free.
    Had the drop locked the day's partition before the parent, the two would wait on each
    other and PostgreSQL would fail one of them, possibly the writer."""
    t0, now = _a_past_day(pg_runtime)
    with pg_runtime.db.begin() as session:
        h = History(session)
        push = h.endpoint()
        h.story(push, SUCCEEDED, t0)
        young = h.story(push, SUCCEEDED, now - DAY)
    sequence(pg_runtime.db)
    day = f"{partitions.day_start(t0):%Y-%m-%d}"
    # A row of a current day held; the writer is unharmed: its transaction goes on, commits.
    with _a_writer_holding(pg_runtime, young[1]):
        report = purge.run(pg_runtime, now=now, sleep=lambda _s: None, kinds=[RetentionKind.EVENTS])
        assert day in _days(pg_runtime, DELIVERIES)  # given way, not dropped
        assert not any(b.source.startswith("drop:") for b in report.batches)
        _nothing_left_of_a_swap(pg_runtime)  # a swap given up is undone
    purge.run(pg_runtime, now=now, sleep=lambda _s: None, kinds=[RetentionKind.EVENTS])
    assert day not in _days(pg_runtime, DELIVERIES)


# ------------------------------------------------ rows that change while a day is looked at


def _after_find(monkeypatch: Any, kind: RetentionKind, change: Any) -> None:
    """`change()` runs, committed by another connection as traffic would, between the drop's
    unlocked look at the day (step 1) and its locked transaction (step 2)."""
    spec, find, drop_day = drop._BY_KIND[kind]

    def find_then_change(connection: Any, part: Any, horizon: datetime) -> Any:
        found = find(connection, part, horizon)
        change()
        return found

    monkeypatch.setitem(drop._BY_KIND, kind, (spec, find_then_change, drop_day))


def test_a_delivery_resent_or_dead_lettered_after_the_day_was_looked_at_stays(
    pg_runtime, monkeypatch, fk_triggers, way
) -> None:
    t0, now = _a_past_day(pg_runtime)
    with pg_runtime.db.begin() as session:
        h = History(session)
        push = h.endpoint()
        # Kept from the start, so that the day is swapped when the test is run that way.
        retrying = h.story(push, RETRYING, t0 + timedelta(minutes=3))
        resent = h.story(push, SUCCEEDED, t0)
        lettered = h.story(push, DEAD, t0 + timedelta(minutes=1))
        gone = h.story(push, SUCCEEDED, t0 + timedelta(minutes=2))
        young = h.story(push, SUCCEEDED, now - DAY)
        partner_id = h.partner.id
    sequence(pg_runtime.db)

    def traffic() -> None:
        with pg_runtime.db.begin() as session:
            session.execute(update(Delivery).where(Delivery.id == resent[1]).values(state=RETRYING))
            session.add(
                DeadLetter(
                    delivery_id=lettered[1],
                    event_id=lettered[0],
                    endpoint_id=push.id,
                    partner_id=partner_id,
                    event_type="order.created",
                    reason="exhausted",
                    state=DL_OPEN,
                )
            )

    _after_find(monkeypatch, RetentionKind.EVENTS, traffic)
    day = f"{partitions.day_start(t0):%Y-%m-%d}"
    report = purge.run(pg_runtime, now=now, sleep=lambda _s: None, kinds=[RetentionKind.EVENTS])

    assert day not in _days(pg_runtime, DELIVERIES)
    assert any(b.source == f"drop:{day}" for b in report.batches)
    with pg_runtime.db.begin() as session:
        assert _ids(session, Delivery) == {resent[1], lettered[1], retrying[1], young[1]}
        assert gone[0] not in _ids(session, Event)
        assert set(session.scalars(select(Attempt.delivery_id))) == {
            resent[1],
            lettered[1],
            retrying[1],
            young[1],
        }
        letter = session.scalars(select(DeadLetter)).one()
        assert (letter.delivery_id, letter.state) == (lettered[1], DL_OPEN)
    assert _where(pg_runtime, "deliveries", resent[1]) == _kept_home(way, t0)


def test_events_a_pull_endpoint_made_after_the_day_was_looked_at_owes_stay(
    pg_runtime, monkeypatch, way
) -> None:
    t0, now = _a_past_day(pg_runtime)
    with pg_runtime.db.begin() as session:
        h = History(session)
        push = h.endpoint()
        owed = [h.story(push, SUCCEEDED, t0 + n * timedelta(minutes=1)) for n in range(3)]
        young = h.story(push, SUCCEEDED, now - DAY)
        partner_id = h.partner.id
    sequence(pg_runtime.db)

    def a_pull_endpoint_is_made() -> None:
        with pg_runtime.db.begin() as session:
            session.add(
                Endpoint(
                    partner_id=partner_id,
                    url="",
                    mode=EndpointMode.PULL,
                    event_types=["order.created"],
                )
            )

    _after_find(monkeypatch, RetentionKind.EVENTS, a_pull_endpoint_is_made)
    purge.run(pg_runtime, now=now, sleep=lambda _s: None, kinds=[RetentionKind.EVENTS])

    assert f"{partitions.day_start(t0):%Y-%m-%d}" not in _days(pg_runtime, DELIVERIES)
    with pg_runtime.db.begin() as session:
        assert _ids(session, Event) == {e for e, _ in owed} | {young[0]}
        assert _ids(session, Delivery) == {d for _, d in owed} | {young[1]}


def test_an_attempt_made_after_the_attempts_day_was_looked_at_stays(
    make_rt, migrated, monkeypatch
) -> None:
    runtime, t0 = _attempts_expire_first(make_rt, migrated)
    with runtime.db.begin() as session:
        h = History(session)
        push = h.endpoint()
        done = h.story(push, SUCCEEDED, t0)
        other = h.story(push, SUCCEEDED, t0 + timedelta(minutes=1))
        h.story(push, SUCCEEDED, utcnow())  # holds the feed's head
    sequence(runtime.db)
    made: list[str] = []

    def resent_and_delivered() -> None:
        with runtime.db.begin() as session:
            attempt = Attempt(
                delivery_id=done[1], n=2, started_at=utcnow(), duration_ms=5, url="http://x/"
            )
            session.add(attempt)
            session.flush()
            made.append(attempt.id)

    _after_find(monkeypatch, RetentionKind.ATTEMPTS, resent_and_delivered)
    report = purge.run(
        runtime, now=t0 + 20 * DAY, sleep=lambda _s: None, kinds=[RetentionKind.ATTEMPTS]
    )

    assert f"{partitions.day_start(t0):%Y-%m-%d}" not in _days(runtime, ATTEMPTS)
    with runtime.db.begin() as session:
        kept = {a.delivery_id: a.id for a in session.scalars(select(Attempt))}
    assert kept.get(done[1]) == made[0]
    assert other[1] not in kept
    assert report.purged[RetentionKind.ATTEMPTS] == 2  # the first attempts of both


def test_a_day_is_archived_before_it_is_dropped_and_kept_when_it_cannot_be(
    pg_runtime, tmp_path, way
) -> None:
    t0, now = _a_past_day(pg_runtime)
    with pg_runtime.db.begin() as session:
        h = History(session)
        push = h.endpoint()
        gone = [h.story(push, SUCCEEDED, t0 + n * timedelta(minutes=1)) for n in range(3)]
        kept = h.story(push, RETRYING, t0 + timedelta(hours=1))
        h.story(push, SUCCEEDED, now - DAY)  # holds the feed's head
    sequence(pg_runtime.db)
    day = f"{partitions.day_start(t0):%Y-%m-%d}"
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # where the archive's folder should be: unwritable, even as root

    def archiving(directory: Path) -> Runtime:
        return Runtime(replace(pg_runtime.settings, archive_dir=directory), database=pg_runtime.db)

    report = purge.run(archiving(blocker / "archive"), now=now, sleep=lambda _s: None)
    assert report.archive_error is not None and report.archive_error.startswith("drop:")
    assert day in _days(pg_runtime, DELIVERIES)  # not archived: not dropped
    with pg_runtime.db.begin() as session:
        assert {d for _, d in gone} | {kept[1]} <= _ids(session, Delivery)

    directory = tmp_path / "archive"
    report = purge.run(archiving(directory), now=now, sleep=lambda _s: None)
    assert report.archive_error is None
    assert day not in _days(pg_runtime, DELIVERIES)
    archived = {
        name: {row["id"] for f in (directory / name).glob("*.jsonl.gz") for row in archive.read(f)}
        for name in ("deliveries", "attempts")
    }
    assert archived["deliveries"] == {d for _, d in gone}  # the kept one is not purged
    with pg_runtime.db.begin() as session:
        assert _ids(session, Delivery) >= {kept[1]}
        attempts_of = dict(session.execute(select(Attempt.id, Attempt.delivery_id)).all())
    assert len(archived["attempts"]) == 3 and not archived["attempts"] & set(attempts_of)
    assert _where(pg_runtime, "deliveries", kept[1]) == _kept_home(way, t0)


def test_only_a_role_allowed_to_skips_triggers(pg_runtime) -> None:
    with pg_runtime.db.engine.connect() as connection:
        with connection.begin():
            assert triggers.skip(connection)  # the tests' role is a superuser
            assert connection.execute(text("SHOW session_replication_role")).scalar() == "replica"
        assert connection.execute(text("SHOW session_replication_role")).scalar() == "origin"
        connection.rollback()
        # A role of its own, made in a transaction rolled back at the end: the cluster
        # keeps nothing of it.
        transaction = connection.begin()
        try:
            connection.execute(text("CREATE ROLE kurir_test_plain NOLOGIN"))
            connection.execute(text("SET LOCAL ROLE kurir_test_plain"))
            assert not triggers.skip(connection)
            # The transaction goes on: the refusal was kept to its savepoint.
            assert connection.execute(text("SELECT 1")).scalar() == 1
            assert connection.execute(text("SHOW session_replication_role")).scalar() == "origin"
        finally:
            transaction.rollback()


# ------------------------------------------------------------------ days swapped, not copied


def _after_prepare(monkeypatch: Any, change: Any) -> None:
    """`change()` runs, committed by another connection, after a swap's copies are made and
    brought up to date, before its locked step: only the change log can carry it over."""
    prepare = swap.prepare

    def prepare_then_change(connection: Any, day: Any, sleep: Any) -> Any:
        shadow = prepare(connection, day, sleep)
        change()
        return shadow

    monkeypatch.setattr(swap, "prepare", prepare_then_change)


def _attempts_of(session: Any, delivery_id: str) -> list[int]:
    return sorted(session.scalars(select(Attempt.n).where(Attempt.delivery_id == delivery_id)))


@pytest.mark.parametrize("way", ["swapped"], indirect=True)
def test_a_swapped_day_keeps_what_was_written_to_it_while_it_was_copied(
    pg_runtime, monkeypatch, way
) -> None:
    t0, now = _a_past_day(pg_runtime)
    with pg_runtime.db.begin() as session:
        h = History(session)
        push = h.endpoint()
        recorded = h.story(push, RETRYING, t0)  # tried again meanwhile: an attempt, a count
        deleted = h.story(push, RETRYING, t0 + timedelta(minutes=1))  # its event deleted
        retried = h.story(push, SUCCEEDED, t0 + timedelta(minutes=2))  # sent again meanwhile
        gone = h.story(push, SUCCEEDED, t0 + timedelta(minutes=3))
        young = h.story(push, SUCCEEDED, now - DAY)
    sequence(pg_runtime.db)

    def traffic() -> None:
        with pg_runtime.db.begin() as session:
            session.add(
                Attempt(
                    delivery_id=recorded[1],
                    n=2,
                    started_at=utcnow(),
                    duration_ms=5,
                    url="http://x/",
                )
            )
            session.execute(
                update(Delivery).where(Delivery.id == recorded[1]).values(attempt_count=2)
            )
            session.execute(
                update(Delivery).where(Delivery.id == retried[1]).values(state=RETRYING)
            )
            session.execute(text("DELETE FROM events WHERE id = :i"), {"i": deleted[0]})

    _after_prepare(monkeypatch, traffic)
    day = f"{partitions.day_start(t0):%Y-%m-%d}"
    report = purge.run(pg_runtime, now=now, sleep=lambda _s: None, kinds=[RetentionKind.EVENTS])

    assert any(b.source == f"drop:{day}" for b in report.batches)
    assert day not in _days(pg_runtime, DELIVERIES)
    with pg_runtime.db.begin() as session:
        assert _ids(session, Delivery) == {recorded[1], retried[1], young[1]}
        assert gone[0] not in _ids(session, Event)
        # As written after the copy: the new attempt and count, the resend.
        assert session.get_one(Delivery, recorded[1]).attempt_count == 2
        assert _attempts_of(session, recorded[1]) == [1, 2]
        assert session.get_one(Delivery, retried[1]).state == RETRYING
        assert _attempts_of(session, retried[1]) == [1]
        assert _attempts_of(session, deleted[1]) == []
    kept_home = _kept_home(way, t0)
    for delivery_id in (recorded[1], retried[1]):
        assert _where(pg_runtime, "deliveries", delivery_id) == kept_home
    _nothing_left_of_a_swap(pg_runtime)
    # The kept partition is the day's partition in all but name: its keys hold.
    with pg_runtime.db.engine.connect() as connection:
        refers = partitions.referred_by_key(connection, partitions.name_for(ATTEMPTS, t0, "k"))
    assert refers == [kept_home]
    with pytest.raises(IntegrityError), pg_runtime.db.begin() as session:
        session.add(
            Attempt(
                delivery_id=id_at("dlv", t0 + timedelta(hours=5)),
                n=1,
                started_at=utcnow(),
                duration_ms=5,
                url="http://x/",
            )
        )


@pytest.mark.parametrize("way", ["swapped"], indirect=True)
def test_a_kept_partition_goes_once_empty_few_or_one_too_many(pg_runtime, monkeypatch, way) -> None:
    t0, now = _a_past_day(pg_runtime)
    days = [t0, t0 + DAY, t0 + 2 * DAY]
    _make_days(pg_runtime, *days[1:])
    with pg_runtime.db.begin() as session:
        h = History(session)
        push = h.endpoint()
        finishing, few, capped = (h.story(push, RETRYING, day) for day in days)
        h.story(push, RETRYING, days[2] + timedelta(minutes=1))  # two rows in the last day
        h.story(push, SUCCEEDED, now - DAY)
    sequence(pg_runtime.db)

    def run() -> None:
        purge.run(pg_runtime, now=now, sleep=lambda _s: None, kinds=[RetentionKind.EVENTS])

    def kept_partitions() -> list[str]:
        with pg_runtime.db.engine.connect() as connection:
            return [p.name for p in partitions.partitions(connection, DELIVERIES, "k")]

    run()
    assert kept_partitions() == [partitions.name_for(DELIVERIES, d, "k") for d in days]
    with pg_runtime.db.begin() as session:
        session.execute(update(Delivery).where(Delivery.id == finishing[1]).values(state=SUCCEEDED))
    run()  # the row-level purge takes the finished one from its kept partition
    run()  # and the empty partition goes
    assert kept_partitions() == [partitions.name_for(DELIVERIES, d, "k") for d in days[1:]]
    assert _where(pg_runtime, "deliveries", few[1]) == _kept_home(way, days[1])

    # A partition holding fewer rows than a day worth swapping goes (one row, not two).
    monkeypatch.setattr(swap, "SWAP_MIN_ROWS", 2)
    run()
    assert kept_partitions() == [partitions.name_for(DELIVERIES, days[2], "k")]
    assert _where(pg_runtime, "deliveries", few[1]) == "deliveries_default"

    # Too many kept partitions: the oldest goes, however many rows it holds.
    monkeypatch.setattr(drop, "MAX_KEPT_PARTITIONS", 0)
    run()
    assert kept_partitions() == []
    with pg_runtime.db.begin() as session:
        for _, delivery_id in (few, capped):
            assert _where(pg_runtime, "deliveries", delivery_id) == "deliveries_default"
            assert _attempts_of(session, delivery_id) == [1]
        assert finishing[0] not in _ids(session, Event)
    _nothing_left_of_a_swap(pg_runtime)


@pytest.mark.parametrize("way", ["swapped"], indirect=True)
def test_0024_down_puts_the_kept_partitions_rows_back_through_their_parents(
    pg_runtime, migrated, way
) -> None:
    t0, now = _a_past_day(pg_runtime)
    with pg_runtime.db.begin() as session:
        h = History(session)
        push = h.endpoint()
        kept = [h.story(push, RETRYING, t0 + n * timedelta(minutes=1)) for n in range(3)]
        h.story(push, SUCCEEDED, now - DAY)
    sequence(pg_runtime.db)
    purge.run(pg_runtime, now=now, sleep=lambda _s: None, kinds=[RetentionKind.EVENTS])
    assert _where(pg_runtime, "deliveries", kept[0][1]) == _kept_home(way, t0)

    def rows() -> tuple[list[Any], list[Any]]:
        with pg_runtime.db.engine.connect() as connection:
            return (
                connection.execute(text("SELECT * FROM deliveries ORDER BY id")).all(),
                connection.execute(text("SELECT * FROM attempts ORDER BY id")).all(),
            )

    before = rows()
    with migrated_back(migrated, "0023_attempt_keys_per_day"):
        assert rows() == before
        for _, delivery_id in kept:
            assert _where(pg_runtime, "deliveries", delivery_id) == "deliveries_default"
        with pg_runtime.db.engine.connect() as connection:
            assert partitions.partitions(connection, DELIVERIES, partitions.KEPT) == []
            assert not connection.execute(
                text("SELECT proname FROM pg_proc WHERE proname LIKE 'kurir_retention_%'")
            ).all()


@pytest.mark.parametrize("way", ["swapped"], indirect=True)
def test_what_a_dead_swap_left_never_fails_a_writer_and_is_undone_by_the_next_run(
    pg_runtime, way
) -> None:
    """A retention process that died between a swap's copy and its locked step left its
    triggers on the day, the default partitions' checks and the copies. Once the run that
    follows has removed the log (as it removes any table named as a day that is no longer a
    partition), the triggers do nothing: a write to the day still commits. That run then
    clears the day and drops it."""
    t0, now = _a_past_day(pg_runtime)
    with pg_runtime.db.begin() as session:
        h = History(session)
        push = h.endpoint()
        kept = h.story(push, RETRYING, t0)
        h.story(push, SUCCEEDED, now - DAY)
    sequence(pg_runtime.db)
    start = partitions.day_start(t0)
    day = partitions.Partition(DELIVERIES, partitions.name_for(DELIVERIES, start), start)
    with pg_runtime.db.engine.connect() as connection:
        with connection.begin():
            connection.execute(text("DROP TABLE IF EXISTS keep_ids"))
            connection.execute(
                text("CREATE TEMP TABLE keep_ids AS SELECT CAST(:i AS text) AS id"), {"i": kept[1]}
            )
        shadow = swap.prepare(connection, day, lambda _s: None)  # ... and the process died
        with connection.begin():
            connection.execute(text(f"DROP TABLE {shadow.changes}"))
    with pg_runtime.db.begin() as session:  # the triggers find no log: the write commits
        session.execute(update(Delivery).where(Delivery.id == kept[1]).values(attempt_count=5))
    with pytest.raises(AssertionError):
        _nothing_left_of_a_swap(pg_runtime)

    purge.run(pg_runtime, now=now, sleep=lambda _s: None, kinds=[RetentionKind.EVENTS])

    assert f"{t0:%Y-%m-%d}" not in _days(pg_runtime, DELIVERIES)
    assert _where(pg_runtime, "deliveries", kept[1]) == _kept_home(way, t0)
    with pg_runtime.db.begin() as session:
        assert session.get_one(Delivery, kept[1]).attempt_count == 5
    _nothing_left_of_a_swap(pg_runtime)


def test_an_event_made_at_the_horizon_keeps_its_deliveries_when_its_day_goes(
    pg_runtime, way
) -> None:
    """The row-level rule keeps an event made at or after the horizon. Its id comes from the
    same clock as its `created_at`, so the drop looks for one only among the ids of the last
    minutes before the horizon: here a day ending 5 minutes before it, and an event of its
    last minute stamped 1 minute after it (as a clock stepping back between the two could)."""
    t0, now = _a_past_day(pg_runtime)
    day_end = partitions.day_start(t0) + DAY
    horizon = day_end + timedelta(minutes=5)
    now = horizon + timedelta(days=pg_runtime.settings.retain_events_days)
    with pg_runtime.db.begin() as session:
        h = History(session)
        push = h.endpoint()
        late = h.story(push, SUCCEEDED, day_end - timedelta(minutes=1))
        session.execute(
            update(Event)
            .where(Event.id == late[0])
            .values(created_at=horizon + timedelta(minutes=1))
        )
        gone = h.story(push, SUCCEEDED, day_end - timedelta(minutes=2))
        h.story(push, SUCCEEDED, now - DAY)
    sequence(pg_runtime.db)

    dropped = list(drop.run(pg_runtime, RetentionKind.EVENTS, horizon, sleep=lambda _s: None))

    assert [d.day for d in dropped] == [partitions.day_start(t0)]
    with pg_runtime.db.begin() as session:
        assert late[1] in _ids(session, Delivery)
        assert gone[1] not in _ids(session, Delivery)


def test_a_locked_step_waits_briefly_for_locks_and_not_for_the_disk(pg_runtime) -> None:
    """Retention's locked transactions bound their lock waits and commit without waiting
    for the WAL flush, so the writers queued behind them go on at once; outside them the
    connection's own settings stand."""

    def settings() -> tuple[str, str]:
        return (
            connection.execute(text("SHOW lock_timeout")).scalar_one(),
            connection.execute(text("SHOW synchronous_commit")).scalar_one(),
        )

    with pg_runtime.db.engine.connect() as connection:
        with connection.begin():
            # A production server's default (the test server runs without the flush).
            connection.execute(text("SET synchronous_commit = on"))
            before = settings()
        inside = giveway.locked(connection, settings, sleep=lambda _s: None)
        with connection.begin():
            after = settings()
            connection.execute(text("RESET synchronous_commit"))

    assert inside == (f"{giveway.LOCK_TIMEOUT_MS}ms", "off")
    assert after == before
    assert before[1] == "on"
