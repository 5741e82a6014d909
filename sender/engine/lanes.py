"""The lanes: local queues per endpoint and the two thread pools that send from them.

Healthy endpoints send on the fast lane, slow and failing ones on the slow lane, each
endpoint capped in flight (`Admission.cap`), so a hanging or failing endpoint can never
occupy the threads healthy endpoints need (no head-of-line blocking). A claimed delivery
waits in its endpoint's local queue until a thread is free for it, at most
`MAX_LOCAL_WAIT_S`; then it is handed back with a hold rather than left to age in memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime, timedelta

from app import telemetry
from app.net.guard import GuardPolicy
from app.net.http import Transport
from sender import ordering
from sender.deliver import AttemptResult, attempt
from sender.engine.admission import MAX_LOCAL_WAIT_S, Admission
from sender.engine.errors import ERROR_INTERNAL
from sender.engine.ledger import Ledger, Room
from sender.engine.recorder import Recorder
from sender.engine.work import Outcome, Release, Work

log = logging.getLogger(__name__)


class _Idle:
    """A lane thread waiting for work: it blocks on `ready` until an item is handed to it."""

    def __init__(self) -> None:
        self.ready = threading.Lock()
        self.ready.acquire()
        self.item: Work | None = None


class Lane:
    """One pool's work, handed to the thread that went idle last.

    A queue shared by the pool's threads wakes them in turn, each after all the others ran:
    at a trickle every send then starts on a thread whose stack and objects have gone cold.
    Handed to the most recently idle thread instead, consecutive sends run on one thread
    (or a few), and the rest sleep. `None` tells the thread that takes it to end.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._backlog: deque[Work | None] = deque()
        self._idle: list[_Idle] = []

    def put(self, item: Work | None) -> None:
        with self._mutex:
            if self._idle:
                waiter = self._idle.pop()
                waiter.item = item
                waiter.ready.release()
                return
            self._backlog.append(item)

    def get(self, waiter: _Idle) -> Work | None:
        """The next item, waiting (as `waiter`, the calling thread's own) until there is one."""
        with self._mutex:
            if self._backlog:
                return self._backlog.popleft()
            self._idle.append(waiter)
        waiter.ready.acquire()
        return waiter.item

    def take_all(self) -> list[Work | None]:
        """Everything not yet handed to a thread."""
        with self._mutex:
            items = list(self._backlog)
            self._backlog.clear()
        return items


class Lanes:
    """Moves work from local queues into lane threads, and outcomes on to the recorder."""

    def __init__(
        self,
        ledger: Ledger,
        admission: Admission,
        recorder: Recorder,
        transport: Transport,
        guard_policy: GuardPolicy,
        *,
        connect_timeout_s: float,
        clock: Callable[[], datetime],
        fast_threads: int,
        slow_threads: int,
    ) -> None:
        self.ledger = ledger
        self.admission = admission
        self.recorder = recorder
        self.transport = transport
        self.guard_policy = guard_policy
        self.connect_timeout_s = connect_timeout_s
        self.clock = clock
        self.fast_threads = fast_threads
        self.slow_threads = slow_threads
        self.fast = Lane()
        self.slow = Lane()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        spawn = [(f"kurir-fast-{i}", self.fast) for i in range(self.fast_threads)]
        spawn += [(f"kurir-slow-{i}", self.slow) for i in range(self.slow_threads)]
        for name, lane in spawn:
            thread = threading.Thread(target=self._loop, args=(lane,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def enqueue(self, work: Work, mono: float) -> None:
        """Put claimed work in its endpoint's queue (lock held) and start what fits."""
        work.queued_at = mono
        room = self.ledger.room(work.target.endpoint_id)
        room.queue.append(work)
        self.pump(room, mono)

    def pump(self, room: Room, mono: float) -> None:
        """Hand the endpoint's queued work to its lane while it is under its cap (lock held)."""
        lane = self.slow if room.is_slow(mono) or room.failing else self.fast
        cap = self.admission.cap(room, mono)
        while room.queue and room.inflight < cap:
            work = room.queue.popleft()
            room.inflight += 1
            self.ledger.inflight += 1
            lane.put(work)

    def expire_waits(self, mono: float) -> list[Release]:
        """Hand back what waited in a local queue longer than MAX_LOCAL_WAIT_S (lock held)."""
        releases: list[Release] = []
        for room in self.ledger.rooms.values():
            while room.queue and room.queue[0].queued_at < mono - MAX_LOCAL_WAIT_S:
                releases.append(self._release(room, room.queue.popleft(), mono))
        return releases

    def drain(self) -> list[Release]:
        """Stopping: everything queued and not yet started, handed back (lock held)."""
        releases: list[Release] = []
        for room in self.ledger.rooms.values():
            while room.queue:
                releases.append(Release(room.queue.popleft(), None))
                self.ledger.waiting -= 1
        for lane in (self.fast, self.slow):
            for work in lane.take_all():
                if work is not None:
                    releases.append(Release(work, None))
                    self.ledger.waiting -= 1
                    self.ledger.rooms[work.target.endpoint_id].inflight -= 1
                    self.ledger.inflight -= 1
        return releases

    def close(self, deadline: float) -> None:
        """Let every thread finish its send and end, waiting until `deadline` at most."""
        for _ in range(self.fast_threads):
            self.fast.put(None)
        for _ in range(self.slow_threads):
            self.slow.put(None)
        for thread in self._threads:
            thread.join(max(0.1, deadline - time.monotonic()))

    def _loop(self, lane: Lane) -> None:
        waiter = _Idle()
        while True:
            work = lane.get(waiter)
            if work is None:
                return
            with self.ledger.lock:
                self.ledger.taken()
            self._finished(work, self._send(work))

    def _send(self, work: Work) -> AttemptResult:
        if telemetry.enabled():
            return self._send_traced(work)
        return self._attempt(work, ordering.headers(work.sequence, work.previous_event_id))

    def _send_traced(self, work: Work) -> AttemptResult:
        """The attempt as a `kurir.attempt` span in its event's trace; to an endpoint that
        opted in (`send_traceparent`), the span's own context goes out as `traceparent`."""
        target = work.target
        with telemetry.span(
            "kurir.attempt",
            parent=work.trace_context,
            kind=telemetry.CLIENT,
            attributes={
                "kurir.event.id": work.event_id,
                "kurir.delivery.id": work.delivery_id,
                "kurir.endpoint.id": target.endpoint_id,
                "kurir.attempt.number": work.n,
                "http.request.method": "POST",
            },
        ) as span:
            extra = ordering.headers(work.sequence, work.previous_event_id)
            if target.send_traceparent:
                value = telemetry.traceparent()
                if value is not None:
                    extra = {**(extra or {}), telemetry.TRACEPARENT: value}
            result = self._attempt(work, extra)
            span.set_attribute("kurir.attempt.duration_ms", result.duration_ms)
            if result.status is not None:
                span.set_attribute("http.response.status_code", result.status)
            if result.error is not None:
                span.set_attribute("error.type", result.error)
            if not result.ok:
                telemetry.failed(span, result.error or f"HTTP {result.status}")
            return result

    def _attempt(self, work: Work, extra_headers: dict[str, str] | None) -> AttemptResult:
        try:
            return attempt(
                self.transport,
                work.target,
                work.event_id,
                work.body,
                self.guard_policy,
                connect_timeout_s=self.connect_timeout_s,
                clock=self.clock,
                extra_headers=extra_headers,
            )
        except Exception as exc:  # a bug must not kill the lane or lose the delivery
            log.exception("attempt crashed", extra={"delivery_id": work.delivery_id})
            return AttemptResult(
                self.clock(), 0, None, b"", ERROR_INTERNAL, type(exc).__name__, {}, None
            )

    def _finished(self, work: Work, result: AttemptResult) -> None:
        mono = time.monotonic()
        became_slow = False
        releases: list[Release] = []
        endpoint_id = work.target.endpoint_id
        with self.ledger.lock:
            room = self.ledger.rooms[endpoint_id]
            room.inflight -= 1
            self.ledger.inflight -= 1
            was_slow = room.is_slow(mono)
            if self.admission.observe(room, result, mono):
                became_slow = not was_slow
                # What waits beyond the slow cap goes back now rather than after the wait.
                while len(room.queue) > self.admission.slow_cap:
                    releases.append(self._release(room, room.queue.pop(), mono))
            self.ledger.local.discard(work.delivery_id)
            self.ledger.unflushed += 1
            self.pump(room, mono)
        self.recorder.put_counted(Outcome(work, result, self.clock()))
        for release in releases:
            self.recorder.put(release)
        if became_slow:
            self.admission.flag_slow(endpoint_id)

    def _release(self, room: Room, work: Work, mono: float) -> Release:
        """Hand back queued work with a hold until the endpoint could take it (lock held)."""
        self.ledger.waiting -= 1
        self.ledger.counters["released"] += 1
        self.ledger.local.discard(work.delivery_id)
        wait_s = self.admission.estimated_wait(room, work.target, mono)
        return Release(work, self.clock() + timedelta(seconds=wait_s))
