"""`kurir scheduler`: the periodic jobs (sweeps, reconciliation, sequencing, purges and
retention), run by one scheduler at a time.

Run one on every node: they share a lease in the database (`lease`, `leadership`), the holder
runs the jobs and the others stand by, ready to take over when its lease runs out. Every job
run is fenced by the lease: it starts only while this process holds it.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import FrameType

from apscheduler.events import EVENT_SCHEDULER_START
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from app import runtime as runtime_mod
from app.clock import utcnow
from app.processes.leadership import Leadership
from app.runtime import Runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeriodicJob:
    name: str
    run: Callable[[Runtime], object]
    trigger: IntervalTrigger | CronTrigger


def report_sunsets(runtime: Runtime) -> int:
    """Endpoints still pinned to a contract version whose sunset passed, recorded once."""
    from app.services import event_types

    with runtime.db.begin() as session:
        return event_types.report_sunsets(session)


def sync_operator_endpoints(runtime: Runtime) -> int:
    """Kurir's operational event types registered, and the operator endpoints in step with
    KURIR_OPERATOR_WEBHOOK_URL; how many endpoints were made or removed."""
    from app import operational

    with runtime.db.begin() as session:
        operational.ensure_registered(session)
        synced = operational.sync_operator_endpoints(session, runtime.settings, runtime.secret_box)
    return synced.created + synced.removed


def publish_operational_events(runtime: Runtime) -> int:
    """Operational events recorded but not yet published (their job was lost)."""
    from app.intake import operational

    return operational.publish_all(runtime)


def purge_portal(runtime: Runtime) -> int:
    """Portal links and sessions that ended more than a day ago."""
    from app.services import portal

    with runtime.db.begin() as session:
        return portal.purge(session)


def purge_operator_sessions(runtime: Runtime) -> int:
    """Operator UI sessions that ended or expired more than a day ago."""
    from app.services import operators

    with runtime.db.begin() as session:
        return operators.purge(session)


def sequence_feed(runtime: Runtime) -> int:
    """Feed positions for the events committed since the last pass, so pull endpoints' lag
    and a reader's first page need not wait for a backlog."""
    from app.services import feed

    return feed.sequence_now(runtime)


def verify_endpoints(runtime: Runtime) -> dict[str, int]:
    """Endpoints waiting for verification: their challenges due (retries, sends Redis lost),
    and disabling those unverified past their window."""
    from app.services import verification

    return verification.tick(runtime)


def run_retention(runtime: Runtime) -> int:
    """Finished history past each kind's retention period, purged in short batches with
    pauses between them, so publishing and delivering go on meanwhile."""
    from app.lifecycle import purge

    return purge.run(runtime).total


def make_partitions(runtime: Runtime) -> int:
    """PostgreSQL: the history tables' partitions for today and the week ahead, so a write
    never waits for one (and never lands in the default partition)."""
    from app.lifecycle import partitions

    with runtime.db.engine.begin() as connection:
        return len(partitions.create_ahead(connection, utcnow()))


def fold_attempt_totals(runtime: Runtime) -> int:
    """The attempts made since the last pass (less the last minutes) added to the totals
    `/metrics` shows, so a scrape counts only the newest."""
    from app.services import attempt_totals

    return attempt_totals.fold(runtime)


def periodic_jobs(runtime: Runtime) -> list[PeriodicJob]:
    """Every job the scheduler runs; each later subsystem adds its own here."""
    from app.inbound import process as inbound_process
    from app.inbound import reconcile as inbound_reconcile
    from app.intake import idempotency
    from app.recovery import jobs as recovery_jobs
    from dlq import resend as dlq_resend
    from sender import sweeper as delivery_sweeper

    return [
        PeriodicJob(
            "sweep-deliveries",
            delivery_sweeper.sweep,
            IntervalTrigger(seconds=runtime.settings.sweep_interval_seconds),
        ),
        PeriodicJob("sequence-feed", sequence_feed, IntervalTrigger(seconds=2)),
        PeriodicJob("verify-endpoints", verify_endpoints, IntervalTrigger(seconds=10)),
        PeriodicJob("purge-idempotency-keys", idempotency.purge_expired, IntervalTrigger(hours=1)),
        PeriodicJob("retention", run_retention, IntervalTrigger(hours=1)),
        PeriodicJob("make-partitions", make_partitions, IntervalTrigger(hours=1)),
        PeriodicJob("fold-attempt-totals", fold_attempt_totals, IntervalTrigger(minutes=1)),
        PeriodicJob("report-contract-sunsets", report_sunsets, IntervalTrigger(minutes=5)),
        PeriodicJob("sync-operator-endpoints", sync_operator_endpoints, IntervalTrigger(minutes=1)),
        PeriodicJob(
            "publish-operational-events", publish_operational_events, IntervalTrigger(seconds=30)
        ),
        PeriodicJob("purge-portal-links", purge_portal, IntervalTrigger(hours=1)),
        PeriodicJob("purge-operator-sessions", purge_operator_sessions, IntervalTrigger(hours=1)),
        PeriodicJob("probe-endpoints", recovery_jobs.probe_due, IntervalTrigger(seconds=30)),
        PeriodicJob("resume-bulk-resends", dlq_resend.resume_stalled, IntervalTrigger(minutes=1)),
        PeriodicJob("sweep-inbound-events", inbound_process.sweep, IntervalTrigger(seconds=15)),
        PeriodicJob(
            "run-due-reconcile-requests", inbound_reconcile.process_due, IntervalTrigger(seconds=15)
        ),
        PeriodicJob(
            "scheduled-reconcile",
            inbound_reconcile.scheduled_reconcile,
            CronTrigger.from_crontab(runtime.settings.reconcile_cron, timezone="UTC"),
        ),
    ]


def _guarded(job: PeriodicJob, runtime: Runtime, leadership: Leadership) -> Callable[[], None]:
    def run() -> None:
        with leadership.job() as epoch:
            if epoch is None:
                return  # standing by, or the lease about to run out: another scheduler runs it
            started = time.time()
            fields = {"job": job.name, "epoch": epoch, "holder": leadership.holder}
            # Start and end of every run, with wall-clock times: an audit of who ran what when
            # (at debug level: free unless asked for).
            log.debug("periodic job started", extra={**fields, "started": started})
            try:
                job.run(runtime)
            except Exception:
                # One failing pass must not stop the scheduler; the next pass tries again.
                log.exception("periodic job failed", extra={"job": job.name})
            finally:
                log.debug(
                    "periodic job finished",
                    extra={**fields, "started": started, "ended": time.time()},
                )

    return run


def build_scheduler(
    runtime: Runtime,
    leadership: Leadership,
    jobs: list[PeriodicJob] | None = None,
    scheduler: BaseScheduler | None = None,
) -> BaseScheduler:
    """The jobs on their triggers, each run fenced by `leadership`; when this process gains
    the lease, every interval job runs at once (whatever the previous holder last did, the new
    one catches up now, and the sweep starts without waiting a whole interval)."""
    scheduler = scheduler or BlockingScheduler(
        timezone="UTC",
        # The job threads of this process's budget (app/budget.py); the keeper is the last.
        executors={"default": ThreadPoolExecutor(runtime.settings.scheduler_threads)},
    )
    jobs = periodic_jobs(runtime) if jobs is None else jobs
    for job in jobs:
        scheduler.add_job(
            _guarded(job, runtime, leadership),
            job.trigger,
            id=job.name,
            name=job.name,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=30,
        )
    interval_jobs = [job.name for job in jobs if isinstance(job.trigger, IntervalTrigger)]

    def catch_up(_epoch: int) -> None:
        for name in interval_jobs:
            with contextlib.suppress(JobLookupError):  # the scheduler is shutting down
                scheduler.modify_job(name, next_run_time=datetime.now(UTC))

    # The keeper starts once the jobs are in the scheduler's store, so `catch_up` finds them.
    scheduler.add_listener(lambda _event: leadership.start(catch_up), EVENT_SCHEDULER_START)
    return scheduler


def run_scheduler(runtime: Runtime) -> None:
    """`kurir scheduler` until SIGTERM or SIGINT: stand by or run the jobs, and on the way out
    let running jobs finish, then give the lease back."""
    settings = runtime.settings
    # Jobs that record operational events enqueue their publishing through `current()`.
    runtime_mod.install(runtime)
    leadership = Leadership(
        runtime.db,
        ttl_s=settings.resolved_scheduler_lease_seconds,
        renew_s=settings.resolved_scheduler_renew_seconds,
    )
    scheduler = build_scheduler(runtime, leadership)

    def stop(signum: int, _frame: FrameType | None) -> None:
        if scheduler.running:  # a second signal while the running jobs finish: already stopping
            scheduler.shutdown(wait=False)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("scheduler started", extra={"holder": leadership.holder})
    scheduler.start()
    leadership.stop(release=True)
