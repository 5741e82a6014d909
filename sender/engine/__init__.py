"""The per-process delivery engine: turns due deliveries into attempts.

The RQ job (`kurir.deliver_batch`, i.e. `sender.jobs.deliver_batch`) sends nothing itself: it
hands delivery ids to this process's `Engine`, which takes them through these stages, one
module each:

1. `claim`: **guard and claim** with one conditional UPDATE: every due delivery whose
   endpoint is enabled becomes `delivering`, with a lease (on PostgreSQL one statement in
   autocommit that also returns the payloads and the targets of stage 2: one round trip).
   What was not claimed is looked at again: final, in flight elsewhere, due within
   `claim.LOOKAHEAD_S` (a local timer), parked when its endpoint is disabled, or held when it
   waits for verification (`sender.verification`). Duplicate jobs are harmless.
2. `targets`: **read** each claimed endpoint's URL, headers, timeout and live secrets
   (decrypted, cached by ciphertext), afresh for every batch. A fault that belongs to one
   endpoint or one delivery (a secret KURIR_SECRET_KEY cannot decrypt, stored headers that
   are not an object, a missing event...) fails only its deliveries: each is recorded at once
   as a failed attempt with an error class saying why (`errors`), and takes the normal retry,
   health and dead-letter path while the rest of the batch goes on.
3. `admission`: **admit** per endpoint: a healthy endpoint takes the whole batch into its
   local queue; a slow one only what its small slow-lane cap can start now; a rate-limited one
   only the send slots Redis grants it. The rest is *held* (given back with a timer).
4. `lanes`: **send** on two thread pools: healthy endpoints on the fast lane, slow ones on the
   slow lane, each endpoint capped in flight, so a hanging endpoint can never occupy the
   threads healthy endpoints need. The RQ job returns at once.
5. `recorder`: **record** in batches: one writer thread stores attempts, endpoint health,
   new states and dead letters for up to `recorder.FLUSH_MAX_ITEMS` attempts per transaction,
   gathered for up to `recorder.GROUP_COMMIT_S` (group commit at a trickle); on PostgreSQL
   each kind of row is one statement per batch (`rowsets`).
6. `ordering`: **wake**: when a delivery of an ordered key is recorded as released, the next
   one of its key is claimed at once (the claim holds it back until then; `sender.ordering`).
7. `timers`: **wait**: local timers for retries and holds due soon, and the housekeeper that
   fires them and hands back what waited too long in a local queue.

`ledger` holds what all stages share: one lock, the per-endpoint rooms, and the counts of
deliveries waiting, in flight and unflushed (`idle()`, and backpressure on new jobs).

The lease (`lease_expires_at`) is the database's truth about who owns a delivery. It is long
enough for the longest wait plus the longest send; when a worker dies, the sweeper finds the
expired lease, records a `worker_lost` attempt and makes the delivery due again. Every state
change a worker writes is fenced on the lease it claimed with, so a worker that lost its lease
can still add its attempt record but never overwrite the new owner's state. For rows that are
not `delivering`, a lease in the future means "someone holds a timer for it"; the sweeper
leaves such rows alone until the lease passes (see `sender.sweeper`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from redis.backoff import NoBackoff
from redis.retry import Retry
from sqlalchemy.orm import Session

from app import redis_client
from app.budget import WORKER_SIDE_CHANNEL
from app.clock import utcnow
from app.db_direct import Held
from app.net import guard
from app.net.http import Transport
from app.runtime import Runtime
from sender import health
from sender.bodies import read_bodies
from sender.deliver import Target
from sender.engine import claim
from sender.engine.admission import MAX_LOCAL_WAIT_S, Admission
from sender.engine.claim import HOLD_GRACE_S
from sender.engine.errors import ERROR_EVENT_MISSING
from sender.engine.lanes import Lanes
from sender.engine.ledger import Ledger
from sender.engine.ordering import Sequencer
from sender.engine.recorder import Recorder
from sender.engine.sql import transient
from sender.engine.targets import TargetReader
from sender.engine.timers import Housekeeper, Timers
from sender.engine.work import Release, Unsendable, Work
from sender.policy import RetryPolicy
from sender.ratelimit import RateLimiter

log = logging.getLogger(__name__)

# Backpressure: a job waits while this many admitted deliveries are waiting for a thread.
HIGH_WATER_PER_THREAD = 16
HIGH_WATER_MIN = 200
BACKPRESSURE_MAX_WAIT_S = 30.0
# A claim that fails on a transient database error is tried this many times in all.
CLAIM_TRIES = 3
# Foreign keys make this rare (the event's deletion cascades), never a reason to stop a batch.
EVENT_MISSING = Unsendable(
    ERROR_EVENT_MISSING, "the delivery's event (or its pinned version) no longer exists"
)


class Engine:
    """Per-process delivery machinery: builds the stages, runs their threads, takes jobs."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        transport: Transport | None = None,
        clock: Callable[[], datetime] = utcnow,
        rng: random.Random | None = None,
        fast_threads: int | None = None,
        slow_threads: int | None = None,
    ) -> None:
        settings = runtime.settings
        self.runtime = runtime
        self.settings = settings
        self.clock = clock
        self.rng = rng or random.Random()  # noqa: S311 - jitter, not security
        fast_cap = settings.endpoint_concurrency
        self.fast_threads = fast_threads or settings.worker_threads
        self.slow_threads = slow_threads or max(2, settings.worker_threads // 4)
        self.transport = transport or Transport(pool_maxsize=self.fast_threads + self.slow_threads)
        # Side channels (slow flags, rate-limit slots) fail fast: a Redis outage must not add
        # redis-py's retry backoff to every claim.
        self.redis = redis_client.connect(
            settings.resolved_redis_url,
            socket_timeout=2.0,
            socket_connect_timeout=2.0,
            retry=Retry(NoBackoff(), 0),
            client_name=runtime.name,
            max_connections=WORKER_SIDE_CHANNEL,
        )
        self.limiter = RateLimiter(self.redis)
        self.high_water = max(HIGH_WATER_MIN, HIGH_WATER_PER_THREAD * self.fast_threads)
        self._stopping = threading.Event()
        self._process_lock = threading.Lock()
        # PostgreSQL: the claim's connection, kept while jobs flow (`rest` gives it back),
        # and given back before the claimer opens a transaction, so that it never holds two
        # of the process's budget.
        self._claim_connection = Held()

        self.ledger = Ledger()
        self.targets = TargetReader(lambda: runtime.secret_box, settings.default_timeout_s)
        self.admission = Admission(
            self.ledger,
            self.redis,
            self.limiter,
            self.rng,
            fast_cap=fast_cap,
            slow_cap=max(1, fast_cap // 2),
        )
        self.timers = Timers(self.ledger)
        self.sequencer = Sequencer(lambda: runtime.db, self.timers.hold, clock)
        self.recorder = Recorder(
            lambda: runtime.db,
            self.ledger,
            policy=RetryPolicy(
                schedule=tuple(settings.retry_schedule), jitter=settings.retry_jitter
            ),
            thresholds=health.Thresholds(
                settings.disable_after_failures, settings.disable_after_seconds
            ),
            rng=self.rng,
            clock=clock,
            stopping=self._stopping,
            on_timers=self.timers.hold,
            on_flushed=self.sequencer.after_flush,
        )
        self.lanes = Lanes(
            self.ledger,
            self.admission,
            self.recorder,
            self.transport,
            guard.policy_from(settings),
            connect_timeout_s=settings.connect_timeout_s,
            clock=clock,
            fast_threads=self.fast_threads,
            slow_threads=self.slow_threads,
        )
        self._writer: threading.Thread | None = None
        self.started = False
        self.stopped = False

    @property
    def counters(self) -> dict[str, int]:
        return self.ledger.counters

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Engine:
        if self.started:
            return self
        self.started = True
        self._writer = threading.Thread(target=self.recorder.run, name="kurir-writer", daemon=True)
        self._writer.start()
        threading.Thread(
            target=Housekeeper(self._tick, self._stopping).run, name="kurir-timers", daemon=True
        ).start()
        self.lanes.start()
        return self

    def stop(self, timeout_s: float = 40.0) -> None:
        """Finish what is being sent, hand back what is not, flush every record."""
        if self.stopped or not self.started:
            self.stopped = True
            return
        self._stopping.set()
        with self.ledger.lock:
            releases = self.lanes.drain()
            deferred, timed = self.timers.drain()
            for work in deferred:
                releases.append(Release(work, None))
                self.ledger.waiting -= 1
        for release in releases:
            self.recorder.put(release)
        deadline = time.monotonic() + timeout_s
        self.lanes.close(deadline)
        self.recorder.close()
        if self._writer is not None:
            self._writer.join(max(0.1, deadline - time.monotonic()))
        if timed:
            claim.forget_holds(self.runtime.db, timed)
        self.rest()
        self.transport.close()
        self.redis.close()
        self.stopped = True
        log.info("delivery engine stopped", extra=dict(self.counters))

    def rest(self) -> None:
        """No job came for a while: give the claim's connection back to the pool."""
        with self._process_lock:
            self._claim_connection.release()

    def idle(self) -> bool:
        """Nothing waiting, in flight or unflushed (timers may still be set)."""
        return self.ledger.idle()

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        return self.ledger.wait_idle(timeout_s)

    def stats(self) -> dict[str, int]:
        with self.ledger.lock:
            return {
                "waiting": self.ledger.waiting,
                "inflight": self.ledger.inflight,
                "unflushed": self.ledger.unflushed,
                "timers": len(self.timers),
            }

    # ------------------------------------------------------------------ the job

    def submit(self, delivery_ids: Sequence[str]) -> int:
        """Guard, admit and claim; returns how many deliveries were taken to send."""
        if self._stopping.is_set():
            return 0
        self.ledger.wait_below(self.high_water, BACKPRESSURE_MAX_WAIT_S)
        return self._process(list(delivery_ids))

    def _process(self, ids: list[str]) -> int:
        with self._process_lock:
            for try_no in range(CLAIM_TRIES):
                try:
                    return self._process_once(ids)
                except Exception as exc:
                    if not transient(exc) or try_no == CLAIM_TRIES - 1:
                        raise
                    log.warning("claim failed, retrying: %s", exc)
                    time.sleep(0.05 * (try_no + 1))
        return 0

    def _lease_until(self, timeout_s: float, now: datetime) -> datetime:
        return now + timedelta(
            seconds=claim.lease_seconds(
                timeout_s,
                floor_s=float(self.settings.delivery_lease_seconds),
                local_wait_s=MAX_LOCAL_WAIT_S,
                horizon_s=self.limiter.horizon_s,
            )
        )

    def _process_once(self, ids: list[str]) -> int:
        """Claim first, then look closer only at what was not claimed.

        On PostgreSQL the claim and the targets are one statement in autocommit (one round
        trip); a transaction is opened after it only when something needs one (ids not
        claimed, a longer lease, deliveries to hold). On SQLite all of it is one transaction.
        """
        with self.ledger.lock:
            self.ledger.counters["jobs"] += 1
            ids = [i for i in dict.fromkeys(ids) if i not in self.ledger.local]
        if not ids:
            return 0
        now = self.clock()
        # The lease assumes the longest timeout this process knows of; it is lengthened below
        # when a newly seen endpoint needs more.
        lease = self._lease_until(self.targets.longest_timeout(), now)
        db = self.runtime.db
        if db.is_postgres:
            got = claim.claim_with_targets(db, ids, now, lease, self._claim_connection)
            plan = self._claimed(ids, got, self.targets.build(got.targets or [], now), now, None)
        else:
            with db.begin() as session:
                got = claim.claim_due(session, ids, now, lease)
                endpoint_ids = {r.endpoint_id for r in got.rows}
                read = self.targets.read(session, endpoint_ids, now) if endpoint_ids else ({}, {})
                plan = self._claimed(ids, got, read, now, session)
        # Only once everything is committed does anything start.
        return self._launch(plan, now)

    def _claimed(
        self,
        ids: list[str],
        got: claim.Claimed,
        read: tuple[dict[str, Target], dict[str, Unsendable]],
        now: datetime,
        session: Session | None,
    ) -> _Plan:
        """Admit what was claimed, and settle the rest: what was not claimed, what must wait
        (held), a lease to lengthen. Writes go to `session`, or to a transaction of their own:
        should that one fail after the claim committed, what the claim took waits for its
        lease to expire and the sweeper, as when a worker dies."""
        rows, bodies, lease = got.rows, got.bodies, got.lease
        targets, broken = read
        later: list[tuple[str, datetime]] = []
        held: list[tuple[str, datetime]] = []
        claimed: list[tuple[Work, float]] = []
        failed: list[tuple[Work, Unsendable]] = []
        admitted: list[tuple[Any, float]] = []
        not_due = 0
        taken = {r.id for r in rows}
        unclaimed = [i for i in ids if i not in taken]
        needed = lease
        if rows:
            with self.ledger.lock:
                # Due now (a manual retry, say): a local timer for it is not needed.
                for row in rows:
                    self.timers.cancel(row.id)
            admitted, held = self.admission.admit(
                [r for r in rows if r.endpoint_id not in broken], targets, now
            )
            needed = self._lease_until(max(t.timeout_s for t in targets.values()), now)
        if unclaimed or held or needed > lease or (bodies is None and admitted):
            with self._transaction(session) as tx:
                if unclaimed:
                    later, not_due = claim.look_at_unclaimed(tx, unclaimed, now)
                if needed > lease:
                    claim.extend_lease(tx, [r.id for r in rows], lease, needed)
                    lease = needed
                if held:
                    claim.unclaim(
                        tx,
                        [i for i, _ in held],
                        lease,
                        max(u for _, u in held) + timedelta(seconds=HOLD_GRACE_S),
                    )
                if bodies is None:
                    bodies = read_bodies(tx, {(r.event_id, r.version) for r, _ in admitted})
        for row, offset in admitted:
            body = (bodies or {}).get((row.event_id, row.version))
            if body is None:
                failed.append((_work(row, targets, b"", lease), EVENT_MISSING))
            else:
                claimed.append((_work(row, targets, body, lease), offset))
        # Claimed as well, so that their failed attempts are fenced on this lease.
        failed += [
            (_work(row, targets, b"", lease), broken[row.endpoint_id])
            for row in rows
            if row.endpoint_id in broken
        ]
        return _Plan(claimed, failed, later + held, len(held), not_due)

    def _launch(self, plan: _Plan, now: datetime) -> int:
        """Set the timers, start the claimed work, record what cannot be sent."""
        self.timers.hold(plan.timed, now)
        self._start(plan.claimed)
        if plan.failed:
            self.recorder.unsendable(plan.failed)
        self.ledger.count(claimed=len(plan.claimed), held=plan.held, not_due=plan.not_due)
        return len(plan.claimed)

    @contextmanager
    def _transaction(self, session: Session | None) -> Iterator[Session]:
        """`session` when the caller has one open, else a transaction of its own."""
        if session is not None:
            yield session
            return
        self._claim_connection.release()
        with self.runtime.db.begin() as own:
            yield own

    def _start(self, claimed: list[tuple[Work, float]]) -> None:
        """Admitted work waits locally: on a timer for its rate-limit slot, or in its queue."""
        mono = time.monotonic()
        with self.ledger.lock:
            for work, offset in claimed:
                self.ledger.local.add(work.delivery_id)
                self.ledger.waiting += 1
                if offset > 0.001:
                    self.timers.defer(work, mono + offset)
                else:
                    self.lanes.enqueue(work, mono)

    def _tick(self) -> None:
        """Fire due timers; hand back what waited too long in a local queue."""
        mono = time.monotonic()
        with self.ledger.lock:
            works, ids = self.timers.pop_due(mono)
            for work in works:
                self.lanes.enqueue(work, mono)
            releases = self.lanes.expire_waits(mono)
        for release in releases:
            self.recorder.put(release)
        if ids:
            try:
                self._process(ids)
            except Exception:
                log.warning(
                    "timed deliveries could not be processed; the sweeper will", exc_info=True
                )


@dataclass(frozen=True)
class _Plan:
    """What a claim settled, to start once its writes are committed."""

    claimed: list[tuple[Work, float]]
    failed: list[tuple[Work, Unsendable]]
    timed: list[tuple[str, datetime]]
    held: int
    not_due: int


def _work(row: Any, targets: dict[str, Target], body: bytes, lease: datetime) -> Work:
    """A claimed row as work for the lanes (or the recorder): its next attempt's numbers."""
    return Work(
        delivery_id=row.id,
        event_id=row.event_id,
        target=targets[row.endpoint_id],
        body=body,
        n=row.attempt_count + 1,
        run_n=row.run_attempts + 1,
        lease=lease,
        sequence=row.ordering_seq,
        previous_event_id=row.previous_event_id,
        # Only in the claim's rows while tracing is on.
        trace_context=getattr(row, "trace_context", None),
    )


__all__ = ["Engine"]
