"""Retention on both databases, with an injected clock: finished history past each kind's
horizon is purged in bounded batches, everything unfinished stays, the feed answers 410 with
the horizon behind a purge, and the marks show up in /metrics, /ui and `kurir db stats`."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import func, insert, select, text, update

from app.accounts import create_operator
from app.cli import cli
from app.clock import isoformat, parse_time, utcnow
from app.feed.sequencer import sequence
from app.ids import id_at
from app.lifecycle import marks, purge, stats
from app.models import (
    DEAD,
    DELIVERING,
    DL_DISCARDED,
    DL_OPEN,
    PENDING,
    RETRYING,
    SUCCEEDED,
    Attempt,
    AuditRecord,
    DeadLetter,
    DeadLetterAudit,
    Delivery,
    Endpoint,
    Event,
    FeedPurge,
    InboundEvent,
    InboundSource,
    OperationalEvent,
    Partner,
    ReconcileRequest,
    ResendJob,
)
from app.runtime import Runtime
from app.services import feed
from app.vocabulary import EndpointMode, RetentionKind
from app.web import metrics
from tests.integration.test_ui import EMAIL, PASSWORD, token
from tests.support.factories import wait_for
from tests.support.publish import error_of, make_endpoint, make_event_type, make_partner, order

DAY = timedelta(days=1)


def _quiet(_seconds: float) -> None:
    """No pause between batches: the tests count batches, they do not time them."""


def _run(runtime: Any, now: datetime, **kw: Any) -> purge.Report:
    return purge.run(runtime, now=now, sleep=_quiet, **kw)


# ---------------------------------------------------------------------------- rows at a time


class History:
    """Rows written straight to the store, each with the id and time of a given moment."""

    def __init__(self, session: Any, uid: str = "acme") -> None:
        self.s = session
        self.partner = Partner(uid=uid, name=uid.title())
        session.add(self.partner)
        session.flush()

    def endpoint(self, **fields: Any) -> Endpoint:
        endpoint = Endpoint(partner_id=self.partner.id, url="http://127.0.0.1:9/hook", **fields)
        self.s.add(endpoint)
        self.s.flush()
        return endpoint

    def event(self, at: datetime, type_: str = "order.created") -> Event:
        event = Event(
            id=id_at("evt", at),
            partner_id=self.partner.id,
            type=type_,
            version=1,
            data={},
            payload="{}",
            occurred_at=at,
            created_at=at,
        )
        self.s.add(event)
        self.s.flush()
        return event

    def delivery(
        self, event: Event, endpoint: Endpoint, state: str, at: datetime, **fields: Any
    ) -> Delivery:
        delivery = Delivery(
            id=id_at("dlv", at),
            event_id=event.id,
            endpoint_id=endpoint.id,
            state=state,
            created_at=at,
            updated_at=at,
            **fields,
        )
        self.s.add(delivery)
        self.s.flush()
        return delivery

    def attempt(self, delivery: Delivery, at: datetime, n: int = 1) -> Attempt:
        attempt = Attempt(
            id=id_at("att", at),
            delivery_id=delivery.id,
            n=n,
            started_at=at,
            duration_ms=5,
            url="http://127.0.0.1:9/hook",
            created_at=at,
        )
        self.s.add(attempt)
        self.s.flush()
        return attempt

    def letter(
        self, delivery: Delivery, state: str, at: datetime, resolved_at: datetime | None = None
    ) -> DeadLetter:
        letter = DeadLetter(
            id=id_at("dl", at),
            delivery_id=delivery.id,
            event_id=delivery.event_id,
            endpoint_id=delivery.endpoint_id,
            partner_id=self.partner.id,
            event_type="order.created",
            reason="exhausted",
            state=state,
            created_at=at,
            updated_at=at,
            resolved_at=resolved_at,
        )
        self.s.add(letter)
        self.s.flush()
        self.s.add(
            DeadLetterAudit(
                id=id_at("dla", at),
                dead_letter_id=letter.id,
                actor="ops",
                action="discard",
                outcome="ok",
                created_at=at,
            )
        )
        return letter

    def story(
        self,
        endpoint: Endpoint,
        state: str,
        at: datetime,
        *,
        letter: str | None = None,
        resolved_at: datetime | None = None,
        **fields: Any,
    ) -> tuple[str, str]:
        """An event with one delivery in `state`, one attempt, and maybe a dead letter."""
        event = self.event(at)
        delivery = self.delivery(event, endpoint, state, at, **fields)
        self.attempt(delivery, at)
        if letter is not None:
            self.letter(delivery, letter, resolved_at or at, resolved_at)
        return event.id, delivery.id


def _ids(session: Any, model: Any) -> set[str]:
    return set(session.scalars(select(model.id)))


# ---------------------------------------------------------------------------- what is purged


def test_finished_history_past_its_horizon_is_purged_and_everything_unfinished_stays(
    runtime, fk_triggers
):
    t0 = utcnow()
    now = t0 + 60 * DAY  # events, attempts, inbound: 30 days; letters 90; audit 365
    with runtime.db.begin() as session:
        h = History(session)
        push = h.endpoint()
        ordered = h.endpoint(ordering="key", on_dead="block")
        gone = {
            "succeeded": h.story(push, SUCCEEDED, t0),
            # closed 100 days before `now`: the letter goes, then its event
            "closed_long_ago": h.story(
                push, DEAD, t0 - 40 * DAY, letter=DL_DISCARDED, resolved_at=t0 - 40 * DAY
            ),
        }
        kept = {
            "pending": h.story(push, PENDING, t0),
            "delivering": h.story(push, DELIVERING, t0),
            "retrying": h.story(push, RETRYING, t0),
            "open_letter": h.story(push, DEAD, t0, letter=DL_OPEN),
            "closed_recently": h.story(push, DEAD, t0, letter=DL_DISCARDED, resolved_at=t0),
            # an ordered key: the first dead with its letter open (on_dead: block), the
            # second held behind it
            "key_blocker": h.story(
                ordered, DEAD, t0, letter=DL_OPEN, ordering_key="k", ordering_seq=1
            ),
            "key_held": h.story(ordered, PENDING, t0, ordering_key="k", ordering_seq=2),
            "young": h.story(push, SUCCEEDED, now - 5 * DAY),
        }
        mixed = h.event(t0)
        h.delivery(mixed, push, SUCCEEDED, t0)
        h.delivery(mixed, ordered, RETRYING, t0)
        kept["mixed"] = (mixed.id, "")
        old_audit, young_audit = id_at("aud", t0 - 310 * DAY), id_at("aud", t0)
        for audit_id, at in ((old_audit, t0 - 310 * DAY), (young_audit, t0)):
            session.add(
                AuditRecord(
                    id=audit_id,
                    actor="cli",
                    action="x",
                    subject_type="x",
                    subject_id="x",
                    created_at=at,
                )
            )
        session.add(
            OperationalEvent(id=id_at("ope", t0 - 310 * DAY), kind="x", created_at=t0 - 310 * DAY)
        )
        source = InboundSource(name="psp", scheme="standard")
        session.add(source)
        session.flush()
        inbound = {
            status: id_at("ine", t0)
            for status in ("applied", "ignored", "quarantined", "failed", "received")
        }
        for status, inbound_id in inbound.items():
            session.add(
                InboundEvent(
                    id=inbound_id,
                    source_id=source.id,
                    event_id=status,
                    status=status,
                    raw_body=b"{}",
                    received_at=t0,
                    updated_at=t0,
                )
            )
        session.add(
            ReconcileRequest(
                id=id_at("rcn", t0), source_id=source.id, state="done", created_at=t0, updated_at=t0
            )
        )
        pending_reconcile = id_at("rcn", t0)
        session.add(
            ReconcileRequest(
                id=pending_reconcile,
                source_id=source.id,
                state="pending",
                created_at=t0,
                updated_at=t0,
            )
        )
        for state, finished in (("succeeded", t0 - 40 * DAY), ("running", None)):
            session.add(
                ResendJob(
                    id=id_at("bop", t0 - 40 * DAY),
                    kind="resend",
                    actor="ops",
                    state=state,
                    finished_at=finished,
                    created_at=t0 - 40 * DAY,
                )
            )
    sequence(runtime.db)

    report = _run(runtime, now)

    with runtime.db.begin() as session:
        events = _ids(session, Event)
        assert events == {event_id for event_id, _ in kept.values()}
        deliveries = _ids(session, Delivery)
        assert not deliveries & {d for _, d in gone.values()}
        assert {d for _, d in kept.values() if d} <= deliveries
        letters = {row.delivery_id: row.state for row in session.scalars(select(DeadLetter))}
        assert letters == {
            kept["open_letter"][1]: DL_OPEN,
            kept["closed_recently"][1]: DL_DISCARDED,
            kept["key_blocker"][1]: DL_OPEN,
        }
        assert session.scalar(select(func.count()).select_from(DeadLetterAudit)) == 3
        # Attempts of finished deliveries go after their own period, even where the event
        # stays (its closed letter is kept longer); attempts of unfinished ones stay.
        attempted = set(session.scalars(select(Attempt.delivery_id)))
        assert attempted == {
            kept[name][1]
            for name in ("pending", "delivering", "retrying", "open_letter", "key_blocker")
        } | {kept["key_held"][1], kept["young"][1]}
        assert _ids(session, AuditRecord) == {young_audit}
        assert session.scalar(select(func.count()).select_from(OperationalEvent)) == 0
        assert _ids(session, InboundEvent) == {
            inbound[s] for s in ("quarantined", "failed", "received")
        }
        assert _ids(session, ReconcileRequest) == {pending_reconcile}
        assert set(session.scalars(select(ResendJob.state))) == {"running"}

    assert report.purged == {
        RetentionKind.DEAD_LETTERS: 2,  # the old closed letter and the finished bulk resend
        # succeeded's, closed_recently's, and closed_long_ago's (its letter went first)
        RetentionKind.ATTEMPTS: 3,
        RetentionKind.EVENTS: 2,
        RetentionKind.INBOUND: 3,  # applied, ignored, the finished reconcile request
        RetentionKind.AUDIT: 2,
    }
    with runtime.db.begin() as session:
        found = {m.kind: m for m in marks.read(session)}
    assert found[RetentionKind.EVENTS].purged_total == 2
    assert found[RetentionKind.EVENTS].horizon == now - 30 * DAY
    assert found[RetentionKind.AUDIT].oldest_kept_at == t0

    # A second run finds nothing more; the totals stay.
    again = _run(runtime, now)
    assert again.total == 0
    with runtime.db.begin() as session:
        found = {m.kind: m for m in marks.read(session)}
    assert found[RetentionKind.EVENTS].purged_total == 2
    assert found[RetentionKind.EVENTS].last_purged == 0


def test_a_pull_endpoints_unacknowledged_events_stay_and_its_lag_counts_only_what_is_kept(
    runtime,
):
    t0 = utcnow()
    with runtime.db.begin() as session:
        h = History(session)
        pull = h.endpoint(mode=EndpointMode.PULL, event_types=["order.created"])
        pull.url = ""
        # in this order of ids, so of feed positions (the last, the head, is always kept)
        other = h.event(t0, "order.shipped")
        first, second, third = (h.event(t0 + (n + 1) * timedelta(milliseconds=1)) for n in range(3))
        gone_pull = h.endpoint(mode=EndpointMode.PULL, deleted_at=t0)
        gone_pull.url = ""
        pull_id = pull.id
    sequence(runtime.db)
    with runtime.db.begin() as session:
        acked = session.get_one(Event, first.id).feed_seq
        session.execute(update(Endpoint).where(Endpoint.id == pull_id).values(acked_seq=acked))

    report = _run(runtime, t0 + 60 * DAY)

    assert report.purged[RetentionKind.EVENTS] == 2
    with runtime.db.begin() as session:
        # the acknowledged one and the type it does not subscribe to are gone; a deleted
        # pull endpoint holds nothing back
        assert _ids(session, Event) == {second.id, third.id}
        endpoint = session.get_one(Endpoint, pull_id)
        lag = feed.lag_of(session, runtime.settings, endpoint)
        assert lag is not None and lag.events == 2
        purged = {row.event_type: row.purged_seq for row in session.scalars(select(FeedPurge))}
        assert set(purged) == {"order.created", "order.shipped"}
        assert purged["order.created"] == acked
    del other


# ---------------------------------------------------------------------------- bounded batches


def _audit_rows(runtime: Any, n: int, at: datetime) -> None:
    with runtime.db.begin() as session:
        session.add_all(
            AuditRecord(
                id=id_at("aud", at),
                actor="cli",
                action="x",
                subject_type="x",
                subject_id=str(i),
                created_at=at,
            )
            for i in range(n)
        )


def _costing(runtime: Any, ms_per_row: float) -> Any:
    """A timer on which a batch takes `ms_per_row` for every row it deleted: the sizing sees
    a database of known speed, whatever this machine's."""
    start = _audit_count(runtime)

    def timer() -> float:
        return (start - _audit_count(runtime)) * ms_per_row / 1000.0

    return timer


def _audit_count(runtime: Any) -> int:
    with runtime.db.Session() as session:
        return int(session.scalar(select(func.count()).select_from(AuditRecord)))


def test_batches_are_sized_to_stay_within_the_time_budget(runtime):
    t0 = utcnow()
    _audit_rows(runtime, 400, t0)
    now = t0 + 400 * DAY

    report = _run(
        runtime,
        now,
        budget_ms=50,
        timer=_costing(runtime, ms_per_row=1.0),
        kinds=[RetentionKind.AUDIT],
    )

    batches = [b for b in report.batches if b.source == "audit_records"]
    assert sum(b.purged for b in batches) == 400
    # 1 ms a row, 50 ms a batch: never more than 50 rows in one, so at least 8 batches.
    assert max(b.examined for b in batches) <= 50
    assert all(b.elapsed_ms <= 50 for b in batches)
    assert len(batches) >= 8
    assert _audit_count(runtime) == 0


def test_a_faster_database_gets_larger_batches(runtime):
    t0 = utcnow()
    _audit_rows(runtime, 400, t0)

    report = _run(
        runtime,
        t0 + 400 * DAY,
        budget_ms=50,
        timer=_costing(runtime, ms_per_row=0.05),
        kinds=[RetentionKind.AUDIT],
    )

    batches = [b for b in report.batches if b.source == "audit_records"]
    # 50, 100, 200, then the rest: each batch twice the last while well within budget.
    assert [b.examined for b in batches][:3] == [50, 100, 200]
    assert len(batches) == 4


@pytest.mark.parametrize("setting", [None, 3])
def test_after_each_batch_retention_pauses_its_yield_times_as_long(runtime, setting):
    """On SQLite a batch holds the only writer: a hundred times its time to the writers by
    default; on PostgreSQL, as long as the batch. KURIR_RETENTION_YIELD overrides both."""
    t0 = utcnow()
    _audit_rows(runtime, 200, t0)
    configured = Runtime(replace(runtime.settings, retention_yield=setting), database=runtime.db)
    slept: list[float] = []

    report = purge.run(
        configured,
        now=t0 + 400 * DAY,
        budget_ms=50,
        timer=_costing(runtime, ms_per_row=1.0),
        sleep=slept.append,
        kinds=[RetentionKind.AUDIT],
    )

    factor = setting or (1 if runtime.db.is_postgres else 100)
    batches = [b for b in report.batches if b.source == "audit_records"]
    # Every batch but the last (which found fewer rows than asked) is followed by its pause.
    assert len(batches) >= 4
    assert slept == pytest.approx([b.elapsed_ms * factor / 1000.0 for b in batches[:-1]])


def test_a_table_of_unfinished_rows_is_passed_over_in_bounded_batches(runtime):
    """Rows kept back are never read twice in one run: 120 pending deliveries' events cost a
    fixed number of batches and no row is purged."""
    t0 = utcnow()
    with runtime.db.begin() as session:
        h = History(session)
        push = h.endpoint()
        for _ in range(120):
            h.delivery(h.event(t0), push, PENDING, t0)
    sequence(runtime.db)

    report = _run(runtime, t0 + 60 * DAY, kinds=[RetentionKind.EVENTS])

    batches = [b for b in report.batches if b.source == "events"]
    assert sum(b.examined for b in batches) == 120
    assert report.purged[RetentionKind.EVENTS] == 0


def test_a_delivery_made_for_an_event_while_a_batch_purges_it_keeps_the_event(runtime):
    """A delivery written for an old event while retention's batch has it in hand, committed
    once the batch waits for it (no path of Kurir's writes one today, but the foreign key
    allows it): the batch locks its events before it decides, so it sees the new delivery
    and keeps the event. Were the event deleted anyway, the new delivery would go with it by
    the cascade (as it did before the lock), or, with the foreign-key triggers skipped, be
    left without its event."""
    if not runtime.db.is_postgres:
        pytest.skip("PostgreSQL: on SQLite the batch holds the one writer lock")
    # Two months back: a day without a partition of its own (its rows are in the default
    # one), so this is the row-level batch's doing, not a drop's.
    later = utcnow()
    t0 = later - 60 * DAY
    with runtime.db.begin() as session:
        h = History(session)
        endpoint = h.endpoint()
        event_id, _ = h.story(endpoint, SUCCEEDED, t0)
        h.story(endpoint, SUCCEEDED, t0 + timedelta(seconds=1))  # the feed's head, kept
        endpoint_id = endpoint.id
    sequence(runtime.db)
    replayed = id_at("dlv", later)

    with runtime.db.engine.connect() as other:
        other.begin()
        other.execute(
            insert(Delivery).values(
                id=replayed,
                event_id=event_id,
                endpoint_id=endpoint_id,
                state=PENDING,
                created_at=later,
                updated_at=later,
            )
        )
        ours = other.execute(text("SELECT pg_backend_pid()")).scalar_one()
        reports: list[purge.Report] = []
        batch = threading.Thread(
            target=lambda: reports.append(_run(runtime, later, kinds=[RetentionKind.EVENTS]))
        )
        batch.start()
        try:
            wait_for(
                lambda: _waiting_on_a_lock(runtime, "%FROM events%", but=ours),
                message="the events batch to wait for the uncommitted delivery's lock",
            )
            other.commit()
        finally:
            if other.in_transaction():
                other.rollback()
            batch.join(60)
    assert not batch.is_alive() and reports

    with runtime.db.begin() as session:
        assert session.get(Event, event_id) is not None
        assert session.get(Delivery, replayed) is not None
        assert session.scalar(select(func.count()).select_from(Delivery)) == 3


def test_the_events_batch_deletes_every_row_that_refers_to_its_events(runtime):
    """The events batch deletes a purged event's referring rows itself and (where the role
    may) skips the foreign-key triggers that would cascade: a table that comes to refer to
    events or deliveries must be handled there too, or its rows would be left pointing at
    nothing. This lists the foreign keys into both as the batch knows them."""
    if not runtime.db.is_postgres:
        pytest.skip("PostgreSQL: only there are the triggers skipped")
    with runtime.db.engine.connect() as connection:
        # A partition's own key is named by its parents (attempts' keys are per day).
        referring = {
            (target, source)
            for target, source in connection.execute(
                text(
                    "SELECT coalesce(tp.inhparent, c.confrelid)::regclass::text, "
                    "coalesce(sp.inhparent, c.conrelid)::regclass::text "
                    "FROM pg_constraint c "
                    "LEFT JOIN pg_inherits sp ON sp.inhrelid = c.conrelid "
                    "LEFT JOIN pg_inherits tp ON tp.inhrelid = c.confrelid "
                    "WHERE c.contype = 'f' AND c.conparentid = 0 "
                    "AND coalesce(tp.inhparent, c.confrelid) "
                    "IN ('events'::regclass, 'deliveries'::regclass)"
                )
            )
        }
    assert referring == {
        ("events", "deliveries"),  # deleted by their ids, with their attempts
        ("events", "dead_letters"),  # any letter holds its event
        ("events", "event_versions"),  # deleted with their event
        ("deliveries", "attempts"),  # deleted with their delivery
    }


def _waiting_on_a_lock(runtime: Runtime, query: str, but: int) -> bool:
    """Whether a backend of the test's database (not `but`) waits on a lock in a statement
    like `query`."""
    with runtime.db.engine.connect() as connection:
        return bool(
            connection.execute(
                text(
                    "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND pid <> :but AND query ILIKE :query"
                ),
                {"but": but, "query": query},
            ).first()
        )


def test_the_scheduler_runs_retention(runtime):
    from app.processes.scheduler import periodic_jobs, run_retention

    jobs = {job.name: job.run for job in periodic_jobs(runtime)}
    assert jobs["retention"] is run_retention
    assert "purge-dead-letters" not in jobs


# ---------------------------------------------------------------------------- the feed


@pytest.fixture
def acme(client, auth):
    make_event_type(client, auth)
    make_event_type(client, auth, name="order.shipped")
    make_partner(client, auth, "acme")
    return "acme"


def _publish(client: Any, auth: dict[str, str], n: int, order_id: str | None = None) -> None:
    for i in range(n):
        answer = client.post(
            "/v1/partners/acme/events", headers=auth, json=order(order_id or f"o-{i}")
        )
        assert answer.status_code == 202, answer.get_json()


def test_a_cursor_behind_a_purge_is_cursor_expired_with_the_horizon(client, auth, acme, runtime):
    _publish(client, auth, 3)
    first = client.get("/v1/partners/acme/feed?limit=1", headers=auth)
    assert first.status_code == 200
    behind = first.get_json()["next_cursor"]
    whole = client.get("/v1/partners/acme/feed", headers=auth)
    latest = whole.get_json()["next_cursor"]
    now = utcnow() + 60 * DAY

    report = _run(runtime, now)
    # the newest stays: it holds the feed's head, which positions are given on from
    assert report.purged[RetentionKind.EVENTS] == 2

    answer = client.get(f"/v1/partners/acme/feed?after={behind}", headers=auth)
    assert answer.status_code == 410
    error = error_of(answer)
    assert error["code"] == "cursor_expired"
    assert abs(parse_time(error["details"]["horizon"]) - (now - 30 * DAY)) < timedelta(seconds=1)
    # without a cursor the feed simply starts at what is kept
    fresh = client.get("/v1/partners/acme/feed", headers=auth)
    assert fresh.status_code == 200
    assert [e["data"]["order_id"] for e in fresh.get_json()["data"]] == ["o-2"]

    # positions are never given twice: a cursor from before the purge sees what comes after
    _publish(client, auth, 1, order_id="o-3")
    later = client.get(f"/v1/partners/acme/feed?after={latest}", headers=auth)
    assert [e["data"]["order_id"] for e in later.get_json()["data"]] == ["o-3"]

    # and acknowledging that cursor is refused alike
    pull = make_endpoint(client, auth, url=None, mode="pull")
    ack = client.post(
        f"/v1/partners/acme/endpoints/{pull['id']}/ack", headers=auth, json={"cursor": behind}
    )
    assert ack.status_code == 410
    assert error_of(ack)["code"] == "cursor_expired"


def test_a_pull_endpoint_behind_a_purge_gets_backlog_expired_until_it_skips(
    client, auth, acme, runtime
):
    pull = make_endpoint(client, auth, url=None, mode="pull", event_types=["order.shipped"])
    _publish(client, auth, 3)  # not its types: finished history, purged (but the head)
    sequence(runtime.db)
    now = utcnow() + 60 * DAY
    assert _run(runtime, now).purged[RetentionKind.EVENTS] == 2

    widened = client.patch(
        f"/v1/partners/acme/endpoints/{pull['id']}",
        headers=auth,
        json={"event_types": ["order.created", "order.shipped"]},
    )
    assert widened.status_code == 200, widened.get_json()
    answer = client.get(f"/v1/partners/acme/feed?endpoint={pull['id']}", headers=auth)
    assert answer.status_code == 410
    error = error_of(answer)
    assert error["code"] == "backlog_expired"
    assert error["details"]["horizon"] == isoformat(now - 30 * DAY)

    skipped = client.post(
        f"/v1/partners/acme/endpoints/{pull['id']}/skip-expired", headers=auth, json={}
    )
    assert skipped.status_code == 200, skipped.get_json()
    after = client.get(f"/v1/partners/acme/feed?endpoint={pull['id']}", headers=auth)
    assert after.status_code == 200
    assert [e["data"]["order_id"] for e in after.get_json()["data"]] == ["o-2"]


# ---------------------------------------------------------------------------- seeing it


def test_metrics_ui_and_db_stats_show_what_was_purged(client, runtime, settings):
    t0 = utcnow()
    _audit_rows(runtime, 3, t0)
    _audit_rows(runtime, 1, t0 + 300 * DAY)
    _run(runtime, t0 + 400 * DAY)

    metrics.cache_of(client.application).clear()
    text = client.get("/metrics").get_data(as_text=True)
    assert 'kurir_retention_rows_purged_total{kind="audit"} 3' in text
    assert 'kurir_retention_rows_purged_total{kind="events"} 0' in text
    assert 'kurir_retention_oldest_row_age_seconds{kind="audit"}' in text

    env = {
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": settings.redis_url,
        "KURIR_DATA_DIR": str(settings.data_dir),
        "KURIR_SECRET_KEY": settings.secret_key,
    }
    result = CliRunner().invoke(cli, ["db", "stats", "--json"], env=env)
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    audit = next(k for k in stats["retention"] if k["kind"] == "audit")
    assert audit["rows_purged"] == 3 and audit["days"] == 365
    assert abs(parse_time(audit["oldest_kept_at"]) - (t0 + 300 * DAY)) < timedelta(seconds=1)
    rows = {t["table"]: t for t in stats["tables"]}
    assert rows["audit_records"]["rows"] == 1 and rows["audit_records"]["rows_exact"] is True
    if runtime.settings.is_sqlite:
        assert rows["audit_records"]["bytes"] is None
    else:
        assert rows["audit_records"]["bytes"] > 0
    plain = CliRunner().invoke(cli, ["db", "stats"], env=env)
    assert plain.exit_code == 0 and "audit_records" in plain.stdout and "KIND" in plain.stdout

    with runtime.db.begin() as session:
        create_operator(session, EMAIL, PASSWORD)
    login = client.post(
        "/ui/login", data={"email": EMAIL, "password": PASSWORD, "csrf_token": token(client)}
    )
    assert login.status_code == 302
    page = client.get("/ui/storage").get_data(as_text=True)
    assert 'data-testid="kind-audit"' in page and "365 days" in page
    assert 'data-testid="table-audit_records"' in page


def test_a_large_table_shows_its_estimate_not_a_count(client, runtime, settings, monkeypatch):
    """On PostgreSQL a table the statistics put at `stats.EXACT_BELOW` rows or more is not
    counted (a month of deliveries would be read whole on every view): `kurir db stats` and
    the storage page show the estimate, marked as one. Smaller tables, and every table on
    SQLite, are counted."""
    if runtime.settings.is_sqlite:
        pytest.skip("PostgreSQL only: SQLite keeps no row estimates, every table is counted")
    _audit_rows(runtime, 3, utcnow())
    with runtime.db.engine.begin() as connection:
        connection.execute(text("ANALYZE audit_records"))
    env = {
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": settings.redis_url,
        "KURIR_DATA_DIR": str(settings.data_dir),
        "KURIR_SECRET_KEY": settings.secret_key,
    }

    def audit_stat() -> dict[str, Any]:
        result = CliRunner().invoke(cli, ["db", "stats", "--json"], env=env)
        assert result.exit_code == 0, result.output
        return next(t for t in json.loads(result.stdout)["tables"] if t["table"] == "audit_records")

    counted = audit_stat()
    monkeypatch.setattr(stats, "EXACT_BELOW", 3)
    estimated = audit_stat()
    plain = CliRunner().invoke(cli, ["db", "stats"], env=env).stdout
    with runtime.db.begin() as session:
        create_operator(session, EMAIL, PASSWORD)
    client.post(
        "/ui/login", data={"email": EMAIL, "password": PASSWORD, "csrf_token": token(client)}
    )
    page = client.get("/ui/storage").get_data(as_text=True)

    assert (counted["rows"], counted["rows_exact"]) == (3, True)
    assert estimated["rows_exact"] is False and estimated["rows"] >= 3
    assert f"~{estimated['rows']}" in plain.split("audit_records", 1)[1].splitlines()[0]
    row = page.split('data-testid="table-audit_records"', 1)[1].split("</tr>", 1)[0]
    assert "≈ " in row
