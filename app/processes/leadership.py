"""Whether this `kurir scheduler` is the active one: the lease kept, job runs fenced.

Every scheduler runs a keeper thread that renews the lease (or, standing by, tries to take
it) every renewal interval, in its own short transaction. A periodic job starts only while the
lease is held with at least one renewal interval to spare; the keeper goes on renewing while
jobs run, so a job may last longer than the lease.

The hazard is a job still running when the lease runs out unrenewed (the database unreachable
or stalled): a standby may then start the same job. A watchdog thread guards that moment: when
the lease has less than one renewal interval left and a job is still running, it ends every
job at once by restarting the process (`os.execv`, same pid, so a supervisor or `kurir up` sees
nothing). The row's expiry is counted from later than the holder's own clock started (see
`lease.hold`), so the old process is gone before any standby can take the lease. What no
process can guard against is being frozen (SIGSTOP, a paused VM) mid-job past the lease; the
jobs are idempotent, so that costs a repeated pass, not a wrong result.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from app.db import Database
from app.processes import lease

log = logging.getLogger(__name__)

Clock = Callable[[], float]


def new_holder_id() -> str:
    """Host, pid and a random part: unique per process image, so a scheduler restarted with
    the same pid (see `restart_process`) starts a new term instead of continuing the old one."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def restart_process() -> None:
    """End every running job at once by replacing this process with a fresh copy of itself."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])  # noqa: S606


class Leadership:
    """The lease as this process sees it: held until a moment on its monotonic clock."""

    def __init__(
        self,
        db: Database,
        *,
        ttl_s: float,
        renew_s: float,
        holder: str | None = None,
        name: str = lease.SCHEDULER,
        on_fence: Callable[[], None] = restart_process,
        clock: Clock = time.monotonic,
    ) -> None:
        self.db = db
        self.ttl_s = ttl_s
        self.renew_s = renew_s
        self.holder = holder or new_holder_id()
        self.name = name
        self._on_fence = on_fence
        self._clock = clock
        self._lock = threading.Condition()
        self._epoch: int | None = None
        self._valid_until = 0.0
        self._running = 0
        self._fenced = False
        self._stop = threading.Event()
        self._on_gained: Callable[[int], None] = lambda epoch: None
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ the term

    @property
    def epoch(self) -> int | None:
        """The current term's fencing token, None when this process does not hold the lease."""
        with self._lock:
            return self._epoch if self._held() else None

    def held(self) -> bool:
        with self._lock:
            return self._held()

    def _held(self) -> bool:
        return self._epoch is not None and self._clock() < self._valid_until - self.renew_s

    @contextmanager
    def job(self) -> Iterator[int | None]:
        """Run a job under the lease: yields the term's epoch, or None when this process must
        not run it (standing by, or the lease about to run out)."""
        with self._lock:
            epoch = self._epoch if self._held() and not self._fenced else None
            if epoch is not None:
                self._running += 1
        try:
            yield epoch
        finally:
            if epoch is not None:
                with self._lock:
                    self._running -= 1
                    self._lock.notify_all()

    def renew(self) -> bool:
        """One try at keeping (or taking) the lease; whether this process holds it now."""
        started = self._clock()
        epoch = lease.hold(self.db, self.holder, self.ttl_s, self.name)
        with self._lock:
            before = self._epoch if self._held() else None
            if epoch is None:
                self._epoch, self._valid_until = None, 0.0
            else:
                self._epoch, self._valid_until = epoch, started + self.ttl_s
            held = self._held()
        if held and before != epoch:
            log.info("scheduler lease gained", extra={"holder": self.holder, "epoch": epoch})
            self._on_gained(epoch)  # type: ignore[arg-type]
        elif before is not None and epoch is None:
            log.warning("scheduler lease lost", extra={"holder": self.holder, "epoch": before})
        return held

    # ------------------------------------------------------------------ threads

    def start(self, on_gained: Callable[[int], None] | None = None) -> None:
        """Start the keeper and the watchdog; `on_gained(epoch)` runs when a term begins."""
        if on_gained is not None:
            self._on_gained = on_gained
        self._threads = [
            threading.Thread(target=self._keep, name="lease-keeper", daemon=True),
            threading.Thread(target=self._watch, name="lease-watchdog", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _keep(self) -> None:
        failing = False
        while True:
            try:
                self.renew()
            except Exception:
                # The database may be back at the next try; until then the term runs out by
                # itself and the watchdog fences any job still running. Said once per outage,
                # not at every try.
                if not failing:
                    log.warning("scheduler lease renewal failed", exc_info=True)
                failing = True
            else:
                if failing:
                    log.info("scheduler lease renewal works again")
                failing = False
            if self._stop.wait(self.renew_s):
                return

    def _watch(self) -> None:
        while not self._stop.wait(min(0.1, self.renew_s / 4)):
            with self._lock:
                lapsed = self._running > 0 and not self._held() and not self._fenced
                if lapsed:
                    self._fenced = True
            if lapsed:
                log.critical(
                    "scheduler lease ran out while a job ran: restarting to end it",
                    extra={"holder": self.holder},
                )
                self._on_fence()

    def stop(self, *, release: bool = True) -> None:
        """Stop keeping the lease. With `release` (a graceful stop: the scheduler already
        starts no new job), first wait for the running jobs, renewing meanwhile, then give the
        lease back so a standby takes over at its next try; the supervisor's kill bounds the
        wait. Without it the lease simply runs out, as after a crash."""
        if release:
            # Stopping: a lease running out under a job now ends the process, not restarts it.
            self._on_fence = _exit_now
            with self._lock:
                self._lock.wait_for(lambda: self._running == 0)
        self._stop.set()
        for thread in self._threads:
            thread.join(max(5.0, self.renew_s * 2))
        if not release:
            return
        with self._lock:
            self._epoch, self._valid_until = None, 0.0
        if lease.release(self.db, self.holder, self.name):
            log.info("scheduler lease released", extra={"holder": self.holder})


def _exit_now() -> None:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(1)
