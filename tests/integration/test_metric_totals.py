"""`/metrics` without reading the history whole: attempt totals folded by the scheduler and
kept through retention's purges, and rows by state estimated once a table is large."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import delete, event, select, text

from app.clock import utcnow
from app.ids import id_at
from app.lifecycle import stats
from app.models import Attempt, Endpoint, MetricRollup, Partner
from app.processes.scheduler import fold_attempt_totals, periodic_jobs
from app.services import attempt_totals
from app.web import metrics
from tests.integration.test_metrics import parse
from tests.support.dlq_factories import letters_for, make_delivery, make_event, make_scene


def _scrape(client: Any) -> dict[str, float]:
    """A fresh render (the cache keeps one for a few seconds)."""
    client.application.extensions["kurir_metrics"] = metrics.RenderCache()
    response = client.get("/metrics")
    assert response.status_code == 200
    return parse(response.text)


def _attempt(session: Any, delivery_id: str, n: int, at: Any, status: int | None) -> None:
    session.add(
        Attempt(
            id=id_at("att", at),
            delivery_id=delivery_id,
            n=n,
            started_at=at,
            duration_ms=30,
            url="http://127.0.0.1:9/hook",
            request_headers={},
            response_status=status,
            created_at=at,
        )
    )


def _retrying_delivery(session: Any, runtime: Any) -> Any:
    """A retrying delivery on a fresh partner's endpoint, with no attempt yet."""
    scene = make_scene(session, runtime.secret_box)
    endpoint = session.get_one(Endpoint, scene.endpoint_id)
    partner = session.get_one(Partner, scene.partner_id)
    return make_delivery(session, endpoint, make_event(session, partner), "retrying", [])


def test_attempts_are_folded_a_day_at_a_time_and_counted_once(runtime):
    now = utcnow()
    with runtime.db.begin() as session:
        delivery = _retrying_delivery(session, runtime)
        for n, days in enumerate((3, 2, 1), 1):
            _attempt(session, delivery.id, n, now - timedelta(days=days), 500)
        _attempt(session, delivery.id, 4, now, None)  # younger than SETTLE: not folded
    locks: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().startswith("SELECT") and "FROM metric_rollups" in statement:
            locks.append(statement)

    event.listen(runtime.db.engine, "before_cursor_execute", seen)
    try:
        folded = attempt_totals.fold(runtime, now)
    finally:
        event.remove(runtime.db.engine, "before_cursor_execute", seen)

    assert folded == 3
    # Three days, a transaction each, and one more finding nothing left to fold.
    assert len(locks) == 4
    assert attempt_totals.fold(runtime, now) == 0
    with runtime.db.begin() as session:
        rollup = session.get_one(MetricRollup, attempt_totals.SOURCE)
        assert rollup.counts["total"] == 3
        assert rollup.through_id < id_at("att", now - attempt_totals.SETTLE + timedelta(seconds=1))
        read = attempt_totals.read(session)
        assert read == attempt_totals.count(session)
        assert (read.total, read.http_error, read.network_error) == (4, 3, 1)


def test_a_scrape_keeps_counting_attempts_that_retention_purged(client, runtime):
    hour_ago = utcnow() - timedelta(hours=1)
    with runtime.db.begin() as session:
        delivery = _retrying_delivery(session, runtime)
        endpoint_id = delivery.endpoint_id
        for n in range(1, 7):
            _attempt(session, delivery.id, n, hour_ago + timedelta(seconds=n), 500)
    before = _scrape(client)
    assert before['kurir_attempts{outcome="http_error"}'] == 6

    assert attempt_totals.fold(runtime) == 6
    with runtime.db.begin() as session:
        session.execute(delete(Attempt))  # what a purge does to the rows
        endpoint = session.get_one(Endpoint, endpoint_id)
        partner = session.get_one(Partner, endpoint.partner_id)
        make_delivery(session, endpoint, make_event(session, partner), "succeeded", [200])
    after = _scrape(client)

    assert after['kurir_attempts{outcome="http_error"}'] == 6
    assert after['kurir_attempts{outcome="success"}'] == 1
    assert after["kurir_attempt_duration_seconds_count"] == 7
    assert after['kurir_attempt_duration_seconds_bucket{le="+Inf"}'] == 7
    assert "# TYPE kurir_attempts counter" in client.get("/metrics").text


def test_the_scheduler_folds_the_attempt_totals(runtime):
    jobs = {job.name: job for job in periodic_jobs(runtime)}
    assert jobs["fold-attempt-totals"].run is fold_attempt_totals
    with runtime.db.begin() as session:
        delivery = _retrying_delivery(session, runtime)
        _attempt(session, delivery.id, 1, utcnow() - timedelta(hours=1), 503)
    assert fold_attempt_totals(runtime) == 1
    with runtime.db.begin() as session:
        assert session.scalar(select(MetricRollup.counts)) is not None


def test_a_large_history_is_estimated_by_state_not_counted(client, runtime, monkeypatch):
    """On PostgreSQL a table of `stats.EXACT_BELOW` rows or more is not read whole at each
    scrape: the states still worked on are counted through an index, the finished ones share
    the rest of the table's live rows as its statistics divide them."""
    if runtime.settings.is_sqlite:
        pytest.skip("PostgreSQL only: SQLite keeps no statistics, every state is counted")
    with runtime.db.begin() as session:
        scene = make_scene(session, runtime.secret_box)
        letters_for(session, scene, 3)  # 3 dead deliveries, 3 open letters
        endpoint = session.get_one(Endpoint, scene.endpoint_id)
        partner = session.get_one(Partner, scene.partner_id)
        for state, n in (("succeeded", 6), ("pending", 2), ("retrying", 1)):
            for _ in range(n):
                make_delivery(session, endpoint, make_event(session, partner), state, [])
    with runtime.db.engine.connect() as connection:
        connection.execute(text("ANALYZE deliveries"))
        connection.commit()
    counted = _scrape(client)
    monkeypatch.setattr(stats, "EXACT_BELOW", 5)
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(runtime.db.engine, "before_cursor_execute", seen)
    try:
        estimated = _scrape(client)
    finally:
        event.remove(runtime.db.engine, "before_cursor_execute", seen)

    states = ("succeeded", "dead", "pending", "retrying", "delivering")
    assert {s: counted[f'kurir_deliveries{{state="{s}"}}'] for s in states} == {
        "succeeded": 6,
        "dead": 3,
        "pending": 2,
        "retrying": 1,
        "delivering": 0,
    }
    found = {s: estimated[f'kurir_deliveries{{state="{s}"}}'] for s in states}
    # Work in flight counted; the rest (the statistics' live rows, which other backends'
    # inserts and deletes reach a little late) shared 6 : 3, as ANALYZE found them.
    assert (found["pending"], found["retrying"], found["delivering"]) == (2, 1, 0)
    assert found["succeeded"] + found["dead"] >= 9
    assert abs(found["succeeded"] - 2 * found["dead"]) <= 1, found
    reads = [s for s in statements if "FROM deliveries" in s and "GROUP BY state" in s]
    assert reads and all("'pending', 'delivering', 'retrying'" in s for s in reads), reads


def test_a_fold_step_another_fold_overtook_writes_nothing(runtime):
    """Steps count without a lock and then compare and set: a step whose starting point
    another fold has moved meanwhile adds nothing, so two folds never count a day twice."""
    with runtime.db.begin() as session:
        delivery = _retrying_delivery(session, runtime)
        _attempt(session, delivery.id, 1, utcnow() - timedelta(hours=2), 502)
    assert attempt_totals.fold(runtime) == 1
    with runtime.db.begin() as session:
        through = session.get_one(MetricRollup, attempt_totals.SOURCE).through_id
        later = id_at("att", utcnow())
        # A first fold that lost the race to make the row, then a step from a stale point.
        assert not attempt_totals._store(session, None, later, {"total": 99}, utcnow())
        assert not attempt_totals._store(session, "att_0", later, {"total": 99}, utcnow())
        rollup = session.get_one(MetricRollup, attempt_totals.SOURCE)
        assert (rollup.through_id, rollup.counts["total"]) == (through, 1)
    with runtime.db.begin() as session:
        assert attempt_totals.read(session).total == 1
