"""What retention may purge and when: the horizon of each kind, and the finished states.

Pure: no I/O, so the rule reads in one place and is tested without a database.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from app.config import Settings
from app.vocabulary import (
    DeadLetterState,
    DeliveryState,
    InboundStatus,
    ReconcileState,
    ResendJobState,
    RetentionKind,
)

# A delivery in any other state is still being worked on (a held ordered delivery is
# pending); a dead one is finished only once no dead letter of it is kept.
FINISHED_DELIVERY_STATES = (DeliveryState.SUCCEEDED, DeliveryState.DEAD)
CLOSED_LETTER_STATES = (DeadLetterState.RESENT, DeadLetterState.DISCARDED)
FINISHED_RESEND_JOB_STATES = (ResendJobState.SUCCEEDED, ResendJobState.FAILED)
# Quarantined callbacks wait for reconciliation and failed ones for a replay: not finished.
FINISHED_INBOUND_STATUSES = (InboundStatus.APPLIED, InboundStatus.IGNORED)
FINISHED_RECONCILE_STATES = (ReconcileState.DONE, ReconcileState.FAILED)


def retention_days(settings: Settings) -> dict[RetentionKind, int]:
    """Days each kind is kept, from the settings."""
    return {
        RetentionKind.DEAD_LETTERS: settings.retain_dead_letters_days,
        RetentionKind.ATTEMPTS: settings.retain_attempts_days,
        RetentionKind.EVENTS: settings.retain_events_days,
        RetentionKind.INBOUND: settings.retain_inbound_days,
        RetentionKind.AUDIT: settings.retain_audit_days,
    }


@dataclass(frozen=True)
class Horizons:
    """Per kind, the moment before which finished rows are purged."""

    at: dict[RetentionKind, datetime]

    def __getitem__(self, kind: RetentionKind) -> datetime:
        return self.at[kind]


def horizons(settings: Settings, now: datetime) -> Horizons:
    return Horizons({k: now - timedelta(days=d) for k, d in retention_days(settings).items()})
