"""Jobs are named by stable names, and those queued under the import paths of earlier
releases still run (`app.queues.LEGACY_NAMES`).

Each test writes a job by hand into real Redis, under its stable name and under its old one
(as a worker of the last release would leave it before an upgrade), and runs Kurir's real
worker (`run_worker`) over it.
"""

from __future__ import annotations

from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from rq import Queue
from sqlalchemy import select

from app.inbound import receive, reconcile
from app.models import (
    DeadLetter,
    Delivery,
    InboundEvent,
    InboundSource,
    ReconcileRequest,
    ResendJob,
)
from app.processes.worker import run_worker
from app.queues import DEFAULT, DELIVERIES, INBOUND, JOBS, LEGACY_NAMES, JobSpec, enqueue_many
from app.runtime import Runtime
from dlq import resend
from tests.support import inbound as kit
from tests.support.dlq_factories import letters_for, make_scene
from tests.support.factories import (
    Receiver,
    make_endpoint,
    make_event_with_deliveries,
    make_partner,
)

SW = "standard-webhooks"


def _enqueue_by_hand(redis_client: Any, queue: str, name: str, args: tuple[Any, ...]) -> None:
    assert name in JOBS or LEGACY_NAMES[name] in JOBS
    enqueue_many(redis_client, [JobSpec(queue, name, args)])
    [job] = Queue(queue, connection=redis_client).jobs
    assert job.func_name == name  # what Redis holds


def _names(old: str) -> Any:
    return pytest.mark.parametrize("name", [old, LEGACY_NAMES[old]], ids=["old-path", "stable"])


@_names("sender.jobs.deliver_batch")
def test_a_delivery_job_is_delivered(runtime: Runtime, redis_client, name: str):
    with Receiver() as receiver:
        with runtime.db.begin() as session:
            partner = make_partner(session, "acme")
            endpoint = make_endpoint(session, partner, receiver.url + "/hook", runtime.secret_box)
            _, deliveries = make_event_with_deliveries(session, partner, [endpoint])
            ids = [d.id for d in deliveries]
        _enqueue_by_hand(redis_client, DELIVERIES, name, (ids,))
        assert run_worker(runtime, burst=True)
        with runtime.db.begin() as session:
            states = set(session.scalars(select(Delivery.state).where(Delivery.id.in_(ids))))
        assert states == {"succeeded"}
        assert len(receiver.requests) == len(ids)


@_names("app.inbound.process.process_event")
def test_an_inbound_job_is_processed(runtime: Runtime, redis_client, name: str):
    kit.create_source(runtime, "psp", SW)
    body, headers = kit.signed_callback(
        SW, event_id="evt_1", resource_id="pay_1", version=1, status="paid"
    )
    event_id = receive.receive(runtime, "psp", headers, body).inbound_event_id
    Queue(INBOUND, connection=redis_client).empty()  # drop the job the receiver queued
    _enqueue_by_hand(redis_client, INBOUND, name, (event_id,))
    assert run_worker(runtime, burst=True)
    with runtime.db.begin() as session:
        assert session.get_one(InboundEvent, event_id).status == "applied"


@_names("app.inbound.reconcile.run_request")
def test_a_reconcile_job_pulls_the_provider(
    runtime: Runtime, redis_client, httpserver: HTTPServer, name: str
):
    httpserver.expect_request("/state", query_string="resource_id=pay_1").respond_with_json(
        {"id": "pay_1", "version": 4, "status": "refunded"}
    )
    kit.create_source(runtime, "psp", SW, reconcile_url=httpserver.url_for("/state"))
    with runtime.db.begin() as session:
        source = session.scalar(select(InboundSource))
        request = reconcile.request_reconcile(session, source, "pay_1")
        assert request is not None
        request_id = request.id
    _enqueue_by_hand(redis_client, INBOUND, name, (request_id,))
    assert run_worker(runtime, burst=True)
    with runtime.db.begin() as session:
        done = session.get_one(ReconcileRequest, request_id)
        assert (done.state, done.last_error) == ("done", None)
    httpserver.check_assertions()


@_names("dlq.resend.run_bulk_job")
def test_a_bulk_resend_job_resends(runtime: Runtime, redis_client, name: str):
    with runtime.db.begin() as session:
        scene = make_scene(session, runtime.secret_box)
        letters = letters_for(session, scene, 3)
        resend_job = resend.start_bulk(
            session, actor="ops", ids=letters
        )  # no connection: not queued
        resend_job_id = resend_job.id
    _enqueue_by_hand(redis_client, DEFAULT, name, (resend_job_id,))
    assert run_worker(runtime, burst=True)
    with runtime.db.begin() as session:
        finished = session.get_one(ResendJob, resend_job_id)
        assert (finished.state, finished.done) == ("succeeded", 3)
        states = set(session.scalars(select(DeadLetter.state).where(DeadLetter.id.in_(letters))))
        assert states == {"resent"}
