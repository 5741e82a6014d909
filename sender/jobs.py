"""The delivery job and the per-process engine that turns due deliveries into attempts.

`deliver_batch(delivery_ids)` is the RQ job. It does not send anything itself: it hands the
ids to the process's `Engine`, which

1. **guards**: re-reads every delivery and drops what is final, in flight elsewhere or not due
   (a delivery due within `LOOKAHEAD_S` waits on a local timer), so duplicate jobs are harmless;
2. **admits** per endpoint: a healthy endpoint takes the whole batch into its local queue; an
   endpoint that recently timed out or refused connections ("slow") takes only what its small
   slow-lane cap can start now; a rate-limited endpoint takes only the send slots Redis grants
   it. The rest is *held* (not claimed, a timer set), never dropped;
3. **claims** what it admitted with one conditional UPDATE: `delivering`, with a lease;
4. **sends** on two thread pools (lanes): healthy endpoints on the fast lane, slow ones on the
   slow lane, each endpoint capped in flight, so a hanging endpoint can never occupy the threads
   healthy endpoints need (no head-of-line blocking), and the RQ job returns at once;
5. **records** in batches: one writer thread stores attempts, outcomes, endpoint health and dead
   letters for up to `FLUSH_MAX_ITEMS` attempts per transaction.

The lease (`lease_expires_at`) is the database's truth about who owns a delivery. It is long
enough for the longest wait plus the longest send; when a worker dies, the sweeper finds the
expired lease, records a `worker_lost` attempt and makes the delivery due again. Every state
change a worker writes is fenced on the lease it claimed with, so a worker that lost its lease
can still add its attempt record but never overwrite the new owner's state.

For rows that are not `delivering`, a lease in the future means "someone holds a timer for
it"; the sweeper leaves such rows alone until the lease passes (see `sender.sweeper`).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from queue import Empty, SimpleQueue
from typing import Any, cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from sqlalchemy import Table, and_, bindparam, case, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session

from app import runtime as runtime_mod
from app.clock import utcnow
from app.ids import new_id
from app.models import (
    DEAD,
    DELIVERING,
    PENDING,
    RETRYING,
    SUCCEEDED,
    Attempt,
    Delivery,
    Endpoint,
    EndpointSecret,
    Event,
    EventVersion,
)
from app.runtime import Runtime
from dlq.park import park
from sender import guard, health
from sender.deliver import AttemptResult, Target, attempt
from sender.http import ERROR_CONNECTION, ERROR_TIMEOUT, Transport
from sender.policy import RetryPolicy, decide, parse_retry_after
from sender.ratelimit import RateLimiter

log = logging.getLogger(__name__)


def _table(model: Any) -> Table:
    """A model's Table, typed as one (the ORM types `__table__` as a FromClause)."""
    return cast(Table, model.__table__)

# A job may carry deliveries due this soon; they wait on a local timer instead of a new job.
LOOKAHEAD_S = 5.0
# A claimed delivery waits at most this long in a local queue before it is handed back.
MAX_LOCAL_WAIT_S = 3.0
# Retries due within this many seconds wait on the worker's own timer (precise to ~50 ms);
# later ones are left to the sweeper, which enqueues them shortly before they are due.
LOCAL_TIMER_MAX_S = 600.0
# A held delivery's lease outlives its local timer by this much; then the sweeper takes over.
HOLD_GRACE_S = 15.0
# An endpoint that timed out, refused a connection or answers this slowly on average is "slow"
# for SLOW_WINDOW_S, or until it answers fast again.
SLOW_WINDOW_S = 30.0
SLOW_DURATION_MS = 2000
FAST_ANSWER_MS = 500
SLOW_ERRORS = frozenset({ERROR_TIMEOUT, ERROR_CONNECTION})
SLOW_KEY_PREFIX = "kurir:slow:"
# Writer batching: at most this many records per transaction, gathered for at most this long.
FLUSH_MAX_ITEMS = 500
FLUSH_MAX_DELAY_S = 0.01
# Backpressure: a job waits while this many admitted deliveries are waiting for a thread.
HIGH_WATER_PER_THREAD = 16
TICK_S = 0.05
# An endpoint that only succeeds has its "last success" written at most this often.
SUCCESS_WRITE_S = 1.0
QUERY_CHUNK = 500

REASON_RETRIES_EXHAUSTED = "retries_exhausted"
REASON_ENDPOINT_DISABLED = health.REASON_ENDPOINT_DISABLED
ERROR_WORKER_LOST = "worker_lost"
ERROR_INTERNAL = "internal_error"
ERROR_NO_SECRET = "no_signing_secret"  # noqa: S105 - an error class


# ----------------------------------------------------------------------------- data


@dataclass
class Work:
    """One claimed delivery on its way to a lane thread."""

    delivery_id: str
    event_id: str
    target: Target
    body: bytes
    n: int
    run_n: int
    lease: datetime
    queued_at: float = 0.0


@dataclass
class Outcome:
    work: Work
    result: AttemptResult
    finished_at: datetime


@dataclass
class Release:
    """A claimed delivery handed back unsent; `hold_until` None clears the lease."""

    work: Work
    hold_until: datetime | None


@dataclass
class _Endpoint:
    queue: deque[Work] = field(default_factory=deque)
    inflight: int = 0
    slow_until: float = 0.0
    ewma_ms: float = 0.0


# ----------------------------------------------------------------------------- helpers


def _chunks(items: Sequence[str], size: int = QUERY_CHUNK) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _transient(exc: BaseException) -> bool:
    """Deadlocks, lost connections, a locked SQLite: worth retrying as they are."""
    return isinstance(exc, OperationalError) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated)


def _insert_for(session: Session) -> Any:
    name = session.get_bind().dialect.name
    return postgresql.insert if name == "postgresql" else sqlite.insert


def record_attempts(session: Session, rows: list[dict[str, Any]], *,
                    overwrite: bool = True) -> None:
    """Insert attempt rows in one statement; an existing (delivery, n) is replaced or kept.

    Replacing matters when a worker that lost its lease reports the attempt the sweeper had
    recorded as `worker_lost`: the real outcome wins.
    """
    if not rows:
        return
    stmt = _insert_for(session)(_table(Attempt))
    if overwrite:
        excluded = stmt.excluded
        stmt = stmt.on_conflict_do_update(
            index_elements=["delivery_id", "n"],
            set_={c: excluded[c] for c in ("started_at", "duration_ms", "url", "request_headers",
                                           "response_status", "response_body", "error")})
    else:
        stmt = stmt.on_conflict_do_nothing(index_elements=["delivery_id", "n"])
    session.execute(stmt, rows)


def _failing_reason(h: health.Health) -> str:
    return (f"failing: {h.consecutive_failures} consecutive failed attempts, no success "
            f"since {(h.last_success_at or h.first_failure_at)}")


# ----------------------------------------------------------------------------- engine


class Engine:
    """Per-process delivery machinery: admission, lanes, timers and the batched writer."""

    def __init__(self, runtime: Runtime, *, transport: Transport | None = None,
                 clock: Callable[[], datetime] = utcnow, rng: random.Random | None = None,
                 fast_threads: int | None = None, slow_threads: int | None = None) -> None:
        settings = runtime.settings
        self.runtime = runtime
        self.settings = settings
        self.clock = clock
        self.rng = rng or random.Random()  # noqa: S311 - jitter, not security
        self.retry_policy = RetryPolicy(schedule=tuple(settings.retry_schedule),
                                        jitter=settings.retry_jitter)
        self.guard_policy = guard.policy_from(settings)
        self.thresholds = health.Thresholds(settings.disable_after_failures,
                                            settings.disable_after_seconds)
        self.fast_cap = settings.endpoint_concurrency
        self.slow_cap = max(1, settings.endpoint_concurrency // 2)
        self.fast_threads = fast_threads or settings.worker_threads
        self.slow_threads = slow_threads or max(2, settings.worker_threads // 4)
        self.transport = transport or Transport(
            pool_maxsize=self.fast_threads + self.slow_threads)
        # Side channels (slow flags, rate-limit slots) fail fast: a Redis outage must not add
        # redis-py's retry backoff to every claim.
        self.redis = redis.Redis.from_url(settings.resolved_redis_url, socket_timeout=2.0,
                                          socket_connect_timeout=2.0,
                                          retry=Retry(NoBackoff(), 0))
        self.limiter = RateLimiter(self.redis)
        self.high_water = max(200, HIGH_WATER_PER_THREAD * self.fast_threads)

        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._process_lock = threading.Lock()
        self._endpoints: dict[str, _Endpoint] = {}
        self._local: set[str] = set()
        self._timed: dict[str, float] = {}
        self._timers: list[tuple[float, int, str, Any]] = []
        self._seq = itertools.count()
        self._waiting = 0
        self._inflight = 0
        self._fast: SimpleQueue[Work | None] = SimpleQueue()
        self._slow: SimpleQueue[Work | None] = SimpleQueue()
        self._writes: SimpleQueue[Outcome | Release | None] = SimpleQueue()
        self._unflushed = 0
        self._secret_cache: dict[str, str] = {}
        # The last target seen per endpoint: its timeout sizes the next claim's lease.
        self._known_targets: dict[str, Target] = {}
        self._flags_checked_at = 0.0
        self._success_written: dict[str, float] = {}
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self.counters: dict[str, int] = dict.fromkeys(
            ("jobs", "claimed", "held", "released", "not_due", "attempts", "flushes"), 0)
        self.started = False
        self.stopped = False

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Engine:
        if self.started:
            return self
        self.started = True
        spawn = [("kurir-writer", self._writer_loop), ("kurir-timers", self._housekeeper_loop)]
        spawn += [(f"kurir-fast-{i}", lambda: self._lane_loop(self._fast))
                  for i in range(self.fast_threads)]
        spawn += [(f"kurir-slow-{i}", lambda: self._lane_loop(self._slow))
                  for i in range(self.slow_threads)]
        for name, target in spawn:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, timeout_s: float = 40.0) -> None:
        """Finish what is being sent, hand back what is not, flush every record."""
        if self.stopped or not self.started:
            self.stopped = True
            return
        self._stopping.set()
        releases: list[Release] = []
        with self._lock:
            for state in self._endpoints.values():
                while state.queue:
                    releases.append(Release(state.queue.popleft(), None))
                    self._waiting -= 1
            for lane in (self._fast, self._slow):
                while True:
                    try:
                        work = lane.get_nowait()
                    except Empty:
                        break
                    if work is not None:
                        releases.append(Release(work, None))
                        self._waiting -= 1
                        self._endpoints[work.target.endpoint_id].inflight -= 1
                        self._inflight -= 1
            for _, _, kind, payload in self._timers:
                if kind == "work":
                    releases.append(Release(payload, None))
                    self._waiting -= 1
            timed = list(self._timed)
            self._timed.clear()
            self._timers.clear()
        for release in releases:
            self._put_write(release)
        for _ in range(self.fast_threads):
            self._fast.put(None)
        for _ in range(self.slow_threads):
            self._slow.put(None)
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            if thread.name.startswith(("kurir-fast", "kurir-slow")):
                thread.join(max(0.1, deadline - time.monotonic()))
        self._writes.put(None)
        for thread in self._threads:
            if thread.name == "kurir-writer":
                thread.join(max(0.1, deadline - time.monotonic()))
        if timed:
            self._forget_holds(timed)
        self.transport.close()
        self.redis.close()
        self.stopped = True
        log.info("delivery engine stopped", extra=dict(self.counters))

    def _forget_holds(self, ids: list[str]) -> None:
        """Locally timed rows go back to the sweeper at once instead of after their hold."""
        try:
            with self.runtime.db.begin() as session:
                for chunk in _chunks(ids):
                    session.execute(
                        update(Delivery)
                        .where(Delivery.id.in_(chunk), Delivery.state.in_((PENDING, RETRYING)))
                        .values(lease_expires_at=None)
                        .execution_options(synchronize_session=False))
        except Exception:
            log.warning("could not hand %d timed deliveries back to the sweeper", len(ids),
                        exc_info=True)

    def idle(self) -> bool:
        """Nothing waiting, in flight or unflushed (timers may still be set)."""
        with self._lock:
            return self._waiting == 0 and self._inflight == 0 and self._unflushed == 0

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not (self._waiting == 0 and self._inflight == 0 and self._unflushed == 0):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(min(remaining, 0.1))
        return True

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"waiting": self._waiting, "inflight": self._inflight,
                    "unflushed": self._unflushed, "timers": len(self._timed)}

    # ------------------------------------------------------------------ the job

    def submit(self, delivery_ids: Sequence[str]) -> int:
        """Guard, admit and claim; returns how many deliveries were taken to send."""
        if self._stopping.is_set():
            return 0
        with self._changed:
            deadline = time.monotonic() + 30.0
            while self._waiting >= self.high_water and time.monotonic() < deadline:
                self._changed.wait(0.05)
        return self._process(list(delivery_ids))

    def _process(self, ids: list[str]) -> int:
        with self._process_lock:
            for attempt_no in range(3):
                try:
                    return self._process_once(ids)
                except Exception as exc:
                    if not _transient(exc) or attempt_no == 2:
                        raise
                    log.warning("claim failed, retrying: %s", exc)
                    time.sleep(0.05 * (attempt_no + 1))
        return 0

    def _process_once(self, ids: list[str]) -> int:
        """Claim first (one UPDATE), then look closer only at what was not claimed."""
        with self._lock:
            self.counters["jobs"] += 1
            ids = [i for i in dict.fromkeys(ids) if i not in self._local]
        if not ids:
            return 0
        now = self.clock()
        later: list[tuple[str, datetime]] = []
        held: list[tuple[str, datetime]] = []
        claimed: list[tuple[Work, float]] = []
        not_due = 0
        with self.runtime.db.begin() as session:
            rows, bodies, lease = self._claim_rows(session, ids, now)
            if len(rows) < len(ids):
                later, not_due = self._look_at_unclaimed(
                    session, [i for i in ids if i not in {r.id for r in rows}], now)
            if rows:
                with self._lock:
                    # Due now (a manual retry, say): a local timer for it is not needed.
                    for row in rows:
                        self._timed.pop(row.id, None)
                targets = self._targets(session, {r.endpoint_id for r in rows}, now)
                admitted, held = self._admit(rows, targets, now)
                lease = self._extend_lease(session, rows, targets, lease, now)
                if held:
                    self._unclaim(session, [i for i, _ in held], lease,
                                  max(u for _, u in held) + timedelta(seconds=HOLD_GRACE_S))
                if bodies is None:
                    bodies = self._bodies(session, {(r.event_id, r.version)
                                                    for r, _ in admitted})
                claimed = [(Work(delivery_id=r.id, event_id=r.event_id,
                                 target=targets[r.endpoint_id],
                                 body=bodies[(r.event_id, r.version)],
                                 n=r.attempt_count + 1, run_n=r.run_attempts + 1,
                                 lease=lease), offset)
                           for r, offset in admitted]
        self._set_timers(later + held, now)
        self._start(claimed)
        with self._lock:
            self.counters["claimed"] += len(claimed)
            self.counters["held"] += len(held)
            self.counters["not_due"] += not_due
        return len(claimed)

    # ------------------------------------------------------------------ claiming

    def _lease_seconds(self, timeout_s: float) -> float:
        """Long enough to wait for a thread, wait locally and send, twice over the timeout."""
        return max(float(self.settings.delivery_lease_seconds),
                   2 * timeout_s + MAX_LOCAL_WAIT_S + self.limiter.horizon_s + 5)

    def _claim_rows(self, session: Session, ids: list[str], now: datetime,
                    ) -> tuple[list[Any], dict[str, bytes] | None, datetime]:
        """Claim every due delivery among `ids` whose endpoint is enabled (or that an operator
        forced to a disabled one).

        The lease assumes the longest timeout this process knows of; `_extend_lease`
        lengthens it when a newly seen endpoint needs more. On PostgreSQL the payloads come
        back with the claim (UPDATE ... FROM events RETURNING), sparing a query.
        """
        with self._lock:
            known = [t.timeout_s for t in self._known_targets.values()]
        lease = now + timedelta(seconds=self._lease_seconds(
            max([float(self.settings.default_timeout_s), *known])))
        table = _table(Delivery)
        enabled = select(Endpoint.id).where(Endpoint.state == health.ENABLED,
                                            Endpoint.deleted_at.is_(None))
        live = select(Endpoint.id).where(Endpoint.deleted_at.is_(None))
        postgres = session.get_bind().dialect.name == "postgresql"
        columns = [table.c.id, table.c.event_id, table.c.endpoint_id, table.c.attempt_count,
                   table.c.run_attempts, table.c.version]
        rows: list[Any] = []
        for chunk in _chunks(ids):
            stmt = (update(table)
                    .where(table.c.id.in_(chunk), table.c.state.in_((PENDING, RETRYING)),
                           or_(table.c.next_attempt_at.is_(None),
                               table.c.next_attempt_at <= now),
                           or_(table.c.endpoint_id.in_(enabled),
                               and_(table.c.forced.is_(True), table.c.endpoint_id.in_(live))))
                    .values(state=DELIVERING, lease_expires_at=lease, updated_at=now))
            if postgres:
                events = _table(Event)
                # A delivery pinned to another version carries that version's body; the
                # others (nearly all) never look at event_versions.
                versioned = (select(_table(EventVersion).c.payload)
                             .where(_table(EventVersion).c.event_id == table.c.event_id,
                                    _table(EventVersion).c.version == table.c.version)
                             .scalar_subquery())
                payload = case((table.c.version.is_(None), events.c.payload),
                               else_=versioned).label("payload")
                stmt = stmt.where(events.c.id == table.c.event_id).returning(
                    *columns, payload)
            else:
                stmt = stmt.returning(*columns)
            rows += session.execute(stmt).all()
        if not postgres:
            return rows, None, lease
        bodies = {(r.event_id, r.version): r.payload.encode("utf-8") for r in rows}
        return rows, bodies, lease

    def _extend_lease(self, session: Session, rows: list[Any], targets: dict[str, Target],
                      lease: datetime, now: datetime) -> datetime:
        needed = now + timedelta(seconds=self._lease_seconds(
            max(t.timeout_s for t in targets.values())))
        if needed <= lease:
            return lease
        for chunk in _chunks(sorted(r.id for r in rows)):
            session.execute(update(Delivery).where(
                Delivery.id.in_(chunk), Delivery.state == DELIVERING,
                Delivery.lease_expires_at == lease,
            ).values(lease_expires_at=needed).execution_options(synchronize_session=False))
        return needed

    def _look_at_unclaimed(self, session: Session, ids: list[str],
                           now: datetime) -> tuple[list[tuple[str, datetime]], int]:
        """The guard for what the claim skipped: final, in flight, not yet due, or parked."""
        horizon = now + timedelta(seconds=LOOKAHEAD_S)
        later: list[tuple[str, datetime]] = []
        due: list[str] = []
        for chunk in _chunks(ids):
            for row in session.execute(
                    select(Delivery.id, Delivery.state, Delivery.next_attempt_at)
                    .where(Delivery.id.in_(chunk))):
                if row.state not in (PENDING, RETRYING):
                    continue
                if row.next_attempt_at is not None and row.next_attempt_at > now:
                    if row.next_attempt_at <= horizon:
                        later.append((row.id, row.next_attempt_at))
                    continue
                due.append(row.id)
        if due:
            # Due yet not claimed: its endpoint is disabled or deleted.
            self._park_disabled(session, due)
        return later, len(ids) - len(due)

    def _bodies(self, session: Session,
                keys: set[tuple[str, int | None]]) -> dict[tuple[str, int | None], bytes]:
        """Bodies by (event, version): the published payload, or a pinned version's."""
        bodies: dict[tuple[str, int | None], bytes] = {}
        published = sorted({event_id for event_id, version in keys if version is None})
        for chunk in _chunks(published):
            for event_id, payload in session.execute(
                    select(Event.id, Event.payload).where(Event.id.in_(chunk))):
                bodies[(event_id, None)] = payload.encode("utf-8")
        pinned = sorted({event_id for event_id, version in keys if version is not None})
        for chunk in _chunks(pinned):
            for event_id, version, payload in session.execute(
                    select(EventVersion.event_id, EventVersion.version, EventVersion.payload)
                    .where(EventVersion.event_id.in_(chunk))):
                bodies[(event_id, version)] = payload.encode("utf-8")
        return bodies

    def _unclaim(self, session: Session, ids: list[str], lease: datetime,
                 hold_until: datetime) -> None:
        """Give back claimed deliveries this process will not send now; it keeps a timer."""
        table = _table(Delivery)
        for chunk in _chunks(sorted(ids)):
            session.execute(update(table).where(
                table.c.id.in_(chunk), table.c.state == DELIVERING,
                table.c.lease_expires_at == lease,
            ).values(state=case((table.c.run_attempts > 0, RETRYING), else_=PENDING),
                     lease_expires_at=hold_until))

    def _park_disabled(self, session: Session, ids: list[str]) -> None:
        """A due delivery whose endpoint is disabled or deleted becomes a dead letter."""
        for delivery in session.scalars(
                select(Delivery).join(Endpoint, Endpoint.id == Delivery.endpoint_id)
                .where(Delivery.id.in_(ids), Delivery.state.in_((PENDING, RETRYING)),
                       or_(Endpoint.state != health.ENABLED, Endpoint.deleted_at.is_not(None)))):
            park(session, delivery, delivery.event, delivery.endpoint, REASON_ENDPOINT_DISABLED)

    # ------------------------------------------------------------------ reading

    def _decrypt(self, token: str) -> str:
        secret = self._secret_cache.get(token)
        if secret is None:
            secret = self.runtime.secret_box.decrypt(token)
            if len(self._secret_cache) > 10_000:
                self._secret_cache.clear()
            self._secret_cache[token] = secret
        return secret

    def _targets(self, session: Session, endpoint_ids: set[str],
                 now: datetime) -> dict[str, Target]:
        """Send targets (secrets decrypted), read afresh for every claimed batch.

        One query per batch, not per delivery: a rotated secret, a new URL or new headers
        apply to the very next claim (a partner switching to the new secret at once must
        not see deliveries signed only with the old one). Decrypted secrets are cached by
        their ciphertext; whether an endpoint is enabled is the claim's business.
        """
        secrets: dict[str, list[tuple[datetime, str, str]]] = {}
        rows: dict[str, Any] = {}
        for chunk in _chunks(sorted(endpoint_ids)):
            for row in session.execute(
                    select(Endpoint.id, Endpoint.url, Endpoint.headers, Endpoint.public_headers,
                           Endpoint.timeout_s, Endpoint.rate_limit_per_s,
                           EndpointSecret.id.label("secret_id"),
                           EndpointSecret.created_at, EndpointSecret.expires_at,
                           EndpointSecret.secret_encrypted)
                    .outerjoin(EndpointSecret, EndpointSecret.endpoint_id == Endpoint.id)
                    .where(Endpoint.id.in_(chunk))):
                rows[row.id] = row
                if row.secret_id is not None and (row.expires_at is None
                                                  or row.expires_at > now):
                    secrets.setdefault(row.id, []).append(
                        (row.created_at, row.secret_id, row.secret_encrypted))
        found: dict[str, Target] = {}
        for endpoint_id, row in rows.items():
            live = sorted(secrets.get(endpoint_id, []), reverse=True)  # newest signs first
            timeout = row.timeout_s or self.settings.default_timeout_s
            found[endpoint_id] = Target(
                endpoint_id=endpoint_id, url=row.url,
                secrets=tuple(self._decrypt(token) for _, _, token in live),
                headers=dict(row.headers or {}),
                public_headers=frozenset(n.lower() for n in row.public_headers or ()),
                timeout_s=float(min(max(timeout, 1), 30)),
                rate_limit_per_s=row.rate_limit_per_s)
        with self._lock:
            if len(self._known_targets) > 50_000:
                self._known_targets.clear()
            self._known_targets.update(found)
        return found

    def _slow_flags(self, endpoint_ids: list[str]) -> set[str]:
        """Endpoints another worker found slow recently (one MGET, at most once a second)."""
        mono = time.monotonic()
        with self._lock:
            if mono - self._flags_checked_at < 1.0:
                return set()
            self._flags_checked_at = mono
        if not endpoint_ids:
            return set()
        try:
            values = self.redis.mget([SLOW_KEY_PREFIX + e for e in endpoint_ids])
        except (redis.RedisError, OSError):
            return set()
        return {e for e, v in zip(endpoint_ids, values, strict=True) if v is not None}

    # ------------------------------------------------------------------ admission

    def _admit(self, rows: list[Any], targets: dict[str, Target],
               now: datetime) -> tuple[list[tuple[Any, float]], list[tuple[str, datetime]]]:
        """Split claimed rows into (row, start offset) to send and (id, until) to give back."""
        by_endpoint: dict[str, list[Any]] = {}
        for row in rows:
            by_endpoint.setdefault(row.endpoint_id, []).append(row)
        flagged = self._slow_flags(sorted(by_endpoint))
        mono = time.monotonic()
        admitted: list[tuple[Any, float]] = []
        held: list[tuple[str, datetime]] = []
        for endpoint_id, items in by_endpoint.items():
            target = targets[endpoint_id]
            with self._lock:
                state = self._endpoints.setdefault(endpoint_id, _Endpoint())
                if endpoint_id in flagged and state.slow_until < mono:
                    state.slow_until = mono + SLOW_WINDOW_S / 2
                room = self._room(state, target, mono)
                wait_s = self._estimated_wait(state, target, mono)
            take = items[:max(room, 0)]
            rest = items[max(room, 0):]
            offsets = [0.0] * len(take)
            if target.rate_limit_per_s and take:
                try:
                    grant = self.limiter.reserve(endpoint_id, float(target.rate_limit_per_s),
                                                 len(take))
                except (redis.RedisError, OSError):
                    log.warning("rate limiter unavailable; holding deliveries",
                                extra={"endpoint_id": endpoint_id})
                    grant = None
                if grant is None:
                    rest = take + rest
                    take, offsets = [], []
                    wait_s = max(wait_s, 1.0)
                else:
                    rest = take[grant.granted:] + rest
                    take = take[:grant.granted]
                    offsets = list(grant.offsets_s)
                    wait_s = max(wait_s, grant.next_free_s)
            admitted.extend(zip(take, offsets, strict=True))
            if rest:
                until = now + timedelta(
                    seconds=max(wait_s, 0.2) * (0.9 + 0.2 * self.rng.random()))
                held.extend((item.id, until) for item in rest)
        return admitted, held

    def _is_slow(self, state: _Endpoint, mono: float) -> bool:
        return state.slow_until > mono

    def _room(self, state: _Endpoint, target: Target, mono: float) -> int:
        """How many more deliveries this endpoint may take into the process now."""
        busy = state.inflight + len(state.queue)
        if self._is_slow(state, mono):
            return max(0, self.slow_cap - busy)
        if state.ewma_ms <= 0:
            return 10_000
        # Enough to keep its threads busy for MAX_LOCAL_WAIT_S at its recent speed.
        per_s = self.fast_cap * 1000.0 / max(state.ewma_ms, 1.0)
        return max(self.fast_cap, int(per_s * MAX_LOCAL_WAIT_S)) - busy

    def _estimated_wait(self, state: _Endpoint, target: Target, mono: float) -> float:
        """Seconds until this endpoint could take one more delivery, roughly."""
        slow = self._is_slow(state, mono)
        cap = self.slow_cap if slow else self.fast_cap
        per_send = max(state.ewma_ms / 1000.0, target.timeout_s if slow else 0.05)
        rounds = math.ceil((state.inflight + len(state.queue) + 1) / cap)
        return min(max(per_send * rounds, 0.5), 30.0)

    # ------------------------------------------------------------------ local queues

    def _set_timers(self, items: Iterable[tuple[str, datetime]], now: datetime) -> None:
        mono = time.monotonic()
        with self._lock:
            for delivery_id, at in items:
                if delivery_id in self._timed:
                    continue
                fire = mono + max(0.0, (at - now).total_seconds())
                self._timed[delivery_id] = fire
                heapq.heappush(self._timers, (fire, next(self._seq), "ids", delivery_id))

    def _start(self, claimed: list[tuple[Work, float]]) -> None:
        mono = time.monotonic()
        with self._lock:
            for work, offset in claimed:
                self._local.add(work.delivery_id)
                self._waiting += 1
                if offset > 0.001:
                    heapq.heappush(self._timers, (mono + offset, next(self._seq), "work", work))
                else:
                    self._enqueue(work, mono)

    def _enqueue(self, work: Work, mono: float) -> None:
        """Put claimed work in its endpoint's queue (lock held) and start what fits."""
        work.queued_at = mono
        state = self._endpoints.setdefault(work.target.endpoint_id, _Endpoint())
        state.queue.append(work)
        self._pump(state, mono)

    def _pump(self, state: _Endpoint, mono: float) -> None:
        slow = self._is_slow(state, mono)
        cap = self.slow_cap if slow else self.fast_cap
        lane = self._slow if slow else self._fast
        while state.queue and state.inflight < cap:
            work = state.queue.popleft()
            state.inflight += 1
            self._inflight += 1
            lane.put(work)

    # ------------------------------------------------------------------ lanes

    def _lane_loop(self, lane: SimpleQueue[Work | None]) -> None:
        while True:
            work = lane.get()
            if work is None:
                return
            with self._lock:
                self._waiting -= 1
                self._changed.notify_all()
            try:
                if not work.target.secrets:
                    result = AttemptResult(self.clock(), 0, None, b"", ERROR_NO_SECRET,
                                           "endpoint has no active signing secret", {}, None)
                else:
                    result = attempt(self.transport, work.target, work.event_id, work.body,
                                     self.guard_policy,
                                     connect_timeout_s=self.settings.connect_timeout_s,
                                     clock=self.clock)
            except Exception as exc:  # a bug must not kill the lane or lose the delivery
                log.exception("attempt crashed", extra={"delivery_id": work.delivery_id})
                result = AttemptResult(self.clock(), 0, None, b"", ERROR_INTERNAL,
                                       type(exc).__name__, {}, None)
            self._finished(work, result)

    def _finished(self, work: Work, result: AttemptResult) -> None:
        mono = time.monotonic()
        became_slow = False
        releases: list[Release] = []
        endpoint_id = work.target.endpoint_id
        with self._lock:
            state = self._endpoints[endpoint_id]
            state.inflight -= 1
            self._inflight -= 1
            state.ewma_ms = (result.duration_ms if state.ewma_ms <= 0
                             else 0.8 * state.ewma_ms + 0.2 * result.duration_ms)
            if result.error in SLOW_ERRORS or state.ewma_ms >= SLOW_DURATION_MS:
                became_slow = not self._is_slow(state, mono)
                state.slow_until = mono + SLOW_WINDOW_S
                # What waits beyond the slow cap goes back now rather than after the wait.
                while len(state.queue) > self.slow_cap:
                    releases.append(self._release_locked(state, state.queue.pop(), mono))
            elif result.error is None and result.duration_ms < FAST_ANSWER_MS:
                # Answering quickly again: back to the fast lane without waiting out the window.
                state.slow_until = 0.0
            self._local.discard(work.delivery_id)
            self._unflushed += 1
            self._pump(state, mono)
        self._writes.put(Outcome(work, result, self.clock()))
        for release in releases:
            self._put_write(release)
        if became_slow:
            with contextlib.suppress(redis.RedisError, OSError):
                self.redis.set(SLOW_KEY_PREFIX + endpoint_id, b"1",
                                       ex=int(SLOW_WINDOW_S))

    def _release_locked(self, state: _Endpoint, work: Work, mono: float) -> Release:
        self._waiting -= 1
        self.counters["released"] += 1
        self._local.discard(work.delivery_id)
        wait_s = self._estimated_wait(state, work.target, mono)
        return Release(work, self.clock() + timedelta(seconds=wait_s))

    def _put_write(self, item: Outcome | Release) -> None:
        with self._lock:
            self._unflushed += 1
        self._writes.put(item)

    # ------------------------------------------------------------------ timers

    def _housekeeper_loop(self) -> None:
        while not self._stopping.wait(TICK_S):
            try:
                self._tick()
            except Exception:
                log.exception("delivery housekeeping failed")

    def _tick(self) -> None:
        mono = time.monotonic()
        ids: list[str] = []
        releases: list[Release] = []
        with self._lock:
            while self._timers and self._timers[0][0] <= mono:
                _, _, kind, payload = heapq.heappop(self._timers)
                if kind == "work":
                    self._enqueue(payload, mono)
                elif self._timed.pop(payload, None) is not None:
                    ids.append(payload)
            for state in self._endpoints.values():
                while state.queue and state.queue[0].queued_at < mono - MAX_LOCAL_WAIT_S:
                    releases.append(self._release_locked(state, state.queue.popleft(), mono))
        for release in releases:
            self._put_write(release)
        if ids:
            try:
                self._process(ids)
            except Exception:
                log.warning("timed deliveries could not be processed; the sweeper will",
                            exc_info=True)

    # ------------------------------------------------------------------ writer

    def _writer_loop(self) -> None:
        closing = False
        while not closing:
            first = self._writes.get()
            if first is None:
                break
            batch: list[Outcome | Release] = [first]
            deadline = time.monotonic() + FLUSH_MAX_DELAY_S
            while len(batch) < FLUSH_MAX_ITEMS:
                try:
                    item = self._writes.get(timeout=max(0.0, deadline - time.monotonic()))
                except Empty:
                    break
                if item is None:
                    closing = True
                    break
                batch.append(item)
            self._flush_with_retry(batch)

    def _flush_with_retry(self, batch: list[Outcome | Release]) -> None:
        delay = 0.05
        failures = 0
        while True:
            try:
                timers = self.flush(batch)
                break
            except Exception as exc:
                failures += 1
                if _transient(exc) and not self._stopping.is_set() or failures < 3:
                    log.warning("could not record %d delivery results, retrying: %s",
                                len(batch), exc)
                    time.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                if len(batch) > 1:
                    # A bad record must not keep the others from being written.
                    for item in batch:
                        self._flush_with_retry([item])
                    return
                log.error("delivery result dropped; its lease will expire and the sweeper "
                          "will retry it", exc_info=True,
                          extra={"delivery_id": batch[0].work.delivery_id})
                timers = []
                break
        self._set_timers(timers, self.clock())
        with self._changed:
            self._unflushed -= len(batch)
            self.counters["flushes"] += 1
            self.counters["attempts"] += sum(isinstance(b, Outcome) for b in batch)
            self._changed.notify_all()

    def flush(self, batch: list[Outcome | Release]) -> list[tuple[str, datetime]]:
        """Record a batch of outcomes and releases in one transaction; returns local timers."""
        outcomes = [b for b in batch if isinstance(b, Outcome)]
        releases = [b for b in batch if isinstance(b, Release)]
        now = self.clock()
        timers: list[tuple[str, datetime]] = []
        with self.runtime.db.begin() as session:
            if outcomes:
                timers += self._record_outcomes(session, outcomes, now)
            if releases:
                timers += self._record_releases(session, releases)
        return timers

    def _record_outcomes(self, session: Session, outcomes: list[Outcome],
                         now: datetime) -> list[tuple[str, datetime]]:
        record_attempts(session, [{
            "id": new_id("att"), "delivery_id": o.work.delivery_id, "n": o.work.n,
            "started_at": o.result.started_at, "duration_ms": o.result.duration_ms,
            "url": o.work.target.url, "request_headers": o.result.request_headers,
            "response_status": o.result.status, "response_body": o.result.body or None,
            "error": o.result.error, "created_at": now,
        } for o in outcomes])

        by_endpoint: dict[str, list[Outcome]] = {}
        for o in outcomes:
            by_endpoint.setdefault(o.work.target.endpoint_id, []).append(o)
        states: dict[str, str] = {}
        successes: list[tuple[str, datetime]] = []
        mono = time.monotonic()
        # 410 Gone disables at once; then the counters, which may disable too. Sorted, so
        # concurrent writers lock endpoint rows in the same order.
        for endpoint_id in sorted(by_endpoint):
            items = by_endpoint[endpoint_id]
            tally = health.tally((o.finished_at, o.result.ok) for o in items)
            if tally.failures == 0 and tally.last_success_at is not None:
                # Nothing to judge, only "last success" to move, and at most once a second.
                states[endpoint_id] = health.ENABLED
                if mono - self._success_written.get(endpoint_id, -1e9) >= SUCCESS_WRITE_S:
                    successes.append((endpoint_id, tally.last_success_at))
                    self._success_written[endpoint_id] = mono
                continue
            self._success_written.pop(endpoint_id, None)
            gone = next((o for o in items if o.result.status == 410), None)
            if gone is not None:
                health.disable(session, endpoint_id, "gone: the endpoint answered 410", now,
                               {"last_status_code": 410, "delivery_id": gone.work.delivery_id})
            h = health.record(session, endpoint_id, tally)
            states[endpoint_id] = h.state if h is not None else health.DISABLED
            if h is not None and health.should_disable(h, self.thresholds, now):
                last = items[-1].result
                if health.disable(session, endpoint_id, _failing_reason(h), now, {
                        "consecutive_failures": h.consecutive_failures,
                        "last_status_code": last.status, "last_error": last.error}):
                    states[endpoint_id] = health.DISABLED

        health.record_successes(session, successes)
        succeeded: list[dict[str, Any]] = []
        retrying: list[dict[str, Any]] = []
        to_park: list[tuple[Outcome, str]] = []
        timers: list[tuple[str, datetime]] = []
        for o in outcomes:
            w, r = o.work, o.result
            if r.ok:
                succeeded.append({"b_id": w.delivery_id, "b_lease": w.lease, "b_n": w.n,
                                  "b_run_n": w.run_n, "b_status": r.status,
                                  "b_at": o.finished_at})
                continue
            if states[w.target.endpoint_id] != health.ENABLED:
                to_park.append((o, REASON_ENDPOINT_DISABLED))
                continue
            decision = decide(r.status, r.error, w.run_n, parse_retry_after(r.retry_after, now),
                              self.retry_policy, self.rng, now)
            if decision.kind == "dead" or decision.next_attempt_at is None:
                to_park.append((o, REASON_RETRIES_EXHAUSTED))
                continue
            due = decision.next_attempt_at
            local = (due - now).total_seconds() <= LOCAL_TIMER_MAX_S
            retrying.append({"b_id": w.delivery_id, "b_lease": w.lease, "b_n": w.n,
                             "b_run_n": w.run_n, "b_status": r.status, "b_error": r.error,
                             "b_next": due,
                             "b_hold": due + timedelta(seconds=HOLD_GRACE_S) if local else None})
            if local:
                timers.append((w.delivery_id, due))

        table = _table(Delivery)
        fence = (table.c.id == bindparam("b_id"), table.c.state == DELIVERING,
                 table.c.lease_expires_at == bindparam("b_lease"))
        if succeeded:
            session.execute(update(table).where(*fence).values(
                state=SUCCEEDED, attempt_count=bindparam("b_n"), run_attempts=bindparam("b_run_n"),
                last_status_code=bindparam("b_status"), last_error=None,
                succeeded_at=bindparam("b_at"), next_attempt_at=None, lease_expires_at=None,
                updated_at=now), succeeded)
        if retrying:
            session.execute(update(table).where(*fence).values(
                state=RETRYING, attempt_count=bindparam("b_n"), run_attempts=bindparam("b_run_n"),
                last_status_code=bindparam("b_status"), last_error=bindparam("b_error"),
                next_attempt_at=bindparam("b_next"), lease_expires_at=bindparam("b_hold"),
                updated_at=now), retrying)
        for o, reason in to_park:
            self._park_outcome(session, o, reason)
        return timers

    def _park_outcome(self, session: Session, o: Outcome, reason: str) -> None:
        delivery = session.get(Delivery, o.work.delivery_id, with_for_update=True)
        if (delivery is None or delivery.state != DELIVERING
                or delivery.lease_expires_at != o.work.lease):
            return
        delivery.attempt_count = o.work.n
        delivery.run_attempts = o.work.run_n
        # The letter shows the last attempt as it was, even when it got no HTTP status.
        delivery.last_status_code = o.result.status
        delivery.last_error = o.result.error
        park(session, delivery, delivery.event, delivery.endpoint, reason)

    def _record_releases(self, session: Session,
                         releases: list[Release]) -> list[tuple[str, datetime]]:
        table = _table(Delivery)
        rows = [{"b_id": r.work.delivery_id, "b_lease": r.work.lease,
                 "b_hold": (r.hold_until + timedelta(seconds=HOLD_GRACE_S)
                            if r.hold_until is not None else None)}
                for r in releases]
        session.execute(update(table).where(
            table.c.id == bindparam("b_id"), table.c.state == DELIVERING,
            table.c.lease_expires_at == bindparam("b_lease"),
        ).values(state=case((table.c.run_attempts > 0, RETRYING), else_=PENDING),
                 lease_expires_at=bindparam("b_hold")), rows)
        return [(r.work.delivery_id, r.hold_until) for r in releases
                if r.hold_until is not None and not self._stopping.is_set()]


# ----------------------------------------------------------------------------- process glue

_engine: Engine | None = None
_engine_lock = threading.Lock()


def engine_for(runtime: Runtime) -> Engine:
    """The process's engine for `runtime`, started on first use."""
    global _engine
    with _engine_lock:
        if _engine is None or _engine.runtime is not runtime or _engine.stopped:
            old = _engine
            _engine = Engine(runtime).start()
            if old is not None and not old.stopped:
                old.stop()
        return _engine


def current_engine() -> Engine | None:
    return _engine


def shutdown_engine(timeout_s: float = 40.0) -> None:
    """Stop the process's engine (worker shutdown, end of a test)."""
    global _engine
    with _engine_lock:
        engine, _engine = _engine, None
    if engine is not None:
        engine.stop(timeout_s)


def deliver_batch(delivery_ids: list[str]) -> int:
    """RQ job: hand a batch of delivery ids to this process's engine; safe to run twice."""
    return engine_for(runtime_mod.current()).submit(delivery_ids)


__all__ = ["DEAD", "Engine", "deliver_batch", "engine_for", "record_attempts",
           "shutdown_engine"]
