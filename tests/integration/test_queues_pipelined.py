"""Jobs written by `app.queues.enqueue_many` (packed by hand, one write) are RQ's jobs, and a
batch with an error reply raises without leaving replies unread on the connection."""

from __future__ import annotations

import pytest
import redis
from rq import Queue
from rq.job import Job

from app.queues import DELIVERIES, JobSpec, enqueue_many, send_pipelined


def test_enqueued_jobs_are_read_back_by_rq(redis_client):
    specs = [
        JobSpec(DELIVERIES, "kurir.deliver_batch", ([f"dlv_{i}"],), f"job-{i}") for i in range(3)
    ]
    assert enqueue_many(redis_client, specs) == 3
    queue = Queue(DELIVERIES, connection=redis_client)
    assert queue.job_ids == ["job-0", "job-1", "job-2"]
    job = Job.fetch("job-1", connection=redis_client)
    assert (job.func_name, job.args, job.timeout) == ("kurir.deliver_batch", (["dlv_1"],), 300)
    assert (
        Queue.redis_queue_namespace_prefix.encode() + DELIVERIES.encode()
        in redis_client.smembers(Queue.redis_queues_keys)
    )


def test_an_error_reply_is_raised_after_every_reply_is_read(redis_client):
    redis_client.hset("a-hash", "f", "v")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        send_pipelined(
            redis_client, [("SET", "before", "1"), ("RPUSH", "a-hash", "x"), ("SET", "after", "2")]
        )
    assert redis_client.mget("before", "after") == [b"1", b"2"]
    assert redis_client.ping() is True
    assert redis_client.get("before") == b"1"  # replies and requests still in step
