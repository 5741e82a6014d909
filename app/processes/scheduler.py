"""`kurir scheduler`: the periodic jobs (sweeps, reconciliation, sequencing, purges and
retention), run exactly once.

Run a single scheduler per deployment; the jobs are idempotent, so an accidental second one
costs work, not correctness.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger
from sqlalchemy import delete

from app.clock import utcnow
from app.models import IdempotencyKey
from app.runtime import Runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeriodicJob:
    name: str
    run: Callable[[Runtime], object]
    trigger: IntervalTrigger | CronTrigger


def purge_idempotency_keys(runtime: Runtime) -> int:
    """Forget idempotency keys past their ≥ 24 h lifetime."""
    with runtime.db.begin() as session:
        result = session.execute(delete(IdempotencyKey).where(IdempotencyKey.expires_at < utcnow()))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def report_sunsets(runtime: Runtime) -> int:
    """Endpoints still pinned to a contract version whose sunset passed, recorded once."""
    from app.services import event_types

    with runtime.db.begin() as session:
        return event_types.report_sunsets(session)


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


def periodic_jobs(runtime: Runtime) -> list[PeriodicJob]:
    """Every job the scheduler runs; each later subsystem adds its own here."""
    from app.inbound import process as inbound_process
    from app.inbound import reconcile as inbound_reconcile
    from dlq import resend as dlq_resend
    from dlq import retention as dlq_retention
    from sender import sweeper as delivery_sweeper

    return [
        PeriodicJob(
            "sweep-deliveries",
            delivery_sweeper.sweep,
            IntervalTrigger(seconds=runtime.settings.sweep_interval_seconds),
        ),
        PeriodicJob("sequence-feed", sequence_feed, IntervalTrigger(seconds=2)),
        PeriodicJob("purge-idempotency-keys", purge_idempotency_keys, IntervalTrigger(hours=1)),
        PeriodicJob("purge-dead-letters", dlq_retention.purge, IntervalTrigger(hours=1)),
        PeriodicJob("report-contract-sunsets", report_sunsets, IntervalTrigger(minutes=5)),
        PeriodicJob("purge-portal-links", purge_portal, IntervalTrigger(hours=1)),
        PeriodicJob("purge-operator-sessions", purge_operator_sessions, IntervalTrigger(hours=1)),
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


def _guarded(job: PeriodicJob, runtime: Runtime) -> Callable[[], None]:
    def run() -> None:
        try:
            job.run(runtime)
        except Exception:
            # One failing pass must not stop the scheduler; the next pass tries again.
            log.exception("periodic job failed", extra={"job": job.name})

    return run


def build_scheduler(runtime: Runtime) -> BlockingScheduler:
    scheduler = BlockingScheduler(timezone="UTC")
    for job in periodic_jobs(runtime):
        scheduler.add_job(
            _guarded(job, runtime),
            job.trigger,
            id=job.name,
            name=job.name,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=30,
        )
    return scheduler
