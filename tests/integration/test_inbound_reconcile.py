"""Reconciliation against a fake provider API on 127.0.0.1: gap → quarantine → pull → resolved."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from apscheduler.triggers.cron import CronTrigger
from click.testing import CliRunner
from rq import Queue
from sqlalchemy import select

from app.cli import cli
from app.clock import parse_time, utcnow
from app.inbound import process, receive, reconcile
from app.models import InboundEvent, ReconcileRequest, ResourceState
from app.net.http import Transport
from app.ports import free_port
from app.processes.scheduler import periodic_jobs
from app.processes.worker import run_worker
from app.queues import INBOUND
from app.runtime import Runtime
from tests.support import inbound as kit

SW = "standard-webhooks"


class FakeProvider:
    """A provider's pull API: answers from `state`, or the scripted `failures` first."""

    def __init__(self) -> None:
        self.state: dict[str, dict[str, Any]] = {}
        self.pages: list[dict[str, Any]] = []
        self.failures: list[int] = []
        self.requests: list[dict[str, list[str]]] = []
        self.hosts: list[str | None] = []
        self.oversized = False
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server API
                query = parse_qs(urlsplit(self.path).query)
                provider.requests.append(query)
                provider.hosts.append(self.headers.get("Host"))
                if provider.oversized:
                    self._send(200, ["x" * 1024] * (reconcile.MAX_RESPONSE_BYTES // 1024))
                elif provider.failures:
                    self._send(provider.failures.pop(0), {"error": "try later"})
                elif "resource_id" in query:
                    found = provider.state.get(query["resource_id"][0])
                    self._send(200 if found else 404, found or {"error": "no such resource"})
                else:
                    self._send(200, provider.pages.pop(0) if provider.pages else [])

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1/payments/state"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    fake = FakeProvider()
    yield fake
    fake.close()


def store(
    runtime: Runtime,
    name: str,
    event_id: str,
    version: int,
    status: str,
    resource_id: str = "pay_1",
) -> str:
    body, headers = kit.signed_callback(
        SW, event_id=event_id, resource_id=resource_id, version=version, status=status
    )
    return receive.receive(runtime, name, headers, body).inbound_event_id


def event_of(runtime: Runtime, inbound_id: str) -> InboundEvent:
    with runtime.db.begin() as session:
        return session.get(InboundEvent, inbound_id)


def state_of(runtime: Runtime, resource_id: str = "pay_1") -> ResourceState | None:
    with runtime.db.begin() as session:
        return session.scalar(select(ResourceState).where(ResourceState.resource_id == resource_id))


def requests_of(runtime: Runtime) -> list[ReconcileRequest]:
    with runtime.db.begin() as session:
        return list(session.scalars(select(ReconcileRequest).order_by(ReconcileRequest.id)))


def test_gap_is_quarantined_then_reconciled_from_the_provider_end_to_end(
    runtime, live_server, provider, redis_client, admin_token
):
    kit.create_source(runtime, "psp", SW, allow_gaps=False, reconcile_url=provider.url)
    provider.state["pay_1"] = {"id": "pay_1", "version": 4, "status": "refunded", "amount": 1200}
    ids = []
    for event_id, version, status in (("e1", 1, "created"), ("e3", 3, "paid")):
        body, headers = kit.signed_callback(
            SW, event_id=event_id, resource_id="pay_1", version=version, status=status
        )
        response = requests.post(
            f"{live_server.url}/inbound/psp", data=body, headers=dict(headers), timeout=10
        )
        assert response.status_code == 202
        ids.append(response.json()["id"])
    # A real worker: processes both events, then the reconcile job the quarantine filed.
    assert run_worker(runtime, burst=True)
    created, paid = (event_of(runtime, i) for i in ids)
    assert created.status == "applied"
    assert (paid.status, paid.reason) == ("ignored", "reconciled")
    assert provider.requests == [{"resource_id": ["pay_1"]}]
    [request] = requests_of(runtime)
    assert (request.state, request.attempts, request.last_error) == ("done", 1, None)
    state = state_of(runtime)
    assert (state.status, state.last_version) == ("refunded", 4)
    assert state.data["amount"] == 1200
    answer = requests.get(
        f"{live_server.url}/v1/sources/psp/resources/pay_1",
        headers={"Authorization": f"Bearer {admin_token}"},
        timeout=10,
    )
    assert answer.json()["status"] == "refunded" and answer.json()["version"] == 4
    listed = requests.get(
        f"{live_server.url}/v1/inbound-events?status=quarantined",
        headers={"Authorization": f"Bearer {admin_token}"},
        timeout=10,
    )
    assert listed.json()["data"] == []


def test_quarantined_event_newer_than_the_snapshot_is_applied(runtime, provider):
    kit.create_source(runtime, "psp", SW, allow_gaps=False, reconcile_url=provider.url)
    provider.state["pay_1"] = {"id": "pay_1", "version": 2, "status": "authorized"}
    process.process_event(store(runtime, "psp", "e1", 1, "created"))
    gap = store(runtime, "psp", "e3", 3, "paid")
    assert process.process_event(gap) == "quarantined"
    [request] = requests_of(runtime)
    outcome = reconcile.run_request(request.id, runtime)
    assert (outcome.state, outcome.applied, outcome.resolved) == ("done", 1, 1)
    assert (event_of(runtime, gap).status, event_of(runtime, gap).reason) == (
        "applied",
        "reconciled",
    )
    state = state_of(runtime)
    assert (state.status, state.last_version, state.last_event_id) == ("paid", 3, gap)


def test_provider_settles_a_contradiction_at_the_same_version(runtime, provider):
    kit.create_source(runtime, "psp", SW, reconcile_url=provider.url)
    provider.state["pay_1"] = {"id": "pay_1", "version": 2, "status": "failed"}
    assert process.process_event(store(runtime, "psp", "e1", 2, "paid")) == "applied"
    odd = store(runtime, "psp", "e2", 2, "failed")
    assert process.process_event(odd) == "quarantined"
    [request] = requests_of(runtime)
    assert reconcile.run_request(request.id, runtime).state == "done"
    state = state_of(runtime)
    assert (state.status, state.last_version) == ("failed", 2)
    assert event_of(runtime, odd).status == "ignored"


def test_a_snapshot_older_than_the_state_changes_nothing(runtime, provider):
    kit.create_source(runtime, "psp", SW, reconcile_url=provider.url)
    process.process_event(store(runtime, "psp", "e5", 5, "shipped"))
    provider.state["pay_1"] = {"id": "pay_1", "version": 3, "status": "paid"}
    with runtime.db.begin() as session:
        from app.models import InboundSource

        source = session.scalars(select(InboundSource)).one()
        request = reconcile.request_reconcile(session, source, "pay_1")
    outcome = reconcile.run_request(request.id, runtime)
    assert (outcome.state, outcome.applied) == ("done", 0)
    state = state_of(runtime)
    assert (state.status, state.last_version) == ("shipped", 5)


def test_transient_failures_back_off_then_fail_with_the_error_kept(runtime, provider, redis_client):
    kit.create_source(runtime, "psp", SW, allow_gaps=False, reconcile_url=provider.url)
    provider.failures = [503] * 20
    process.process_event(store(runtime, "psp", "e1", 1, "created"))
    gap = store(runtime, "psp", "e3", 3, "paid")
    t = utcnow()
    process.process_event(gap, now=t)
    [request] = requests_of(runtime)
    inbound = Queue(INBOUND, connection=redis_client)
    for attempt, delay in enumerate(reconcile.BACKOFF_S, start=1):
        outcome = reconcile.run_request(request.id, runtime, now=t)
        assert outcome.state == "pending"
        [row] = requests_of(runtime)
        assert row.attempts == attempt and row.last_error.startswith("HTTP 503")
        assert row.next_attempt_at == t + timedelta(seconds=delay)
        # Not due yet: neither the periodic pass nor a stray job runs it.
        assert reconcile.run_request(request.id, runtime, now=t) is None
        inbound.empty()
        assert reconcile.process_due(runtime, now=t + timedelta(seconds=delay - 1)) == 0
        t = t + timedelta(seconds=delay)
        assert reconcile.process_due(runtime, now=t) == 1
        assert [j.args for j in inbound.jobs] == [(request.id,)]
    outcome = reconcile.run_request(request.id, runtime, now=t)
    assert outcome.state == "failed"
    [row] = requests_of(runtime)
    assert (row.state, row.attempts) == ("failed", reconcile.MAX_ATTEMPTS)
    assert row.last_error.startswith("HTTP 503")
    assert reconcile.process_due(runtime, now=t + timedelta(days=1)) == 0
    assert event_of(runtime, gap).status == "quarantined"  # still visible to operators


def test_a_transient_failure_then_success_resolves(runtime, provider):
    kit.create_source(runtime, "psp", SW, allow_gaps=False, reconcile_url=provider.url)
    provider.failures = [429]
    provider.state["pay_1"] = {"id": "pay_1", "version": 3, "status": "paid"}
    gap = store(runtime, "psp", "e3", 3, "paid")
    process.process_event(gap)
    [request] = requests_of(runtime)
    t = utcnow()
    assert reconcile.run_request(request.id, runtime, now=t).state == "pending"
    later = t + timedelta(seconds=reconcile.BACKOFF_S[0])
    assert reconcile.run_request(request.id, runtime, now=later).state == "done"
    assert event_of(runtime, gap).reason == "reconciled"
    assert state_of(runtime).last_version == 3


def test_connection_refused_is_transient_and_404_is_permanent(runtime, provider):
    closed = f"http://127.0.0.1:{free_port()}/state"
    kit.create_source(runtime, "down", SW, reconcile_url=closed)
    kit.create_source(runtime, "psp", SW, reconcile_url=provider.url)
    with runtime.db.begin() as session:
        from app.models import InboundSource

        by_name = {s.name: s for s in session.scalars(select(InboundSource))}
        down = reconcile.request_reconcile(session, by_name["down"], "pay_1")
        missing = reconcile.request_reconcile(session, by_name["psp"], "pay_404")
    assert reconcile.run_request(down.id, runtime).state == "pending"
    outcome = reconcile.run_request(missing.id, runtime)
    assert outcome.state == "failed" and outcome.error.startswith("HTTP 404")


def test_a_pending_request_is_reused_not_duplicated(runtime, provider):
    kit.create_source(runtime, "psp", SW, allow_gaps=False, reconcile_url=provider.url)
    for n in (3, 5, 7):
        assert process.process_event(store(runtime, "psp", f"e{n}", n, "paid")) == "quarantined"
    assert len(requests_of(runtime)) == 1


def test_scheduled_sweep_lists_changes_since_the_last_sweep(runtime, provider):
    kit.create_source(runtime, "psp", SW, reconcile_url=provider.url)
    provider.pages = [
        {"data": [{"id": "pay_1", "version": 2, "status": "paid"}], "next_cursor": "p2"},
        {
            "data": [{"id": "pay_2", "version": 1, "status": "created"}, {"no": "id"}],
            "next_cursor": None,
        },
    ]
    outcomes = reconcile.reconcile_now(runtime, source_name="psp")
    assert [(o.state, o.applied) for o in outcomes] == [("done", 2)]
    first_since = provider.requests[0]["since"][0]
    assert provider.requests[1] == {"since": [first_since], "cursor": ["p2"]}
    assert state_of(runtime, "pay_1").status == "paid"
    assert state_of(runtime, "pay_2").status == "created"
    [sweep] = requests_of(runtime)
    provider.requests.clear()
    reconcile.reconcile_now(runtime)
    assert parse_time(provider.requests[0]["since"][0]) == sweep.created_at


def test_cli_reconcile_runs_quarantined_resources_and_the_sweep(runtime, settings, provider):
    kit.create_source(runtime, "psp", SW, allow_gaps=False, reconcile_url=provider.url)
    provider.state["pay_1"] = {"id": "pay_1", "version": 3, "status": "paid"}
    gap = store(runtime, "psp", "e3", 3, "paid")
    process.process_event(gap)
    with runtime.db.begin() as session:  # the automatic request gave up earlier
        request = session.scalars(select(ReconcileRequest)).one()
        request.state, request.last_error = "failed", "HTTP 503"
    env = {
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": settings.redis_url,
        "KURIR_DATA_DIR": str(settings.data_dir),
        "KURIR_SECRET_KEY": settings.secret_key,
        "KURIR_ALLOW_PRIVATE_TARGETS": "1",
    }
    result = CliRunner().invoke(cli, ["inbound", "reconcile", "--source", "psp"], env=env)
    assert result.exit_code == 0, result.output
    assert "2 reconcile request(s) run" in result.output
    assert event_of(runtime, gap).reason == "reconciled"
    result = CliRunner().invoke(cli, ["inbound", "reconcile", "--source", "nope"], env=env)
    assert result.exit_code == 1 and "no inbound source" in result.output


def test_reconciliation_is_scheduled_by_the_configured_cron(runtime, settings):
    custom = Runtime(settings.with_overrides(reconcile_cron="*/7 4 * * *"), database=runtime.db)
    jobs = {job.name: job for job in periodic_jobs(custom)}
    cron = jobs["scheduled-reconcile"].trigger
    assert isinstance(cron, CronTrigger)
    assert str(cron) == str(CronTrigger.from_crontab("*/7 4 * * *", timezone="UTC"))
    assert jobs["scheduled-reconcile"].run is reconcile.scheduled_reconcile
    assert jobs["run-due-reconcile-requests"].run is reconcile.process_due
    assert jobs["sweep-inbound-events"].run is process.sweep


def test_scheduled_job_files_and_enqueues(runtime, provider, redis_client):
    kit.create_source(runtime, "psp", SW, reconcile_url=provider.url)
    kit.create_source(runtime, "nopull", SW)
    assert reconcile.scheduled_reconcile(runtime) == 1
    [request] = requests_of(runtime)
    assert request.resource_id is None
    jobs = Queue(INBOUND, connection=redis_client).jobs
    assert [(j.func_name, j.args) for j in jobs] == [(reconcile.RUN_JOB, (request.id,))]


def test_reconcile_url_is_checked_by_the_ssrf_guard(runtime, settings):
    from app.errors import ValidationFailed

    strict = Runtime(settings.with_overrides(allow_private_targets=False), database=runtime.db)
    with pytest.raises(ValidationFailed, match="reconcile_url"):
        kit.create_source(strict, "psp", SW, reconcile_url="http://127.0.0.1:8080/state")
    with pytest.raises(ValidationFailed, match="reconcile_url"):
        kit.create_source(runtime, "psp", SW, reconcile_url="ftp://example.com/state")
    # Not resolving yet is no verdict: every pull resolves and vets the host again.
    kit.create_source(strict, "later", SW, reconcile_url="https://api.psp.invalid/state")


@pytest.mark.parametrize(
    "snapshot",
    [
        {"id": "pay_1", "version": 4, "status": "refunded\ud800"},
        {"id": "pay_1", "version": 4, "status": "refunded", "amount": float("nan")},
        {"id": "pay_1", "version": 4, "status": "refunded", "amount": float("inf")},
    ],
)
def test_a_snapshot_that_is_not_strict_json_fails_permanently(runtime, provider, snapshot):
    # None of these can be stored with the state as JSON: they used to end as a logged crash,
    # a retry "for the next pass" forever (PostgreSQL refuses NaN), or a non-JSON state.
    kit.create_source(runtime, "psp", SW, reconcile_url=provider.url)
    process.process_event(store(runtime, "psp", "e1", 1, "created"))
    provider.state["pay_1"] = snapshot
    with runtime.db.begin() as session:
        from app.models import InboundSource

        source = session.scalars(select(InboundSource)).one()
        request = reconcile.request_reconcile(session, source, "pay_1")
    outcome = reconcile.run_request(request.id, runtime)
    assert outcome.state == "failed"
    assert outcome.error.startswith("response is not JSON")
    [row] = requests_of(runtime)
    assert row.last_error == outcome.error
    row.last_error.encode()
    state = state_of(runtime)
    assert (state.status, state.last_version) == ("created", 1)


def test_a_pull_connects_to_the_address_the_guard_checked(settings, provider):
    # One lookup per pull, and the request goes to what it answered: a name that resolves to
    # a public address for the check and to an internal one for the connect (DNS rebinding)
    # cannot steer the fetch inside.
    provider.state["pay_1"] = {"id": "pay_1", "version": 2, "status": "paid"}
    port = provider.server.server_port
    lookups: list[str] = []

    def resolver(host: str, _port: int) -> list[str]:
        lookups.append(host)
        return ["127.0.0.1"] if host == "psp.example" else []

    with Transport(resolver=resolver) as transport:
        document = reconcile.fetch_json(
            transport,
            f"http://psp.example:{port}/v1/payments/state?account=7",
            {"resource_id": "pay_1"},
            settings,
        )
    assert document == provider.state["pay_1"]
    assert lookups == ["psp.example"]
    assert provider.hosts == [f"psp.example:{port}"]
    assert provider.requests == [{"account": ["7"], "resource_id": ["pay_1"]}]


def test_a_pull_to_a_name_resolving_inside_is_refused_at_fetch_time(settings, provider):
    strict = settings.with_overrides(allow_private_targets=False)
    with (
        Transport(resolver=lambda _h, _p: ["169.254.169.254"]) as transport,
        pytest.raises(reconcile.FetchError, match="reconcile_url refused") as refused,
    ):
        reconcile.fetch_json(transport, "http://psp.example/state", {}, strict)
    assert refused.value.transient is False
    assert provider.requests == []


def test_an_oversized_snapshot_fails_permanently(settings, provider):
    provider.oversized = True
    with (
        Transport() as transport,
        pytest.raises(reconcile.FetchError, match="larger than") as too_big,
    ):
        reconcile.fetch_json(transport, provider.url, {"resource_id": "pay_1"}, settings)
    assert too_big.value.transient is False
