"""The delivery consumer takes a trickle's job by its id: a small job names its deliveries
(`sender.dispatch.inline_ids`), so its hash is never read, only deleted with the next pop;
a larger job's call is read as before, and before Redis 7 (no BLMPOP) jobs are popped in two
steps. Real Redis, a real database and a real receiver; the worker is Kurir's own."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue
from rq.job import Job
from sqlalchemy import select

from app.embedded_redis import EmbeddedRedis
from app.models import Delivery
from app.processes.worker import DeliveryConsumer, run_worker
from app.queues import DELIVERIES
from app.redis_client import connect
from app.runtime import Runtime
from sender.dispatch import INLINE_IDS_MAX, enqueue_now, inline_ids, job_specs
from sender.jobs import engine_for, shutdown_engine
from tests.support.factories import (
    Receiver,
    make_endpoint,
    make_event_with_deliveries,
    make_partner,
    wait_for,
)


def _calls(redis_client: Any, command: str) -> int:
    stats = redis_client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0))


def _deliveries(runtime: Runtime, receiver: Receiver, fan_out: int) -> list[str]:
    with runtime.db.begin() as session:
        partner = make_partner(session, "acme")
        endpoints = [
            make_endpoint(session, partner, f"{receiver.url}/hook/{n}", runtime.secret_box)
            for n in range(fan_out)
        ]
        _, deliveries = make_event_with_deliveries(session, partner, endpoints)
        return [d.id for d in deliveries]


def _states(runtime: Runtime, ids: list[str]) -> set[str]:
    with runtime.db.begin() as session:
        return set(session.scalars(select(Delivery.state).where(Delivery.id.in_(ids))))


def test_a_small_job_names_its_deliveries_in_an_id_rq_accepts(redis_client):
    ids = ["dlv_01KBA0000000000000000000AA", "dlv_01KBA0000000000000000000BB"]
    [spec] = job_specs(ids)
    assert inline_ids(spec.job_id or "") == ids
    enqueue_now(redis_client, ids)
    job = Job.fetch(spec.job_id or "", connection=redis_client)  # what /metrics reads
    assert job.args == (ids,)
    many = [f"dlv_01KBA00000000000000000{n:04d}" for n in range(INLINE_IDS_MAX + 1)]
    [large] = job_specs(many)
    assert inline_ids(large.job_id or "") is None  # a digest: its call is read
    assert inline_ids("deliver-p--") is None
    assert inline_ids("probe-ep_1--x") is None


def test_a_small_job_is_delivered_without_reading_its_hash_which_is_then_deleted(
    make_rt: Callable[..., Runtime], private_redis: tuple[str, redis.Redis]
):
    url, redis_client = private_redis
    runtime = make_rt(redis_url=url)
    with Receiver() as receiver:
        ids = _deliveries(runtime, receiver, 1)
        enqueue_now(redis_client, ids)
        [job_id] = Queue(DELIVERIES, connection=redis_client).job_ids
        assert redis_client.exists(Job.key_for(job_id))
        reads = _calls(redis_client, "hget")
        assert run_worker(runtime, burst=True, queues=(DELIVERIES,))
        assert _states(runtime, ids) == {"succeeded"}
        assert len(receiver.requests) == 1
    assert _calls(redis_client, "hget") == reads  # taken by its id alone
    assert not redis_client.exists(Job.key_for(job_id))  # deleted once the worker stopped


def test_a_larger_job_is_read_from_its_hash(runtime: Runtime, redis_client):
    with Receiver() as receiver:
        ids = _deliveries(runtime, receiver, INLINE_IDS_MAX + 1)
        enqueue_now(redis_client, ids)
        [job_id] = Queue(DELIVERIES, connection=redis_client).job_ids
        assert inline_ids(job_id) is None
        reads = _calls(redis_client, "hget")
        assert run_worker(runtime, burst=True, queues=(DELIVERIES,))
        assert _states(runtime, ids) == {"succeeded"}
        assert len(receiver.requests) == len(ids)
    assert _calls(redis_client, "hget") > reads
    assert not redis_client.exists(Job.key_for(job_id))


@contextmanager
def _private_redis(directory: Path, *arguments: str) -> Iterator[tuple[str, redis.Redis]]:
    """A real Redis server of the test's own (`kurir up`'s embedded one, on a Unix socket),
    its URL and a client made as Kurir makes its own: its command counts are the test's
    alone (the shared server's also count whatever tests run beside it)."""
    server = EmbeddedRedis(directory / "redis", arguments)
    url = server.start(timeout_s=20)
    client = connect(url, socket_timeout=10, socket_connect_timeout=5)
    try:
        yield url, client
    finally:
        client.close()
        server.stop()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[tuple[str, redis.Redis]]:
    with _private_redis(tmp_path) as server:
        yield server


@pytest.fixture
def redis_without_blmpop(tmp_path: Path) -> Iterator[redis.Redis]:
    """A real Redis server that answers BLMPOP as one before 7.0 does: unknown command."""
    with _private_redis(tmp_path, "--rename-command", "BLMPOP", "") as (_, client):
        yield client


def test_before_redis_7_jobs_are_popped_in_two_steps(runtime: Runtime, redis_without_blmpop):
    with Receiver() as receiver:
        ids = _deliveries(runtime, receiver, 2)
        enqueue_now(redis_without_blmpop, ids)
        [job_id] = Queue(DELIVERIES, connection=redis_without_blmpop).job_ids
        consumer = DeliveryConsumer(
            engine_for(runtime), redis_without_blmpop, threading.Event(), block_s=0.1
        )
        try:
            assert consumer.step() == 1
            assert not consumer._blmpop  # the server said it has no BLMPOP
            wait_for(lambda: _states(runtime, ids) == {"succeeded"}, timeout_s=30)
            assert consumer.step() == 0  # an empty queue: the blocking pop waited, empty
        finally:
            consumer.close()
            shutdown_engine()
    assert len(receiver.requests) == 2
    assert not redis_without_blmpop.exists(Job.key_for(job_id))


def test_pops_go_over_one_kept_connection_made_again_when_it_drops(
    runtime: Runtime, private_redis: tuple[str, redis.Redis]
):
    """The consumer keeps its connection out of the pool between pops (no checkout each);
    killed by the server, it is connected again by the next pop, and nothing is lost."""
    _, redis_client = private_redis

    def connections_made() -> int:
        return int(redis_client.info("stats")["total_connections_received"])

    with Receiver() as receiver:
        ids = _deliveries(runtime, receiver, 4)
        consumer = DeliveryConsumer(
            engine_for(runtime), redis_client, threading.Event(), block_s=0.1
        )
        try:
            enqueue_now(redis_client, ids[:1])
            assert consumer.step() == 1
            made = connections_made()
            for delivery_id in ids[1:3]:
                enqueue_now(redis_client, [delivery_id])
                assert consumer.step() == 1
            assert connections_made() == made  # the same connection, every pop
            # ...kept out of the pool: this test's own commands go over another one.
            assert len(redis_client.client_list(_type="normal")) == 2
            killed = redis_client.client_kill_filter(_type="normal", skipme=True)
            assert killed >= 1
            enqueue_now(redis_client, ids[3:])
            assert consumer.step() == 1  # over a new connection
            assert connections_made() > made
            wait_for(lambda: _states(runtime, ids) == {"succeeded"}, timeout_s=30)
        finally:
            consumer.close()
            shutdown_engine()
    assert len(receiver.requests) == len(ids)
