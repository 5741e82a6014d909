"""Retention: closed dead letters (resent or discarded) are forgotten after the retention period.

Open letters are never purged — they are work an operator still has to do.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app.clock import utcnow
from app.models import DL_DISCARDED, DL_RESENT, DeadLetter, DeadLetterAudit, ResendJob
from app.runtime import Runtime
from app.vocabulary import ResendJobState

log = logging.getLogger(__name__)

PAGE_SIZE = 1000


def purge_page(session: Session, cutoff: datetime, *, limit: int = PAGE_SIZE) -> int:
    """Delete up to `limit` letters closed before `cutoff`, with their audit trail."""
    ids = list(
        session.scalars(
            select(DeadLetter.id)
            .where(DeadLetter.state.in_((DL_RESENT, DL_DISCARDED)), DeadLetter.resolved_at < cutoff)
            .limit(limit)
        )
    )
    if not ids:
        return 0
    session.execute(delete(DeadLetterAudit).where(DeadLetterAudit.dead_letter_id.in_(ids)))
    session.execute(delete(DeadLetter).where(DeadLetter.id.in_(ids)))
    return len(ids)


def purge(runtime: Runtime, *, now: datetime | None = None) -> int:
    """Periodic job: purge in short transactions so the API and workers are never blocked."""
    cutoff = (now or utcnow()) - timedelta(days=runtime.settings.retention_days)
    total = 0
    while True:
        with runtime.db.begin() as session:
            purged = purge_page(session, cutoff)
        total += purged
        if purged < PAGE_SIZE:
            break
    with runtime.db.begin() as session:
        session.execute(
            delete(ResendJob).where(
                ResendJob.state.in_((ResendJobState.SUCCEEDED, ResendJobState.FAILED)),
                ResendJob.finished_at < cutoff,
            )
        )
    if total:
        log.info("purged closed dead letters", extra={"count": total})
    return total
