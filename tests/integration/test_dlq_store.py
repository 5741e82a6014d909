"""The dead-letter store on both databases: search filters, resend, discard."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from rq import Queue
from sqlalchemy import func, select, text

from app.clock import utcnow
from app.errors import BadRequest, Conflict, NotFound, ValidationFailed
from app.models import (
    DL_DISCARDED,
    DL_OPEN,
    DL_RESENT,
    DeadLetter,
    DeadLetterAudit,
    Delivery,
)
from app.queues import DEFAULT, DELIVERIES, DLQ_BULK_RESEND
from dlq import discard as discard_mod
from dlq import resend
from dlq.search import DeadLetterFilter, conditions, search
from tests.support.dlq_factories import letters_for, make_scene


def _ids(runtime, flt: DeadLetterFilter, limit: int = 250) -> set[str]:
    with runtime.db.begin() as session:
        page = search(session, flt, limit=limit)
        return {letter.id for letter in page.letters}


@pytest.fixture
def two_partners(runtime):
    with runtime.db.begin() as session:
        acme = make_scene(session, runtime.secret_box, uid="acme")
        globex = make_scene(session, runtime.secret_box, uid="globex")
        a = letters_for(
            session,
            acme,
            3,
            type="order.created",
            data=lambda i: {"colour": ["crimson", "teal", "amber"][i], "n": i},
            status_code=500,
            error="http_500",
        )
        b = letters_for(
            session,
            globex,
            2,
            type="invoice.paid",
            data=lambda i: {"note": f"percent 100%_{i}", "city": "Zagreb"},
            status_code=None,
            error="connection_refused",
            reason="endpoint_disabled",
        )
    return acme, globex, a, b


# ------------------------------------------------------------------------------- search


def test_each_filter_narrows_to_exactly_its_matches(runtime, two_partners):
    acme, globex, a, b = two_partners
    assert _ids(runtime, DeadLetterFilter()) == set(a) | set(b)
    assert _ids(runtime, DeadLetterFilter(partner="acme")) == set(a)
    assert _ids(runtime, DeadLetterFilter(partner="nobody")) == set()
    assert _ids(runtime, DeadLetterFilter(endpoint=globex.endpoint_id)) == set(b)
    assert _ids(runtime, DeadLetterFilter(type="invoice.paid")) == set(b)
    assert _ids(runtime, DeadLetterFilter(reason="endpoint_disabled")) == set(b)
    assert _ids(runtime, DeadLetterFilter.from_params({"status_code": "500"})) == set(a)
    assert _ids(runtime, DeadLetterFilter.from_params({"status_code": "none"})) == set(b)
    assert _ids(runtime, DeadLetterFilter(error="REFUSED")) == set(b)
    assert _ids(runtime, DeadLetterFilter(state=DL_OPEN)) == set(a) | set(b)
    assert _ids(runtime, DeadLetterFilter(state=DL_RESENT)) == set()


def test_q_finds_words_in_the_payload_case_insensitively_and_literally(runtime, two_partners):
    _, _, a, b = two_partners
    assert _ids(runtime, DeadLetterFilter(q="TEAL")) == {a[1]}
    assert _ids(runtime, DeadLetterFilter(q="zagreb")) == set(b)
    # Every word must match; LIKE wildcards in the query are literal characters.
    assert _ids(runtime, DeadLetterFilter(q="zagreb 100%_1")) == {b[1]}
    assert _ids(runtime, DeadLetterFilter(q="100_")) == set()
    assert _ids(runtime, DeadLetterFilter(q="%")) == set(b)  # only b has a literal %
    assert _ids(runtime, DeadLetterFilter(q='"percent 100"')) == set(b)
    assert _ids(runtime, DeadLetterFilter(q="crimson", partner="globex")) == set()


def test_since_and_until_bound_the_creation_time(runtime, two_partners):
    _, _, a, b = two_partners
    old = utcnow() - timedelta(days=3)
    with runtime.db.begin() as session:
        session.get_one(DeadLetter, a[0]).created_at = old
    recent = DeadLetterFilter(since=utcnow() - timedelta(days=1))
    assert _ids(runtime, recent) == (set(a) | set(b)) - {a[0]}
    assert _ids(runtime, DeadLetterFilter(until=utcnow() - timedelta(days=1))) == {a[0]}


def test_cursor_pagination_walks_every_letter_once_newest_first(runtime):
    with runtime.db.begin() as session:
        scene = make_scene(session, runtime.secret_box)
        ids = letters_for(session, scene, 7)
    seen: list[str] = []
    cursor = None
    while True:
        with runtime.db.begin() as session:
            page = search(session, DeadLetterFilter(), limit=3, cursor=cursor)
            seen += [letter.id for letter in page.letters]
            assert page.partner_uids == {scene.partner_id: scene.partner_uid}
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == sorted(ids, reverse=True)


@pytest.mark.parametrize(
    ("params", "parameter"),
    [
        ({"status_code": "abc"}, "status_code"),
        ({"status_code": "999"}, "status_code"),
        ({"since": "yesterday"}, "since"),
        ({"state": "gone"}, "state"),
        ({"q": " ".join(["w"] * 11)}, "q"),
    ],
)
def test_malformed_filters_are_rejected_naming_the_parameter(params, parameter):
    with pytest.raises(BadRequest) as info:
        DeadLetterFilter.from_params(params)
    assert info.value.details["parameter"] == parameter
    assert set(info.value.details["errors"]) == {parameter}


def test_every_unreadable_field_is_named_and_the_rest_is_kept():
    """A form marks each bad field and keeps the good ones; nothing may act on the rest."""
    flt, errors = DeadLetterFilter.parse(
        {
            "partner": "acme",
            "since": "yesterday",
            "status_code": "five hundred",
            "type": "order.paid",
        }
    )
    assert set(errors) == {"since", "status_code"}
    assert (flt.partner, flt.type, flt.since, flt.status_code) == ("acme", "order.paid", None, None)


def test_filter_round_trips_through_its_params():
    flt = DeadLetterFilter.from_params(
        {"partner": "acme", "status_code": "none", "since": "2026-01-02T03:04:05Z", "q": "a b"}
    )
    assert DeadLetterFilter.from_params(flt.to_params()) == flt
    with pytest.raises(BadRequest):
        DeadLetterFilter.from_params({"partnr": "acme"}, strict=True)


def test_postgres_q_search_uses_the_trigram_index(runtime):
    if not runtime.db.is_postgres:
        pytest.skip("trigram index exists only on PostgreSQL")
    with runtime.db.begin() as session:
        scene = make_scene(session, runtime.secret_box)
        letters_for(session, scene, 3, data=lambda i: {"word": f"needle{i}"})
        endpoint_id, partner_id = scene.endpoint_id, scene.partner_id
        # A seeded table big enough for the planner to care, built in one statement.
        delivery_id = session.scalar(select(Delivery.id).limit(1))
        event_id = session.scalar(select(DeadLetter.event_id).limit(1))
        session.execute(
            text("""
            INSERT INTO dead_letters (id, delivery_id, event_id, endpoint_id, partner_id,
                event_type, reason, search_text, state, created_at, updated_at)
            SELECT 'dl_seed' || lpad(g::text, 8, '0'), :d, :e, :ep, :p, 'order.created',
                'retries_exhausted', '{"data":{"filler":"' || md5(g::text) || '"}}',
                'resent', now(), now()
            FROM generate_series(1, 50000) AS g"""),
            {"d": delivery_id, "e": event_id, "ep": endpoint_id, "p": partner_id},
        )
        session.execute(text("ANALYZE dead_letters"))
    flt = DeadLetterFilter(q="needle1")
    with runtime.db.begin() as session:
        stmt = select(DeadLetter.id).where(*conditions(flt))
        stmt = stmt.order_by(DeadLetter.id.desc()).limit(51)
        compiled = stmt.compile(session.bind)
        rows = session.connection().exec_driver_sql(f"EXPLAIN {compiled}", compiled.params)
        plan = "\n".join(row[0] for row in rows)
        assert "ix_dead_letters_search_trgm" in plan, plan
        assert "Seq Scan" not in plan, plan
        assert [letter.id for letter in search(session, flt, limit=50).letters]


# ------------------------------------------------------------------------------- resend


def _queued_delivery_ids(redis_client) -> list[str]:
    queue = Queue(DELIVERIES, connection=redis_client)
    ids: list[str] = []
    for job in queue.get_jobs():
        ids += list(job.args[0])
    return ids


def test_resend_gives_a_fresh_run_and_enqueues_after_commit(runtime, redis_client):
    with runtime.db.begin() as session:
        scene = make_scene(session, runtime.secret_box)
        (letter_id,) = letters_for(session, scene, 1, attempts=3)
    with runtime.db.begin() as session:
        letter = resend.resend_one(session, runtime.redis, letter_id, actor="ops@example.com")
        delivery_id = letter.delivery_id
        assert _queued_delivery_ids(redis_client) == []  # not before the commit
    assert _queued_delivery_ids(redis_client) == [delivery_id]
    with runtime.db.begin() as session:
        letter = session.get_one(DeadLetter, letter_id)
        delivery = session.get_one(Delivery, delivery_id)
        assert letter.state == DL_RESENT and letter.resolved_at is not None
        assert (delivery.state, delivery.run, delivery.run_attempts) == ("pending", 2, 0)
        assert delivery.attempt_count == 3  # history is kept
        assert delivery.lease_expires_at is None
        assert delivery.next_attempt_at <= utcnow()
        audit = [(a.actor, a.action, a.outcome) for a in letter.audit]
        assert audit[-1] == ("ops@example.com", "resend", "resent as run 2")
        assert audit[0][1] == "park"


def test_resend_of_a_letter_that_is_not_open_is_a_conflict(runtime):
    with runtime.db.begin() as session:
        scene = make_scene(session, runtime.secret_box)
        (letter_id,) = letters_for(session, scene, 1)
    with runtime.db.begin() as session:
        resend.resend_one(session, runtime.redis, letter_id, actor="a")
    with pytest.raises(Conflict) as info, runtime.db.begin() as session:
        resend.resend_one(session, runtime.redis, letter_id, actor="b")
    assert info.value.code == "dead_letter_not_open"
    with pytest.raises(NotFound), runtime.db.begin() as session:
        resend.resend_one(session, runtime.redis, "dl_missing", actor="b")


def test_resend_to_a_disabled_endpoint_needs_force(runtime):
    with runtime.db.begin() as session:
        scene = make_scene(session, runtime.secret_box, state="disabled")
        (letter_id,) = letters_for(session, scene, 1, reason="endpoint_disabled")
    with pytest.raises(Conflict) as info, runtime.db.begin() as session:
        resend.resend_one(session, runtime.redis, letter_id, actor="a")
    assert info.value.code == "endpoint_disabled"
    with runtime.db.begin() as session:
        assert session.get_one(DeadLetter, letter_id).state == DL_OPEN
        letter = resend.resend_one(session, runtime.redis, letter_id, actor="a", force=True)
        assert letter.state == DL_RESENT
        assert "forced" in letter.audit[-1].outcome


def test_two_operators_resending_at_once_make_one_new_run(runtime):
    with runtime.db.begin() as session:
        scene = make_scene(session, runtime.secret_box)
        letter_ids = letters_for(session, scene, 5)
    barrier = threading.Barrier(2)
    outcomes: list[str] = []
    lock = threading.Lock()

    def operator(name: str) -> None:
        for letter_id in letter_ids:
            barrier.wait(10)
            try:
                with runtime.db.begin() as session:
                    resend.resend_one(session, runtime.redis, letter_id, actor=name)
                result = "won"
            except Conflict as exc:
                result = exc.code
            with lock:
                outcomes.append(result)

    threads = [threading.Thread(target=operator, args=(n,)) for n in ("alice", "bob")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["dead_letter_not_open"] * 5 + ["won"] * 5
    with runtime.db.begin() as session:
        runs = session.scalars(select(Delivery.run)).all()
        assert sorted(runs) == [2] * 5
        resends = session.scalar(
            select(func.count())
            .select_from(DeadLetterAudit)
            .where(DeadLetterAudit.action == "resend")
        )
        assert resends == 5


def test_bulk_resend_by_filter_runs_in_pages_and_reports_progress(runtime, redis_client):
    with runtime.db.begin() as session:
        scene = make_scene(session, runtime.secret_box)
        off = make_scene(session, runtime.secret_box, state="disabled")
        wanted = letters_for(session, scene, 7, type="order.created")
        letters_for(session, scene, 2, type="other.type")
        refused = letters_for(session, off, 2, type="order.created")
    with runtime.db.begin() as session:
        resend_job = resend.start_bulk(
            session,
            actor="ops",
            flt=DeadLetterFilter(type="order.created"),
            connection=runtime.redis,
        )
        resend_job_id = resend_job.id
        assert resend_job.total == 9
    jobs = Queue(DEFAULT, connection=redis_client).get_jobs()
    assert [(j.func_name, j.args) for j in jobs] == [(DLQ_BULK_RESEND, (resend_job_id,))]
    seen: list[int] = []
    done = resend.run_bulk(runtime, resend_job_id, page_size=4, progress=seen.append)
    assert seen == [4, 4, 1]
    assert (done.state, done.total, done.done, done.failed) == ("succeeded", 9, 7, 2)
    assert done.params["skipped"] == {"endpoint_disabled": 2}
    with runtime.db.begin() as session:
        states = dict(session.execute(select(DeadLetter.id, DeadLetter.state)).all())
        assert {i for i, s in states.items() if s == DL_RESENT} == set(wanted)
        assert all(states[i] == DL_OPEN for i in refused)
        skipped_audit = session.scalars(
            select(DeadLetterAudit.outcome).where(
                DeadLetterAudit.dead_letter_id == refused[0], DeadLetterAudit.action == "resend"
            )
        ).all()
        assert skipped_audit == ["skipped: endpoint_disabled"]
    assert sorted(_queued_delivery_ids(redis_client)) == sorted(_delivery_ids(runtime, wanted))
    # Running it again (a duplicate job) changes nothing.
    again = resend.run_bulk(runtime, resend_job_id)
    assert (again.done, again.failed) == (7, 2)


def _delivery_ids(runtime, letter_ids):
    with runtime.db.begin() as session:
        return list(
            session.scalars(select(DeadLetter.delivery_id).where(DeadLetter.id.in_(letter_ids)))
        )


def test_bulk_resend_by_filter_ignores_letters_parked_after_the_request(runtime):
    with runtime.db.begin() as session:
        scene = make_scene(session, runtime.secret_box)
        before = letters_for(session, scene, 2)
    with runtime.db.begin() as session:
        resend_job_id = resend.start_bulk(session, actor="ops", flt=DeadLetterFilter()).id
    with runtime.db.begin() as session:
        after = letters_for(session, scene, 1)
    resend_job = resend.run_bulk(runtime, resend_job_id)
    assert resend_job.done == 2
    with runtime.db.begin() as session:
        assert session.get_one(DeadLetter, after[0]).state == DL_OPEN
        assert {session.get_one(DeadLetter, i).state for i in before} == {DL_RESENT}


def test_bulk_resend_by_ids_and_its_validation(runtime):
    with runtime.db.begin() as session:
        scene = make_scene(session, runtime.secret_box)
        ids = letters_for(session, scene, 3)
        discard_mod.discard(session, ids[0], actor="ops")
    with runtime.db.begin() as session:
        resend_job_id = resend.start_bulk(session, actor="ops", ids=[*ids, ids[1], "dl_nope"]).id
    resend_job = resend.run_bulk(runtime, resend_job_id, page_size=2)
    assert (resend_job.total, resend_job.done, resend_job.failed) == (4, 2, 2)
    assert resend_job.params["skipped"] == {"dead_letter_not_open": 1, "not_found": 1}
    with pytest.raises(ValidationFailed), runtime.db.begin() as session:
        resend.start_bulk(session, actor="ops", ids=[])
    with pytest.raises(ValidationFailed), runtime.db.begin() as session:
        resend.start_bulk(session, actor="ops", flt=DeadLetterFilter(state=DL_DISCARDED))


def test_stalled_bulk_resend_is_enqueued_again(runtime, redis_client):
    with runtime.db.begin() as session:
        resend_job = resend.start_bulk(session, actor="ops", flt=DeadLetterFilter())
        resend_job.updated_at = utcnow() - timedelta(hours=1)
    assert resend.resume_stalled(runtime) == 1
    assert len(Queue(DEFAULT, connection=redis_client).get_jobs()) == 1


# ------------------------------------------------------------------------------- discard


def test_discard_closes_an_open_letter_with_a_note(runtime):
    with runtime.db.begin() as session:
        scene = make_scene(session, runtime.secret_box)
        (letter_id,) = letters_for(session, scene, 1)
    with runtime.db.begin() as session:
        discard_mod.discard(session, letter_id, actor="ops", note="  partner gone  ")
    with runtime.db.begin() as session:
        letter = session.get_one(DeadLetter, letter_id)
        assert (letter.state, letter.note) == (DL_DISCARDED, "partner gone")
        assert [(a.action, a.outcome, a.note) for a in letter.audit][-1] == (
            "discard",
            "discarded",
            "partner gone",
        )
        assert session.get_one(Delivery, letter.delivery_id).state == "dead"
    with pytest.raises(Conflict), runtime.db.begin() as session:
        discard_mod.discard(session, letter_id, actor="ops")
    with pytest.raises(Conflict), runtime.db.begin() as session:
        resend.resend_one(session, runtime.redis, letter_id, actor="ops")


# ------------------------------------------------------------------------------- scheduler


def test_scheduler_runs_retention_and_resumes_stalled_bulk_resends(runtime):
    from app.processes.scheduler import periodic_jobs

    jobs = {job.name: job.run for job in periodic_jobs(runtime)}
    assert "retention" in jobs
    assert jobs["resume-bulk-resends"] is resend.resume_stalled
