"""Processing callbacks many at a time: the same outcomes as one at a time, on both databases."""

from __future__ import annotations

import queue
import random
import threading
import time
from datetime import timedelta
from itertools import count

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from rq import Queue
from sqlalchemy import select, text

from app.clock import utcnow
from app.inbound import batch, process, receive
from app.inbound import handlers as handler_registry
from app.inbound.consumer import InboundConsumer
from app.models import InboundEvent, InboundSource, OperationalEvent, ResourceState
from app.queues import (
    INBOUND,
    INBOUND_PROCESS,
    INBOUND_RECONCILE,
    JobSpec,
    enqueue_many,
    pop_job_ids,
)
from app.runtime import Runtime
from tests.support import inbound as kit

# Run once more through PgBouncer in transaction mode (tests/conftest.py).
pytestmark = pytest.mark.pgbouncer

SW = "standard-webhooks"
HERE = "tests.integration.test_inbound_batch"

_seen: list[tuple[str, str | None, int | None, bool]] = []
_seen_lock = threading.Lock()


def record(ctx: handler_registry.HandlerContext) -> None:
    with _seen_lock:
        _seen.append(
            (
                ctx.event.event_id,
                ctx.event.resource_id,
                ctx.state.last_version if ctx.state else None,
                ctx.stale,
            )
        )


@handler_registry.side_effect_only
def audit(ctx: handler_registry.HandlerContext) -> None:
    with _seen_lock:
        _seen.append(("audit", ctx.event.resource_id, ctx.event.resource_version, ctx.stale))


def write_then_fail_on_pay_2(ctx: handler_registry.HandlerContext) -> None:
    ctx.session.add(OperationalEvent(kind="inbound.test", subject_id=ctx.event.id))
    ctx.session.flush()
    if ctx.event.resource_id == "pay_2":
        raise RuntimeError("handler exploded")


def broken_sql_on_pay_2(ctx: handler_registry.HandlerContext) -> None:
    if ctx.event.resource_id == "pay_2":
        ctx.session.execute(text("SELECT * FROM no_such_table"))


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
) -> str:
    body, headers = kit.signed_callback(
        SW, event_id=event_id, resource_id=resource_id, version=version, status=status
    )
    return receive.receive(runtime, name, headers, body).inbound_event_id


def rows(runtime: Runtime, source: str) -> dict[str, InboundEvent]:
    with runtime.db.begin() as session:
        source_id = session.scalar(select(InboundSource.id).where(InboundSource.name == source))
        return {
            e.event_id: e
            for e in session.scalars(
                select(InboundEvent).where(InboundEvent.source_id == source_id)
            )
        }


def states_of(runtime: Runtime, source: str) -> dict[str, tuple[int | None, str | None, bool]]:
    with runtime.db.begin() as session:
        source_id = session.scalar(select(InboundSource.id).where(InboundSource.name == source))
        return {
            s.resource_id: (s.last_version, s.status, s.placeholder)
            for s in session.scalars(
                select(ResourceState).where(ResourceState.source_id == source_id)
            )
        }


ARRIVALS = [
    ("e1", "pay_1", 2, "paid"),
    ("e2", "pay_1", 1, "created"),
    ("e3", "pay_2", 1, "created"),
    ("e4", "pay_2", 3, "refunded"),
    ("e5", "pay_2", 2, "paid"),
    ("e6", "pay_1", 2, "paid"),
    ("e7", "pay_3", 5, "paid"),
]


def test_a_batch_ends_every_event_as_one_at_a_time_would(runtime):
    """Same arrivals, processed one by one on one source and as one batch on another:
    the same statuses, reasons, states and handler calls (a late older event is stale)."""
    outcomes = {}
    for name in ("single", "batched"):
        kit.create_source(runtime, name, SW, handlers=[f"{HERE}:record", f"{HERE}:audit"])
        ids = [
            store(runtime, name, event_id=e, resource_id=r, version=v, status=s)
            for e, r, v, s in ARRIVALS
        ]
        with _seen_lock:
            _seen.clear()
        if name == "single":
            results = [process.process_event(i) for i in ids]
        else:
            by_id = batch.process_batch(runtime, ids)
            results = [by_id[i] for i in ids]
        with _seen_lock:
            seen = list(_seen)
        events = rows(runtime, name)
        outcomes[name] = (
            results,
            {k: (e.status, e.reason, e.attempts) for k, e in events.items()},
            states_of(runtime, name),
            seen,
        )
    assert outcomes["batched"] == outcomes["single"]
    results, statuses, states, seen = outcomes["batched"]
    assert results == ["applied", "ignored", "applied", "applied", "ignored", "ignored", "applied"]
    assert statuses["e2"] == ("ignored", "stale_event", 1)
    assert states == {
        "pay_1": (2, "paid", False),
        "pay_2": (3, "refunded", False),
        "pay_3": (5, "paid", False),
    }
    assert [s for s in seen if s[0] != "audit"] == [
        ("e1", "pay_1", 2, False),
        ("e3", "pay_2", 1, False),
        ("e4", "pay_2", 3, False),
        ("e7", "pay_3", 5, False),
    ]


def test_a_failing_handler_fails_only_its_own_event_of_the_batch(runtime):
    kit.create_source(runtime, "psp", SW, handlers=[f"{HERE}:write_then_fail_on_pay_2"])
    ids = [
        store(runtime, "psp", event_id=f"e{n}", resource_id=f"pay_{n}", version=1, status="paid")
        for n in (1, 2, 3)
    ]
    assert batch.process_batch(runtime, ids) == {
        ids[0]: "applied",
        ids[1]: "failed",
        ids[2]: "applied",
    }
    events = rows(runtime, "psp")
    assert events["e2"].reason == (
        f"handler_error: {HERE}:write_then_fail_on_pay_2: RuntimeError: handler exploded"
    )
    # Nothing of the failed event stays: not its handler's row, not its state change.
    assert states_of(runtime, "psp") == {
        "pay_1": (1, "paid", False),
        "pay_2": (None, None, True),
        "pay_3": (1, "paid", False),
    }
    with runtime.db.begin() as session:
        written = set(session.scalars(select(OperationalEvent.subject_id)))
    assert written == {ids[0], ids[2]}


def test_gaps_in_a_batch_are_quarantined_and_released_when_they_close(runtime, redis_client):
    kit.create_source(
        runtime, "psp", SW, allow_gaps=False, reconcile_url="http://127.0.0.1:9/state"
    )
    first = [
        store(runtime, "psp", event_id=e, version=v, status=s)
        for e, v, s in (("e1", 1, "created"), ("e3", 3, "paid"))
    ]
    inbound = Queue(INBOUND, connection=redis_client)
    inbound.empty()
    assert batch.process_batch(runtime, first) == {first[0]: "applied", first[1]: "quarantined"}
    assert rows(runtime, "psp")["e3"].reason == "version_gap: expected version 2, got 3"
    (job,) = inbound.jobs  # the pull that was asked for, enqueued after the commit
    assert job.func_name == INBOUND_RECONCILE
    inbound.empty()
    second = store(runtime, "psp", event_id="e2", version=2, status="authorized")
    inbound.empty()
    assert batch.process_batch(runtime, [second]) == {second: "applied"}
    released = rows(runtime, "psp")["e3"]
    assert (released.status, released.reason) == ("received", "gap_closed")
    assert [j.args for j in inbound.jobs] == [(released.id,)]
    assert batch.process_batch(runtime, [released.id]) == {released.id: "applied"}
    assert states_of(runtime, "psp")["pay_1"] == (3, "paid", False)


def test_duplicate_ids_and_final_events_are_left_alone(runtime):
    kit.create_source(runtime, "psp", SW)
    done = store(runtime, "psp", event_id="e1", version=1)
    assert process.process_event(done) == "applied"
    fresh = store(runtime, "psp", event_id="e2", version=2, status="paid")
    assert batch.process_batch(runtime, [fresh, done, fresh, "ine_unknown"]) == {fresh: "applied"}
    events = rows(runtime, "psp")
    assert (events["e1"].attempts, events["e2"].attempts) == (1, 1)
    assert batch.process_batch(runtime, [fresh]) == {}


def test_a_claim_taken_over_in_the_middle_of_a_batch_is_left_to_its_new_owner(runtime):
    kit.create_source(runtime, "psp", SW)
    ids = [
        store(runtime, "psp", event_id=f"e{n}", resource_id=f"pay_{n}", version=1)
        for n in (1, 2, 3)
    ]
    start = utcnow()
    claimed = batch.claim_many(runtime, ids, now=start)
    assert [c.id for c in claimed] == ids
    # The batch stalled past its lease; another worker took e2 over.
    later = start + timedelta(seconds=process.PROCESSING_LEASE_S + 1)
    owner = process._claim(runtime, ids[1], now=later)
    assert owner is not None
    assert batch.process_claimed_batch(runtime, claimed, now=later) == {
        ids[0]: "applied",
        ids[1]: None,
        ids[2]: "applied",
    }
    # Nothing of the loser stays (the placeholder of a resource seen is created beforehand).
    assert states_of(runtime, "psp")["pay_2"] == (None, None, True)
    assert process.process_claimed(runtime, owner, now=later) == "applied"
    assert rows(runtime, "psp")["e2"].attempts == 2


def test_a_database_error_in_one_event_sends_the_batch_one_by_one(runtime):
    """The batch rolls back; its events are processed again on their own: the others are
    applied, the broken one is left `processing` for the sweeper, as one event would be."""
    kit.create_source(runtime, "psp", SW, handlers=[f"{HERE}:broken_sql_on_pay_2"])
    ids = [
        store(runtime, "psp", event_id=f"e{n}", resource_id=f"pay_{n}", version=1)
        for n in (1, 2, 3)
    ]
    assert batch.process_batch(runtime, ids) == {ids[0]: "applied", ids[1]: None, ids[2]: "applied"}
    assert rows(runtime, "psp")["e2"].status == "processing"
    assert states_of(runtime, "psp")["pay_1"] == (1, "created", False)


def test_the_consumer_takes_many_jobs_per_step_and_runs_other_jobs(runtime, redis_client):
    kit.create_source(runtime, "psp", SW)
    ids = [
        store(runtime, "psp", event_id=f"e{n}", resource_id=f"pay_{n % 3}", version=n)
        for n in range(1, 8)
    ]
    # A duplicate job and a job whose hash is already gone are harmless; a job for another
    # function is run as RQ would run it.
    enqueue_many(
        redis_client,
        [
            JobSpec(INBOUND, INBOUND_PROCESS, (ids[0],)),
            JobSpec(INBOUND, f"{HERE}.noted", ("hello",)),
            JobSpec(INBOUND, INBOUND_PROCESS, (ids[1],), job_id="gone"),
        ],
    )
    redis_client.delete("rq:job:gone")
    _noted.clear()
    consumer = InboundConsumer(runtime, redis_client, threading.Event(), block_s=0.1)
    assert consumer.step() == 10
    assert (consumer.jobs, consumer.events) == (10, 8)
    assert consumer.step() == 0
    assert Queue(INBOUND, connection=redis_client).count == 0
    assert redis_client.keys("rq:job:*") == []
    assert {e.status for e in rows(runtime, "psp").values()} == {"applied"}
    assert _noted == ["hello"]


_noted: list[str] = []


def noted(word: str) -> None:
    _noted.append(word)


def test_jobs_lost_with_a_worker_are_found_again_by_the_sweeper(runtime, redis_client):
    """A worker popped jobs and died before claiming; another claimed a batch and died
    before applying it: the sweeper enqueues both kinds again, and a consumer applies them."""
    kit.create_source(runtime, "psp", SW)
    ids = [
        store(runtime, "psp", event_id=f"e{n}", resource_id=f"pay_{n}", version=1) for n in range(6)
    ]
    key = Queue(INBOUND, connection=redis_client).key
    assert len(pop_job_ids(redis_client, key, 100, 0.1)) == 6  # popped, then the worker died
    lease = timedelta(seconds=process.PROCESSING_LEASE_S + 1)
    batch.claim_many(runtime, ids[:3], now=utcnow() - lease)  # claimed, then the worker died
    assert process.sweep(runtime) == 3  # the abandoned claims: their lease has run out
    # The popped ones once they have waited past the grace a fresh job is given.
    assert (
        process.sweep(runtime, now=utcnow() + timedelta(seconds=process.RECEIVED_GRACE_S + 1)) == 6
    )
    consumer = InboundConsumer(runtime, redis_client, threading.Event(), block_s=0.1)
    assert consumer.step() == 9  # three of them twice: harmless
    events = rows(runtime, "psp")
    assert {e.status for e in events.values()} == {"applied"}
    assert sorted(e.attempts for e in events.values()) == [1, 1, 1, 2, 2, 2]


# ------------------------------------------------------------------------------ concurrency

_example = count()
RESOURCES, VERSIONS, WORKERS = 40, 15, 4


@hsettings(
    max_examples=3,
    deadline=None,
    derandomize=False,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 2**32 - 1),
    duplicate_jobs=st.integers(0, 150),
    largest_batch=st.integers(1, 120),
)
def test_concurrent_batches_and_single_jobs_never_move_a_resource_backwards(
    runtime, seed, duplicate_jobs, largest_batch
):
    """600 events over 40 resources, shuffled and received while 4 workers take random
    batches (one of them one event at a time), some jobs twice: every resource ends at its
    highest version, and every application moved its resource forward."""
    name = f"psp-{next(_example)}"
    kit.create_source(runtime, name, SW, handlers=[f"{HERE}:record"])
    rng = random.Random(seed)
    events = [(f"r{r:02d}", v) for r in range(RESOURCES) for v in range(1, VERSIONS + 1)]
    rng.shuffle(events)
    signed = {
        key: kit.signed_callback(
            SW,
            event_id=f"{name}-{key[0]}-v{key[1]}",
            resource_id=key[0],
            version=key[1],
            status=f"s{key[1]}",
        )
        for key in events
    }
    work: queue.Queue[str | None] = queue.Queue()
    errors: list[BaseException] = []

    def worker(single: bool, seed: int) -> None:
        local = random.Random(seed)
        done = False
        while not done:
            size = 1 if single else local.randint(1, largest_batch)
            taken = []
            item = work.get()
            while item is not None:
                taken.append(item)
                if len(taken) >= size:
                    break
                try:
                    item = work.get(timeout=0.01)
                except queue.Empty:
                    break
            done = item is None
            try:
                if single:
                    for event_id in taken:
                        process.process_event(event_id, runtime)
                elif taken:
                    batch.process_batch(runtime, taken)
            except BaseException as exc:  # pragma: no cover - surfaced below
                errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n == 0, seed + n)) for n in range(WORKERS)]
    for thread in threads:
        thread.start()
    accepted = []
    try:
        for key in events:
            body, headers = signed[key]
            receipt = receive.receive(runtime, name, headers, body)
            accepted.append(receipt.inbound_event_id)
            work.put(receipt.inbound_event_id)
        for event_id in rng.sample(accepted, min(duplicate_jobs, len(accepted))):
            work.put(event_id)
    finally:
        for _ in threads:
            work.put(None)
        deadline = time.monotonic() + 240
        for thread in threads:
            thread.join(max(1, deadline - time.monotonic()))
    assert not errors
    assert not any(thread.is_alive() for thread in threads)

    states = states_of(runtime, name)
    assert len(states) == RESOURCES
    assert {rid: s for rid, s in states.items() if s != (VERSIONS, f"s{VERSIONS}", False)} == {}
    events_by_id = rows(runtime, name)
    assert len(events_by_id) == len(events)
    assert {e.status for e in events_by_id.values()} <= {"applied", "ignored"}
    assert all(e.reason == "stale_event" for e in events_by_id.values() if e.status == "ignored")
    with _seen_lock:
        applied = [(rid, v) for _, rid, v, _ in _seen if rid in states]
        _seen.clear()
    per_resource: dict[str, list[int]] = {}
    for rid, v in applied:
        per_resource.setdefault(rid, []).append(v)
    assert all(seq == sorted(set(seq)) for seq in per_resource.values())
    assert sum(1 for e in events_by_id.values() if e.status == "applied") == len(applied)
