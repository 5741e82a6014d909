"""Jobs written by `app.queues.enqueue_many` are plain RQ jobs, on real Redis."""

from __future__ import annotations

import os
import threading

import pytest
from rq import Queue, SimpleWorker
from rq.job import Job, JobStatus

from app.processes.worker import KurirWorker
from app.queues import DEFAULT, RESULT_TTL_S, JobSpec, enqueue_after_commit, enqueue_many
from tests.support.factories import wait_for


class RQWorker(SimpleWorker):
    """RQ's own worker, with only Kurir's prompt command listener: RQ's waits 60 s on stop
    when it loses a race, long enough for a finished job's result (60 s) to expire."""

    subscribe = KurirWorker.subscribe


def test_an_enqueued_job_is_run_by_rq_own_worker(redis_client):
    [sent] = [JobSpec(DEFAULT, "os.getcwd", (), job_id="probe-1")]
    assert enqueue_many(redis_client, [sent]) == 1
    queue = Queue(DEFAULT, connection=redis_client)
    assert queue.job_ids == ["probe-1"]
    assert queue.key.encode() in redis_client.smembers(Queue.redis_queues_keys)
    job = Job.fetch("probe-1", connection=redis_client)
    assert (job.func_name, job.args, job.origin) == ("os.getcwd", (), DEFAULT)
    assert job.get_status() == JobStatus.QUEUED and job.enqueued_at is not None

    RQWorker([queue], connection=redis_client).work(burst=True)
    job = Job.fetch("probe-1", connection=redis_client)
    assert job.get_status() == JobStatus.FINISHED
    assert job.return_value() == os.getcwd()
    assert 0 < redis_client.ttl(job.key) <= RESULT_TTL_S


def test_a_reused_job_id_starts_from_a_clean_hash(redis_client):
    spec = JobSpec(DEFAULT, "os.getcwd", (), job_id="probe-2")
    enqueue_many(redis_client, [spec])
    RQWorker([Queue(DEFAULT, connection=redis_client)], connection=redis_client).work(burst=True)
    assert redis_client.ttl(Job.key_for("probe-2")) > 0  # a finished job expires

    enqueue_many(redis_client, [spec])  # the same deterministic id, queued again
    key = Job.key_for("probe-2")
    assert redis_client.ttl(key) == -1  # queued work never expires
    fields = redis_client.hgetall(key)
    assert fields[b"status"] == b"queued"
    assert b"ended_at" not in fields and b"result" not in fields


def test_jobs_without_an_id_get_distinct_ones(redis_client):
    specs = [JobSpec(DEFAULT, "os.getcwd", ()) for _ in range(3)]
    assert enqueue_many(redis_client, specs) == 3
    ids = Queue(DEFAULT, connection=redis_client).job_ids
    assert len(set(ids)) == 3


def test_a_worker_stops_its_command_listener_at_once(redis_client):
    """RQ 3 lets its command listener wait 60 s at a time and redis-py 8.2 joins it on stop.
    When the listener reads the UNSUBSCRIBE reply before the stop flag is down (a race a
    loaded machine loses often), it goes back to waiting, for the whole 60 s, and the worker
    takes a minute to stop. The race is forced here: Kurir's listener waits briefly, so the
    stop returns promptly all the same."""
    worker = KurirWorker([Queue(DEFAULT, connection=redis_client)], connection=redis_client)
    worker.subscribe()
    listener, pubsub = worker.pubsub_thread, worker.pubsub
    assert listener is not None and pubsub is not None
    wait_for(lambda: pubsub.subscribed, message="the listener subscribed")
    pubsub.unsubscribe()
    wait_for(lambda: not pubsub.subscribed, message="the listener read the unsubscribe reply")
    stopper = threading.Thread(target=worker.unsubscribe, daemon=True)
    stopper.start()
    stopper.join(20)  # with RQ's own listener it is held here for 60 s
    assert not stopper.is_alive(), "stopping the worker still waits on its listener"
    assert not listener.is_alive()


def test_enqueue_after_commit_waits_for_the_commit_and_forgets_a_rollback(runtime, redis_client):
    queue = Queue(DEFAULT, connection=redis_client)
    with runtime.db.begin() as session:
        enqueue_after_commit(
            session, runtime.redis, [JobSpec(DEFAULT, "os.getcwd", (), job_id="after-commit")]
        )
        assert queue.job_ids == []  # a worker must not look before the rows are visible
    assert queue.job_ids == ["after-commit"]

    def fail_after_enqueueing() -> None:
        with runtime.db.begin() as session:
            enqueue_after_commit(
                session, runtime.redis, [JobSpec(DEFAULT, "os.getcwd", (), job_id="rolled-back")]
            )
            raise RuntimeError("the transaction fails")

    with pytest.raises(RuntimeError):
        fail_after_enqueueing()
    assert queue.job_ids == ["after-commit"]
