"""Any number of schedulers, one active: the lease in the database decides which, a standby
takes over when the active one dies, and no periodic job ever runs twice at once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger
from sqlalchemy import select

from app.clock import utcnow
from app.db import Database
from app.models import SchedulerLease
from app.processes import lease
from app.processes.leadership import Leadership
from app.processes.scheduler import PeriodicJob, build_scheduler
from app.runtime import Runtime
from tests.support.factories import wait_for
from tests.support.processes import stop_groups
from tests.support.scheduler_process import SchedulerProcess, kurir_env, overlapping_runs

# Short enough for quick takeovers, long enough that a loaded machine does not stall a renewal
# past the lease.
TTL_S, RENEW_S = 2.4, 0.4


# ------------------------------------------------------------------------------- the row


def test_the_lease_has_one_holder_until_it_runs_out_or_is_given_back(db: Database) -> None:
    assert lease.hold(db, "a", ttl_s=30) == 1  # no row yet: the first caller creates it
    assert lease.hold(db, "b", ttl_s=30) is None  # a's term still runs
    assert lease.hold(db, "a", ttl_s=30) == 1  # a renewal keeps the epoch
    assert lease.release(db, "a")
    assert not lease.release(db, "b")  # b holds nothing to give back
    assert lease.hold(db, "b", ttl_s=0.3) == 2  # a new holder, a new epoch
    assert lease.hold(db, "a", ttl_s=30) is None
    # Unrenewed, b's term runs out by itself and a takes over.
    wait_for(lambda: lease.hold(db, "a", ttl_s=30) == 3, timeout_s=20, message="a takes over")
    row = lease.current(db)
    assert row is not None and row.holder == "a" and row.expires_at > utcnow()


# ------------------------------------------------------------------------------- in one process


class JobLedger:
    """Counts the periodic job runs in progress across schedulers: `most` is the most runs of
    one job ever in progress at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: Counter[str] = Counter()
        self.most = 0
        self.runs: Counter[str] = Counter()  # by scheduler

    def job(self, name: str, scheduler: str) -> PeriodicJob:
        def run(_runtime: Runtime) -> None:
            with self.lock:
                self.running[name] += 1
                self.most = max(self.most, self.running[name])
                self.runs[scheduler] += 1
            time.sleep(0.03)  # long enough for a second run to meet it, were one started
            with self.lock:
                self.running[name] -= 1

        return PeriodicJob(name, run, IntervalTrigger(seconds=0.05))


class InProcessScheduler:
    """A scheduler in a thread of this process, sharing the test's database."""

    def __init__(self, runtime: Runtime, name: str, ledger: JobLedger) -> None:
        # Recorded, never the default fence: that would restart the test run itself.
        self.fences: list[str] = []
        self.leadership = Leadership(
            runtime.db,
            ttl_s=TTL_S,
            renew_s=RENEW_S,
            holder=name,
            on_fence=lambda: self.fences.append(name),
        )
        jobs = [ledger.job("sweep", name), ledger.job("purge", name)]
        self.scheduler = build_scheduler(
            runtime, self.leadership, jobs, BackgroundScheduler(timezone="UTC")
        )

    def start(self) -> None:
        self.scheduler.start()

    def stop(self, *, release: bool = True) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        self.leadership.stop(release=release)


@pytest.fixture
def schedulers(runtime: Runtime) -> Iterator[list[InProcessScheduler]]:
    made: list[InProcessScheduler] = []
    yield made
    for scheduler in made:
        scheduler.stop(release=False)


def test_two_schedulers_run_the_jobs_one_at_a_time(
    runtime: Runtime, schedulers: list[InProcessScheduler]
) -> None:
    ledger = JobLedger()
    a, b = InProcessScheduler(runtime, "a", ledger), InProcessScheduler(runtime, "b", ledger)
    schedulers.extend([a, b])
    a.start()
    wait_for(a.leadership.held, timeout_s=20, message="the first scheduler to take the lease")
    b.start()
    wait_for(lambda: ledger.runs["a"] >= 10, timeout_s=30, message="a to run its jobs")
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # a sample of both views: never both active
        assert not (a.leadership.held() and b.leadership.held())
        time.sleep(0.01)
    assert ledger.runs["b"] == 0

    a.stop()  # graceful: a's running jobs end, then it gives the lease back
    wait_for(b.leadership.held, timeout_s=20, message="b to take over")
    assert b.leadership.epoch == 2
    wait_for(lambda: ledger.runs["b"] >= 10, timeout_s=30, message="b to run the jobs")
    assert ledger.most == 1  # no job ever ran twice at once
    assert a.fences == b.fences == []


def test_a_standby_takes_over_when_the_holder_stops_renewing(
    runtime: Runtime, schedulers: list[InProcessScheduler]
) -> None:
    ledger = JobLedger()
    a, b = InProcessScheduler(runtime, "a", ledger), InProcessScheduler(runtime, "b", ledger)
    schedulers.extend([a, b])
    a.start()
    wait_for(a.leadership.held, timeout_s=20, message="a to take the lease")
    b.start()
    a.stop(release=False)  # as if it crashed: the lease has to run out
    wait_for(b.leadership.held, timeout_s=20, message="b to take over once a's lease ran out")
    wait_for(lambda: ledger.runs["b"] >= 5, timeout_s=30, message="b to run the jobs")
    assert ledger.most == 1
    assert a.fences == b.fences == []


def test_a_job_still_running_when_the_lease_runs_out_is_fenced(
    runtime: Runtime, migrated: Any
) -> None:
    """Renewals stall (here: the lease row locked by another transaction); before the lease
    can run out, no new job starts and the running one is ended by the fence."""
    fenced = threading.Event()
    leadership = Leadership(
        runtime.db, ttl_s=TTL_S, renew_s=RENEW_S, holder="a", on_fence=fenced.set
    )
    leadership.start()
    job_running, job_may_end = threading.Event(), threading.Event()

    def long_job() -> None:
        with leadership.job() as epoch:
            assert epoch == 1
            job_running.set()
            job_may_end.wait(60)

    try:
        wait_for(leadership.held, timeout_s=20, message="the lease")
        worker = threading.Thread(target=long_job)
        worker.start()
        assert job_running.wait(20)
        with migrated.db.engine.connect() as blocker, blocker.begin():
            # FOR UPDATE blocks the renewal on PostgreSQL; on SQLite the open write
            # transaction (BEGIN IMMEDIATE) does.
            blocker.execute(select(SchedulerLease).with_for_update())
            assert fenced.wait(20), "the fence did not fire"
            assert not leadership.held()
            with leadership.job() as epoch:
                assert epoch is None  # no new job starts on a lease about to run out
        job_may_end.set()
        worker.join(20)
    finally:
        job_may_end.set()
        leadership.stop(release=True)


def test_the_fence_restarts_the_process_in_place(tmp_path: Path) -> None:
    """The default fence replaces the process image: same pid and arguments (a supervisor,
    or `kurir up`, sees nothing), and no thread of the old image, a job's included, lives on."""
    script = tmp_path / "fenced.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys, threading
            from pathlib import Path
            from app.processes.leadership import restart_process

            marker = Path(sys.argv[1]) / "restarted"
            if marker.exists():
                threads = len(os.listdir("/proc/self/task"))
                print(f"image 2 pid={os.getpid()} args={sys.argv[1:]} threads={threads}")
                sys.exit(0)
            marker.touch()
            print(f"image 1 pid={os.getpid()}", flush=True)
            threading.Thread(target=threading.Event().wait, daemon=False).start()  # a job
            restart_process()
            """
        )
    )
    root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        text=True,
    )
    output = process.communicate(timeout=60)[0]
    assert process.returncode == 0, output
    assert f"image 1 pid={process.pid}" in output
    assert f"image 2 pid={process.pid} args={[str(tmp_path)]} threads=1" in output


# ------------------------------------------------------------------------------- real processes


@pytest.mark.slow
def test_sigkill_of_the_active_scheduler_hands_over_with_no_job_run_twice(
    migrated: Any, redis_url: str, tmp_path: Path
) -> None:
    """Two `kurir scheduler` processes on the default settings (sweep every 2 s): one runs the
    jobs; SIGKILL it and the other takes over, and no job's runs ever overlap."""
    sweep_s = 2.0
    logs = tmp_path / "logs"
    logs.mkdir()
    started = [
        SchedulerProcess(name, kurir_env(migrated.url, redis_url, tmp_path / name), logs)
        for name in ("one", "two")
    ]
    try:

        def sweeps(process: SchedulerProcess, after: float = 0.0) -> list[Any]:
            return [r for r in process.runs() if r.job == "sweep-deliveries" and r.started > after]

        def up_and_sweeping() -> bool:
            for process in started:
                assert process.alive(), process.log_text()
            return all(p.holder() for p in started) and any(len(sweeps(p)) >= 2 for p in started)

        wait_for(up_and_sweeping, timeout_s=90, interval_s=0.2, message="a scheduler sweeping")
        active = next(p for p in started if sweeps(p))
        standby = next(p for p in started if p is not active)
        assert standby.runs() == []  # one active: the other stood by
        row = lease.current(migrated.db)
        assert row is not None and row.holder == active.holder()

        killed_at = active.kill()
        wait_for(
            lambda: bool(sweeps(standby, after=killed_at)),
            timeout_s=60,
            interval_s=0.05,
            message="the standby to take over and sweep",
        )
        takeover_s = sweeps(standby, after=killed_at)[0].started - killed_at
        print(
            f"\ntakeover after SIGKILL: {takeover_s:.2f} s (two sweep intervals: {2 * sweep_s} s)"
        )
        wait_for(lambda: len(sweeps(standby)) >= 3, timeout_s=30, message="further sweeps")
        row = lease.current(migrated.db)
        assert row is not None and row.holder == standby.holder() and row.epoch == 2

        runs = active.runs() + standby.runs()
        assert {r.epoch for r in active.runs()} == {1}
        assert {r.epoch for r in standby.runs()} == {2}
        overlaps = overlapping_runs(runs)
        print(f"job runs: {len(runs)}, overlapping runs: {len(overlaps)}")
        assert overlaps == []

        stop_groups([standby.process])  # SIGTERM: finish, then give the lease back
        assert standby.process.returncode == 0, standby.log_text()
        assert standby.said("scheduler lease released")
        row = lease.current(migrated.db)
        assert row is not None and row.expires_at <= utcnow()
    finally:
        stop_groups([p.process for p in started])
