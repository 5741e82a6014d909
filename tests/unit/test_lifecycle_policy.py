"""The retention rules that need no database: horizons per kind and batch sizing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.config import Settings
from app.lifecycle import policy
from app.lifecycle.purge import MAX_BATCH, MIN_BATCH, next_size
from app.vocabulary import RetentionKind


def test_each_kind_has_its_own_horizon_with_safe_defaults():
    now = datetime(2026, 12, 5, tzinfo=UTC)
    found = policy.horizons(Settings(), now)
    assert {k: now - found[k] for k in RetentionKind} == {
        RetentionKind.EVENTS: timedelta(days=30),
        RetentionKind.ATTEMPTS: timedelta(days=30),
        RetentionKind.INBOUND: timedelta(days=30),
        RetentionKind.DEAD_LETTERS: timedelta(days=90),
        RetentionKind.AUDIT: timedelta(days=365),
    }
    shorter = policy.horizons(Settings(retain_attempts_days=7), now)
    assert now - shorter[RetentionKind.ATTEMPTS] == timedelta(days=7)


def test_nothing_open_counts_as_finished():
    assert "open" not in policy.CLOSED_LETTER_STATES
    assert set(policy.FINISHED_DELIVERY_STATES) == {"succeeded", "dead"}
    assert not {"quarantined", "failed", "received", "processing"} & set(
        policy.FINISHED_INBOUND_STATUSES
    )


def test_a_batch_is_sized_to_the_budget_and_grows_at_most_twofold():
    assert next_size(100, 100, elapsed_ms=100.0, budget_ms=50.0) == 40  # 80 % of what fits
    assert next_size(100, 100, elapsed_ms=1.0, budget_ms=50.0) == 200  # never more than 2x
    assert next_size(100, 100, elapsed_ms=0.0, budget_ms=50.0) == 200
    assert next_size(100, 100, elapsed_ms=10_000.0, budget_ms=50.0) == MIN_BATCH
    assert next_size(MAX_BATCH, MAX_BATCH, elapsed_ms=1.0, budget_ms=50.0) == MAX_BATCH
