"""Processing stored callbacks: once, in order, never backwards, on both databases."""

from __future__ import annotations

import queue
import random
import threading
import time
from datetime import timedelta
from itertools import count

import pytest
import requests
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from rq import Queue
from sqlalchemy import select

from app.clock import utcnow
from app.inbound import handlers as handler_registry
from app.inbound import process, receive, replay, sources
from app.models import (
    InboundEvent,
    InboundSource,
    OperationalEvent,
    ReconcileRequest,
    ResourceState,
)
from app.processes.worker import run_worker
from app.queues import INBOUND, INBOUND_RECONCILE
from app.runtime import Runtime
from tests.support import inbound as kit

# Run once more through PgBouncer in transaction mode (tests/conftest.py).
pytestmark = pytest.mark.pgbouncer

SW = "standard-webhooks"
HERE = "tests.integration.test_inbound_process"

# Handlers record what they saw; threads append, so a lock keeps the list whole.
_seen: list[tuple[str, str | None, int | None, bool]] = []
_seen_lock = threading.Lock()


def record(ctx: handler_registry.HandlerContext) -> None:
    with _seen_lock:
        _seen.append(
            (
                "state",
                ctx.event.resource_id,
                ctx.state.last_version if ctx.state else None,
                ctx.stale,
            )
        )


@handler_registry.side_effect_only
def audit(ctx: handler_registry.HandlerContext) -> None:
    with _seen_lock:
        _seen.append(("audit", ctx.event.resource_id, ctx.event.resource_version, ctx.stale))


def write_then_fail(ctx: handler_registry.HandlerContext) -> None:
    ctx.session.add(OperationalEvent(kind="inbound.test", subject_id=ctx.event.id))
    ctx.session.flush()
    raise RuntimeError("handler exploded")


def write_row(ctx: handler_registry.HandlerContext) -> None:
    ctx.session.add(
        OperationalEvent(
            kind="inbound.test", subject_id=ctx.event.id, data={"version": ctx.state.last_version}
        )
    )


@pytest.fixture(autouse=True)
def _clear_seen() -> None:
    with _seen_lock:
        _seen.clear()


def store(
    runtime: Runtime,
    name: str,
    *,
    event_id: str,
    resource_id: str = "pay_1",
    version: int | None = None,
    status: str = "created",
    scheme: str = SW,
    occurred: float | None = None,
) -> receive.Receipt:
    body, headers = kit.signed_callback(
        scheme,
        event_id=event_id,
        resource_id=resource_id,
        version=version,
        status=status,
        occurred=occurred,
    )
    return receive.receive(runtime, name, headers, body)


def state_of(runtime: Runtime, resource_id: str = "pay_1") -> ResourceState | None:
    with runtime.db.begin() as session:
        return session.scalar(select(ResourceState).where(ResourceState.resource_id == resource_id))


def event_of(runtime: Runtime, inbound_id: str) -> InboundEvent:
    with runtime.db.begin() as session:
        event = session.get(InboundEvent, inbound_id)
        assert event is not None
        return event


def test_paid_before_created_ends_paid_end_to_end(runtime, live_server, redis_client):
    """Real HTTP in, a real RQ worker out: the late `created` never overwrites `paid`."""
    kit.create_source(runtime, "psp", SW)
    ids = []
    for event_id, version, status in (("evt_paid", 2, "paid"), ("evt_created", 1, "created")):
        body, headers = kit.signed_callback(
            SW, event_id=event_id, resource_id="pay_1", version=version, status=status
        )
        response = requests.post(
            f"{live_server.url}/inbound/psp", data=body, headers=dict(headers), timeout=10
        )
        assert response.status_code == 202
        ids.append(response.json()["id"])
    assert Queue(INBOUND, connection=redis_client).count == 2
    assert run_worker(runtime, burst=True)
    paid, created = (event_of(runtime, i) for i in ids)
    assert (paid.status, paid.reason) == ("applied", None)
    assert (created.status, created.reason) == ("ignored", "stale_event")
    state = state_of(runtime)
    assert (state.status, state.last_version, state.placeholder) == ("paid", 2, False)
    assert state.last_event_id == paid.id
    # The API reports the same.
    from app.accounts import create_api_key

    with runtime.db.begin() as session:
        _, token = create_api_key(session, "reader", ["read"])
    answer = requests.get(
        f"{live_server.url}/v1/sources/psp/resources/pay_1",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    ).json()
    assert answer["status"] == "paid" and answer["version"] == 2
    assert answer["occurred_at"] and answer["updated_at"]


def test_stale_event_is_ignored_and_only_side_effect_handlers_run(runtime):
    kit.create_source(runtime, "psp", SW, handlers=[f"{HERE}:record", f"{HERE}:audit"])
    newer = store(runtime, "psp", event_id="e3", version=3, status="paid")
    older = store(runtime, "psp", event_id="e2", version=2, status="pending")
    same = store(runtime, "psp", event_id="e3-again", version=3, status="paid")
    assert process.process_event(newer.inbound_event_id) == "applied"
    assert process.process_event(older.inbound_event_id) == "ignored"
    assert process.process_event(same.inbound_event_id) == "ignored"
    assert event_of(runtime, older.inbound_event_id).reason == "stale_event"
    assert event_of(runtime, same.inbound_event_id).reason == "stale_event"
    state = state_of(runtime)
    assert (state.status, state.last_version) == ("paid", 3)
    assert _seen == [
        ("state", "pay_1", 3, False),
        ("audit", "pay_1", 3, False),
        ("audit", "pay_1", 2, True),
        ("audit", "pay_1", 3, True),
    ]


def test_occurred_at_orders_events_that_have_no_version(runtime):
    kit.create_source(runtime, "stripe", "stripe")
    t0 = time.time() - 100
    late = store(
        runtime,
        "stripe",
        scheme="stripe",
        event_id="evt_b",
        resource_id="pi_1",
        status="succeeded",
        occurred=t0 + 10,
    )
    early = store(
        runtime,
        "stripe",
        scheme="stripe",
        event_id="evt_a",
        resource_id="pi_1",
        status="processing",
        occurred=t0,
    )
    assert process.process_event(late.inbound_event_id) == "applied"
    assert process.process_event(early.inbound_event_id) == "ignored"
    state = state_of(runtime, "pi_1")
    assert state.status == "succeeded" and state.last_version is None
    assert state.resource_type == "payment_intent"
    assert int(state.last_occurred_at.timestamp()) == int(t0 + 10)


def test_same_time_with_another_status_is_a_contradiction(runtime):
    kit.create_source(runtime, "stripe", "stripe")
    t0 = time.time()
    first = store(
        runtime,
        "stripe",
        scheme="stripe",
        event_id="evt_a",
        resource_id="pi_1",
        status="requires_capture",
        occurred=t0,
    )
    second = store(
        runtime,
        "stripe",
        scheme="stripe",
        event_id="evt_b",
        resource_id="pi_1",
        status="canceled",
        occurred=t0,
    )
    assert process.process_event(first.inbound_event_id) == "applied"
    assert process.process_event(second.inbound_event_id) == "quarantined"
    assert event_of(runtime, second.inbound_event_id).reason.startswith("contradiction")


def test_unknown_resource_gets_a_placeholder_state(runtime):
    kit.create_source(runtime, "psp", SW, allow_gaps=False)
    gap = store(runtime, "psp", event_id="e5", version=5, status="paid")
    assert process.process_event(gap.inbound_event_id) == "quarantined"
    state = state_of(runtime)
    assert state is not None and state.placeholder is True
    assert (state.status, state.last_version) == (None, None)


def test_version_gap_is_quarantined_then_released_when_the_gap_closes(runtime, redis_client):
    kit.create_source(runtime, "psp", SW, allow_gaps=False)
    v1 = store(runtime, "psp", event_id="e1", version=1, status="created")
    v3 = store(runtime, "psp", event_id="e3", version=3, status="paid")
    v2 = store(runtime, "psp", event_id="e2", version=2, status="authorized")
    assert process.process_event(v1.inbound_event_id) == "applied"
    assert process.process_event(v3.inbound_event_id) == "quarantined"
    event = event_of(runtime, v3.inbound_event_id)
    assert event.reason == "version_gap: expected version 2, got 3"
    with runtime.db.begin() as session:  # no pull API: nothing to ask
        assert session.scalars(select(ReconcileRequest)).all() == []
    inbound = Queue(INBOUND, connection=redis_client)
    inbound.empty()
    assert process.process_event(v2.inbound_event_id) == "applied"
    released = event_of(runtime, v3.inbound_event_id)
    assert (released.status, released.reason) == ("received", "gap_closed")
    assert [j.args for j in inbound.jobs] == [(v3.inbound_event_id,)]
    assert process.process_event(v3.inbound_event_id) == "applied"
    state = state_of(runtime)
    assert (state.status, state.last_version) == ("paid", 3)


def test_gaps_are_allowed_by_default(runtime):
    kit.create_source(runtime, "psp", SW)
    for n, version in enumerate((1, 7)):
        receipt = store(runtime, "psp", event_id=f"e{n}", version=version, status=f"s{version}")
        assert process.process_event(receipt.inbound_event_id) == "applied"
    assert state_of(runtime).last_version == 7


def test_contradiction_is_quarantined_and_asks_for_reconciliation(runtime, redis_client):
    kit.create_source(runtime, "psp", SW, reconcile_url="http://127.0.0.1:9/state")
    paid = store(runtime, "psp", event_id="e1", version=2, status="paid")
    failed = store(runtime, "psp", event_id="e2", version=2, status="failed")
    assert process.process_event(paid.inbound_event_id) == "applied"
    inbound = Queue(INBOUND, connection=redis_client)
    inbound.empty()
    assert process.process_event(failed.inbound_event_id) == "quarantined"
    event = event_of(runtime, failed.inbound_event_id)
    assert event.reason.startswith("contradiction: version 2 is already applied")
    with runtime.db.begin() as session:
        request = session.scalars(select(ReconcileRequest)).one()
    assert (request.resource_id, request.state) == ("pay_1", "pending")
    assert [(j.func_name, j.args) for j in inbound.jobs] == [(INBOUND_RECONCILE, (request.id,))]
    assert state_of(runtime).status == "paid"


def test_handlers_run_inside_the_applying_transaction(runtime):
    kit.create_source(runtime, "ok", SW, handlers=[f"{HERE}:write_row"])
    receipt = store(runtime, "ok", event_id="e1", version=1)
    assert process.process_event(receipt.inbound_event_id) == "applied"
    with runtime.db.begin() as session:
        row = session.scalars(select(OperationalEvent)).one()
    assert row.subject_id == receipt.inbound_event_id and row.data == {"version": 1}


def test_a_failing_handler_rolls_back_everything_and_the_event_fails(runtime):
    kit.create_source(
        runtime,
        "bad",
        SW,
        handlers=[{"event_type": "payment.*", "path": f"{HERE}:write_then_fail"}],
    )
    receipt = store(runtime, "bad", event_id="e1", version=1, status="paid")
    assert process.process_event(receipt.inbound_event_id) == "failed"
    event = event_of(runtime, receipt.inbound_event_id)
    assert event.reason == f"handler_error: {HERE}:write_then_fail: RuntimeError: handler exploded"
    with runtime.db.begin() as session:
        assert session.scalars(select(OperationalEvent)).all() == []
        assert session.scalars(select(ResourceState)).all() == []


def test_handlers_match_event_types_by_pattern(runtime):
    kit.create_source(
        runtime, "psp", SW, handlers=[{"event_type": "payment.paid", "path": f"{HERE}:record"}]
    )
    for n, status in enumerate(("created", "paid")):
        receipt = store(runtime, "psp", event_id=f"e{n}", version=n + 1, status=status)
        process.process_event(receipt.inbound_event_id)
    assert _seen == [("state", "pay_1", 2, False)]


def test_handler_registered_through_an_entry_point(runtime, tmp_path, monkeypatch):
    dist = tmp_path / "kurir_test_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kurir-test-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[{handler_registry.ENTRY_POINT_GROUP}]\npayment.* = {HERE}:record\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    handler_registry.reload_entry_points()
    try:
        kit.create_source(runtime, "psp", SW)
        receipt = store(runtime, "psp", event_id="e1", version=4, status="paid")
        assert process.process_event(receipt.inbound_event_id) == "applied"
    finally:
        monkeypatch.undo()
        handler_registry.reload_entry_points()
    assert _seen == [("state", "pay_1", 4, False)]


def test_unimportable_handler_is_refused_when_the_source_is_configured(runtime):
    from app.errors import ValidationFailed

    for bad in ("no.such.module:fn", f"{HERE}:missing", "not a path", f"{HERE}:_seen_lock"):
        with pytest.raises(ValidationFailed):
            kit.create_source(runtime, "psp", SW, handlers=[bad])


def test_event_without_a_resource_is_applied_by_its_handlers(runtime):
    kit.create_source(runtime, "gh", "github", handlers=[f"{HERE}:record"])
    import json

    body = json.dumps({"zen": "Keep it logically awesome.", "hook_id": 1}).encode()
    headers = kit.sign(
        "github",
        kit.SECRETS["github"],
        body,
        [("X-GitHub-Delivery", "d-1"), ("X-GitHub-Event", "ping")],
    )
    receipt = receive.receive(runtime, "gh", headers, body)
    assert process.process_event(receipt.inbound_event_id) == "applied"
    assert event_of(runtime, receipt.inbound_event_id).reason == "no_resource"
    assert _seen == [("state", None, None, False)]


def test_a_duplicate_job_is_harmless_and_an_abandoned_claim_is_taken_over(runtime):
    kit.create_source(runtime, "psp", SW)
    receipt = store(runtime, "psp", event_id="e1", version=1)
    event_id = receipt.inbound_event_id
    with runtime.db.begin() as session:  # a worker claimed it, then died
        event = session.get(InboundEvent, event_id)
        event.status, event.attempts = "processing", 1
    assert process.process_event(event_id) is None  # its lease still runs
    assert event_of(runtime, event_id).status == "processing"
    later = utcnow() + timedelta(seconds=process.PROCESSING_LEASE_S + 1)
    assert process.sweep(runtime, now=later) == 1
    assert process.process_event(event_id, now=later) == "applied"
    assert event_of(runtime, event_id).attempts == 2
    assert process.process_event(event_id, now=later) is None


def test_a_worker_whose_claim_was_taken_over_cannot_finish(runtime):
    kit.create_source(runtime, "psp", SW)
    receipt = store(runtime, "psp", event_id="e1", version=1)
    first = process._claim(runtime, receipt.inbound_event_id, now=utcnow())
    later = utcnow() + timedelta(seconds=process.PROCESSING_LEASE_S + 1)
    second = process._claim(runtime, receipt.inbound_event_id, now=later)
    assert second.attempts == first.attempts + 1
    with pytest.raises(process._Lost), runtime.db.begin() as session:
        process._process(session, runtime, first, now=later)
    assert state_of(runtime) is None  # everything the slow worker did was rolled back
    with runtime.db.begin() as session:
        assert process._process(session, runtime, second, now=later) == "applied"
    assert state_of(runtime).last_version == 1


def test_sweeper_gives_up_after_max_attempts(runtime):
    kit.create_source(runtime, "psp", SW)
    receipt = store(runtime, "psp", event_id="e1", version=1)
    with runtime.db.begin() as session:
        event = session.get(InboundEvent, receipt.inbound_event_id)
        event.status, event.attempts = "processing", process.MAX_ATTEMPTS
    later = utcnow() + timedelta(seconds=process.PROCESSING_LEASE_S + 1)
    assert process.sweep(runtime, now=later) == 0
    event = event_of(runtime, receipt.inbound_event_id)
    assert event.status == "failed" and "gave up" in event.reason


# ------------------------------------------------------------------------------ replay


def test_replaying_an_applied_event_keeps_it_applied_and_state_unchanged(runtime):
    kit.create_source(runtime, "psp", SW, handlers=[f"{HERE}:record"])
    receipt = store(runtime, "psp", event_id="e1", version=2, status="paid")
    process.process_event(receipt.inbound_event_id)
    with runtime.db.begin() as session:
        event = replay.replay(session, runtime, receipt.inbound_event_id)
        assert (event.status, event.reason) == ("received", "replayed")
    assert process.process_event(receipt.inbound_event_id) == "applied"
    assert event_of(runtime, receipt.inbound_event_id).reason == "already_applied"
    assert len(_seen) == 1  # handlers did not run twice
    assert state_of(runtime).last_version == 2


def test_replaying_an_older_event_can_never_regress_state(runtime):
    kit.create_source(runtime, "psp", SW)
    old = store(runtime, "psp", event_id="e1", version=1, status="created")
    process.process_event(old.inbound_event_id)
    new = store(runtime, "psp", event_id="e2", version=2, status="paid")
    process.process_event(new.inbound_event_id)
    with runtime.db.begin() as session:
        replay.replay(session, runtime, old.inbound_event_id)
    assert process.process_event(old.inbound_event_id) == "ignored"
    state = state_of(runtime)
    assert (state.status, state.last_version) == ("paid", 2)


def test_replay_rereads_the_body_with_the_current_mapping(runtime):
    kit.create_source(runtime, "psp", SW)
    import json

    doc = {
        "id": "e1",
        "type": "payment.paid",
        "occurred_at": kit.iso(time.time()),
        "payment": {"id": "pay_9", "rev": 3, "state": "paid"},
    }
    body = json.dumps(doc).encode()
    headers = kit.sign(SW, kit.SECRETS[SW], body, [("webhook-id", "e1")])
    receipt = receive.receive(runtime, "psp", headers, body)  # no /resource: no resource
    assert process.process_event(receipt.inbound_event_id) == "applied"
    with runtime.db.begin() as session:
        source = session.scalars(select(InboundSource)).one()
        source.mapping = {
            "resource_id": "/payment/id",
            "resource_version": "/payment/rev",
            "status": "/payment/state",
        }
    sources.invalidate_cache()
    with runtime.db.begin() as session:
        replay.replay(session, runtime, receipt.inbound_event_id)
    assert process.process_event(receipt.inbound_event_id) == "applied"
    state = state_of(runtime, "pay_9")
    assert (state.status, state.last_version) == ("paid", 3)


def test_replay_of_an_event_being_processed_is_refused(runtime):
    from app.errors import Conflict

    kit.create_source(runtime, "psp", SW)
    receipt = store(runtime, "psp", event_id="e1", version=1)
    with runtime.db.begin() as session:
        session.get(InboundEvent, receipt.inbound_event_id).status = "processing"
    with pytest.raises(Conflict), runtime.db.begin() as session:
        replay.replay(session, runtime, receipt.inbound_event_id)


# ------------------------------------------------------------------------------ concurrency

_example = count()
RESOURCES, VERSIONS, WORKERS, RECEIVERS = 50, 20, 4, 2


@hsettings(
    max_examples=5,
    deadline=None,
    derandomize=False,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 2**32 - 1),
    duplicate_sends=st.integers(0, 200),
    duplicate_jobs=st.integers(0, 200),
)
def test_shuffled_duplicated_events_end_at_the_highest_version_under_four_workers(
    runtime, seed, duplicate_sends, duplicate_jobs
):
    """1,000 events over 50 resources, shuffled, some sent twice, some jobs run twice,
    received by 2 threads while 4 workers process concurrently: every resource ends at its
    highest version, and no resource ever moved backwards on the way."""
    name = f"psp-{next(_example)}"
    kit.create_source(runtime, name, SW, handlers=[f"{HERE}:record"])
    rng = random.Random(seed)
    events = [(f"r{r:02d}", v) for r in range(RESOURCES) for v in range(1, VERSIONS + 1)]
    sends = events + [rng.choice(events) for _ in range(duplicate_sends)]
    rng.shuffle(sends)
    bodies = {}
    for rid, v in events:
        bodies[(rid, v)] = kit.signed_callback(
            SW, event_id=f"{name}-{rid}-v{v}", resource_id=rid, version=v, status=f"s{v}"
        )

    work: queue.Queue[str | None] = queue.Queue()
    errors: list[BaseException] = []

    def worker() -> None:
        while (item := work.get()) is not None:
            try:
                process.process_event(item, runtime)
            except BaseException as exc:  # pragma: no cover - surfaced below
                errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(WORKERS)]
    for thread in threads:
        thread.start()
    accepted: list[str] = []

    def receiver(share: list[tuple[str, int]]) -> None:
        # Two receivers, so duplicates can also race each other into the unique index.
        for key in share:
            body, headers = bodies[key]
            try:
                receipt = receive.receive(runtime, name, headers, body)
            except BaseException as exc:  # pragma: no cover - surfaced below
                errors.append(exc)
                continue
            if receipt.status_code == 202:
                accepted.append(receipt.inbound_event_id)
                work.put(receipt.inbound_event_id)
            elif not receipt.duplicate:  # pragma: no cover
                errors.append(AssertionError(receipt))

    receivers = [
        threading.Thread(target=receiver, args=(sends[n::RECEIVERS],)) for n in range(RECEIVERS)
    ]
    try:
        for thread in receivers:
            thread.start()
        for thread in receivers:
            thread.join(120)
        for event_id in rng.sample(accepted, min(duplicate_jobs, len(accepted))):
            work.put(event_id)  # a job delivered twice
    finally:
        for _ in threads:
            work.put(None)
        for thread in threads:
            thread.join(120)
    assert not errors
    assert len(accepted) == len(events)

    with runtime.db.begin() as session:
        source_id = session.scalar(select(InboundSource.id).where(InboundSource.name == name))
        states = {
            s.resource_id: s
            for s in session.scalars(
                select(ResourceState).where(ResourceState.source_id == source_id)
            )
        }
        rows = list(
            session.scalars(select(InboundEvent).where(InboundEvent.source_id == source_id))
        )
    assert len(states) == RESOURCES
    wrong = [
        (rid, s.last_version, s.status)
        for rid, s in states.items()
        if (s.last_version, s.status) != (VERSIONS, f"s{VERSIONS}")
    ]
    assert wrong == []  # 100 % of resources at their highest version
    assert len(rows) == len(events)
    assert {r.status for r in rows} <= {"applied", "ignored"}
    assert all(r.reason == "stale_event" for r in rows if r.status == "ignored")
    # Every application moved its resource forward: the sequence per resource only rises.
    with _seen_lock:
        applied = [(rid, v) for kind, rid, v, _ in _seen if kind == "state" and rid in states]
        _seen.clear()
    per_resource: dict[str, list[int]] = {}
    for rid, v in applied:
        per_resource.setdefault(rid, []).append(v)
    assert all(seq == sorted(set(seq)) for seq in per_resource.values())
    assert sum(1 for r in rows if r.status == "applied") == len(applied)
