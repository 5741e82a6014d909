"""The ordering rule, without a database: what an event does to a resource's state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.inbound.state import (
    ALREADY_APPLIED,
    APPLY,
    CONTRADICTION,
    GAP,
    STALE,
    Ordering,
    decide,
)
from app.models import ResourceState

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def state(
    version: int | None = None,
    at: datetime | None = None,
    status: str | None = None,
    last_event_id: str | None = None,
) -> ResourceState:
    return ResourceState(
        last_version=version,
        last_occurred_at=at,
        status=status,
        last_event_id=last_event_id,
        placeholder=version is None and at is None,
    )


@pytest.mark.parametrize(
    ("event", "current", "allow_gaps", "kind"),
    [
        (Ordering(1, None, "created"), state(), True, APPLY),
        (Ordering(2, None, "paid"), state(1, status="created"), True, APPLY),
        (Ordering(9, None, "paid"), state(1, status="created"), True, APPLY),
        (Ordering(1, None, "created"), state(2, status="paid"), True, STALE),
        (Ordering(2, None, "paid"), state(2, status="paid"), True, STALE),
        (Ordering(2, None, None), state(2, status="paid"), True, STALE),
        (Ordering(2, None, "failed"), state(2, status="paid"), True, CONTRADICTION),
        (Ordering(3, None, "paid"), state(1, status="created"), False, GAP),
        (Ordering(2, None, "paid"), state(1, status="created"), False, APPLY),
        (Ordering(5, None, "paid"), state(), False, GAP),
        (Ordering(1, None, "created"), state(), False, APPLY),
        (Ordering(0, None, "created"), state(), False, APPLY),
        (Ordering(None, T0, "paid"), state(), True, APPLY),
        (Ordering(None, T0 + timedelta(seconds=1), "paid"), state(at=T0, status="x"), True, APPLY),
        (Ordering(None, T0 - timedelta(seconds=1), "old"), state(at=T0, status="x"), True, STALE),
        (Ordering(None, T0, "x"), state(at=T0, status="x"), True, STALE),
        (Ordering(None, T0, "y"), state(at=T0, status="x"), True, CONTRADICTION),
        (Ordering(None, T0, "paid"), state(3, status="paid"), True, CONTRADICTION),
        (Ordering(None, None, "paid"), state(), True, CONTRADICTION),
        # A version outranks a clock: the first versioned event takes over a time-ordered one.
        (Ordering(1, None, "paid"), state(at=T0, status="x"), True, APPLY),
    ],
)
def test_decide(event, current, allow_gaps, kind):
    assert decide(event, current, allow_gaps=allow_gaps).kind == kind


def test_stale_reason_is_stale_event_and_gap_names_the_expected_version():
    assert (
        decide(Ordering(1, None, "a"), state(2, status="b"), allow_gaps=True).reason
        == "stale_event"
    )
    assert (
        decide(Ordering(4, None, "a"), state(2, status="b"), allow_gaps=False).reason
        == "version_gap: expected version 3, got 4"
    )


def test_the_event_that_set_the_state_is_already_applied_not_stale():
    current = state(2, status="paid", last_event_id="ine_1")
    assert (
        decide(Ordering(2, None, "paid"), current, allow_gaps=True, event_id="ine_1").kind
        == ALREADY_APPLIED
    )
    assert (
        decide(Ordering(2, None, "paid"), current, allow_gaps=True, event_id="ine_2").kind == STALE
    )
