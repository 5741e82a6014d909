"""Audit entries of dead letters: who did what, when, and how it turned out."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.ids import new_id


def audit_row(
    letter_id: str,
    actor: str,
    action: str,
    outcome: str,
    now: datetime,
    note: str | None = None,
    operation_id: str | None = None,
    actor_partner_id: str | None = None,
) -> dict[str, Any]:
    """One `dead_letter_audit` row, ready for a bulk INSERT; `operation_id` names the resend
    job it belongs to, `actor_partner_id` the partner a partner-bound actor acted for (what
    a partner reading the row is shown of the actor depends on it)."""
    return {
        "id": new_id("dla"),
        "dead_letter_id": letter_id,
        "actor": actor[:320],
        "actor_partner_id": actor_partner_id,
        "action": action,
        "outcome": outcome[:200],
        "note": note,
        "operation_id": operation_id,
        "created_at": now,
    }
