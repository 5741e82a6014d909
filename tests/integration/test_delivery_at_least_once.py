"""At-least-once: Redis down at publish, Redis flushed mid-run, a worker SIGKILLed
mid-delivery. In each, every event arrives at least once and no event more than twice.

These tests run their own redis-server (never the shared one) so they can stop and flush it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import func, select

from app import event_types
from app import runtime as runtime_mod
from app.accounts import create_api_key
from app.embedded_redis import EmbeddedRedis
from app.models import SUCCEEDED, Attempt, Delivery
from app.queues import enqueue_many
from app.runtime import Runtime
from app.web import create_app
from app.web.auth import clear_cache
from sender.dispatch import enqueue_now, job_specs
from tests.support.factories import (
    Receiver,
    SweeperThread,
    WorkerProcess,
    WorkerThread,
    make_endpoint,
    make_events,
    make_partner,
    wait_for,
)

# Run once more through PgBouncer in transaction mode (tests/conftest.py).
pytestmark = pytest.mark.pgbouncer


@pytest.fixture
def own_redis(tmp_path: Any) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def rt(settings: Any, migrated: Any, own_redis: EmbeddedRedis) -> Iterator[Runtime]:
    runtime = Runtime(settings.with_overrides(redis_url=own_redis.url), database=migrated.db)
    runtime_mod.install(runtime)
    yield runtime
    runtime.close()


def _succeeded(rt: Runtime, ids: list[str]) -> bool:
    with rt.db.begin() as session:
        done = session.scalar(
            select(func.count())
            .select_from(Delivery)
            .where(Delivery.id.in_(ids), Delivery.state == SUCCEEDED)
        )
    return done == len(ids)


def _at_least_once_at_most_twice(receiver: Receiver, event_ids: set[str]) -> None:
    seen = Counter(receiver.event_ids())
    assert set(seen) == event_ids, "some event never arrived"
    assert max(seen.values()) <= 2, seen.most_common(3)


def test_publish_while_redis_is_down_is_delivered_once_it_is_back(rt, own_redis):
    with Receiver() as receiver:
        with rt.db.begin() as session:
            event_types.register(
                session, {"name": "order.paid", "version": 1, "schema": {"type": "object"}}
            )
            partner = make_partner(session, "acme")
            make_endpoint(session, partner, receiver.url + "/h", rt.secret_box)
            _, token = create_api_key(session, "svc", ["events:write"])
        clear_cache()
        client = create_app(runtime=rt).test_client()
        own_redis.stop()
        with pytest.raises(redis.RedisError):
            rt.redis.ping()
        event_ids = set()
        for i in range(20):
            response = client.post(
                "/v1/partners/acme/events",
                headers={"Authorization": f"Bearer {token}"},
                json={"type": "order.paid", "version": 1, "data": {"n": i}},
            )
            assert response.status_code == 202, response.get_json()
            event_ids.add(response.get_json()["id"])
        with rt.db.begin() as session:
            ids = list(session.scalars(select(Delivery.id)))
        assert len(ids) == 20  # committed, though nothing could be enqueued
        own_redis.start()
        with WorkerThread(rt), SweeperThread(rt):
            wait_for(lambda: _succeeded(rt, ids), timeout_s=60, message="delivered")
        _at_least_once_at_most_twice(receiver, event_ids)


def test_flushall_mid_run_loses_nothing(rt):
    def slow(received: Any, count: int) -> tuple[int, dict[str, str], bytes]:
        time.sleep(0.01)
        return 200, {}, b"ok"

    with Receiver(slow) as receiver:
        with rt.db.begin() as session:
            partner = make_partner(session)
            endpoint = make_endpoint(session, partner, receiver.url + "/h", rt.secret_box)
            first = make_events(session, partner, [endpoint], 50)
            second = make_events(session, partner, [endpoint], 200)
            event_ids = {d.event_id for d in session.scalars(select(Delivery))}
        enqueue_now(rt.redis, first)
        with WorkerThread(rt), SweeperThread(rt):
            wait_for(lambda: len(receiver.requests) >= 20, message="the run to start")
            # One job each, as 200 publishes would enqueue, in one pipeline so that the flush
            # right after it finds most of them still queued. On a loaded machine the worker
            # can pop them all first: then they are enqueued again (a duplicate job is
            # harmless) until a flush does drop some. LLEN and FLUSHALL are one transaction.
            queued = 0
            for _ in range(10):
                enqueue_many(
                    rt.redis, [spec for delivery_id in second for spec in job_specs([delivery_id])]
                )
                flush = rt.redis.pipeline(transaction=True)
                flush.llen("rq:queue:kurir-deliveries")
                flush.flushall()
                queued = flush.execute()[0]
                if queued:
                    break
            wait_for(lambda: _succeeded(rt, first + second), timeout_s=60, message="all delivered")
        assert queued > 0  # jobs really were lost with the flush
        _at_least_once_at_most_twice(receiver, event_ids)


def test_sigkilled_worker_mid_delivery_is_redelivered_by_another(
    rt, settings, own_redis, tmp_path, backend
):
    """A worker dies while its request is in flight; once its lease has expired the sweeper
    records the lost attempt and another worker delivers."""
    if backend == "sqlite":
        # Real processes and a real lease make this slow; the recovery SQL itself is tested
        # on both databases in test_delivery_sweeper.py.
        pytest.skip("runs on PostgreSQL only")
    worker_settings = settings.with_overrides(redis_url=own_redis.url)
    victim = WorkerProcess(
        worker_settings,
        tmp_path / "victim.log",
        KURIR_DELIVERY_LEASE_SECONDS="5",
        KURIR_DEFAULT_TIMEOUT_S="1",
    )

    def kill_mid_request(received: Any, count: int) -> tuple[int, dict[str, str], bytes] | None:
        if count == 1:
            # The victim has sent its request and waits for the answer: it dies right here,
            # with no window in which it could finish the attempt.
            victim.kill()
            return None
        return 200, {}, b"ok"

    with Receiver(kill_mid_request) as receiver:
        with rt.db.begin() as session:
            partner = make_partner(session)
            endpoint = make_endpoint(
                session, partner, receiver.url + "/h", rt.secret_box, timeout_s=1
            )
            [delivery_id] = make_events(session, partner, [endpoint], 1)
        enqueue_now(rt.redis, [delivery_id])
        with victim:
            wait_for(
                lambda: victim.process.poll() is not None,
                timeout_s=60,
                message="the victim to be killed mid-request",
            )
        with rt.db.begin() as session:
            row = session.get(Delivery, delivery_id)
            assert row.state == "delivering"
            lease = row.lease_expires_at
        with WorkerThread(rt), SweeperThread(rt):
            wait_for(
                lambda: _succeeded(rt, [delivery_id]),
                timeout_s=90,
                message="redelivered by the other worker",
            )
        assert len(receiver.requests) == 2
        first, second = receiver.requests
        assert first.headers["webhook-id"] == second.headers["webhook-id"]
        # Taken back only once the victim's lease had run out, not before.
        assert second.at >= lease.timestamp()
        with rt.db.begin() as session:
            attempts = session.scalars(select(Attempt).order_by(Attempt.n)).all()
            assert [(a.n, a.error, a.response_status) for a in attempts] == [
                (1, "worker_lost", None),
                (2, None, 200),
            ]
