"""The rotating secret ring that endpoint and inbound source secrets share."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from app import secret_ring
from app.models import EndpointSecret, InboundSourceSecret, RotatingSecret

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


@dataclass
class Row:
    id: str
    created_at: datetime
    expires_at: datetime | None = None


def test_a_secret_is_live_until_its_expiry_and_without_one() -> None:
    assert secret_ring.is_live(None, NOW)
    assert secret_ring.is_live(NOW + timedelta(seconds=1), NOW)
    assert not secret_ring.is_live(NOW, NOW)


def test_live_secrets_come_newest_first_ties_broken_by_id() -> None:
    old = Row("a", NOW - timedelta(days=2), expires_at=NOW + timedelta(hours=1))
    gone = Row("b", NOW - timedelta(days=3), expires_at=NOW - timedelta(seconds=1))
    twin_1, twin_2 = Row("c", NOW), Row("d", NOW)
    assert secret_ring.live([old, gone, twin_1, twin_2], NOW) == [twin_2, twin_1, old]


def test_a_rotation_caps_the_others_at_the_overlap_and_keeps_sooner_ends() -> None:
    open_ended = Row("a", NOW - timedelta(days=1))
    later = Row("b", NOW - timedelta(days=1), expires_at=NOW + timedelta(days=9))
    sooner = Row("c", NOW - timedelta(days=1), expires_at=NOW + timedelta(minutes=5))
    expired = Row("d", NOW - timedelta(days=5), expires_at=NOW - timedelta(days=1))
    ends = secret_ring.cap([open_ended, later, sooner, expired], NOW, 3600)
    assert ends == NOW + timedelta(hours=1)
    assert open_ended.expires_at == later.expires_at == ends
    assert sooner.expires_at == NOW + timedelta(minutes=5)
    assert expired.expires_at == NOW - timedelta(days=1)
    assert secret_ring.overlap_ends([open_ended, later, sooner, expired], NOW) == ends
    assert secret_ring.overlap_ends([Row("e", NOW)], NOW) is None


def test_both_secret_tables_are_rings_of_one_shape() -> None:
    for model in (EndpointSecret, InboundSourceSecret):
        assert issubclass(model, RotatingSecret)
        columns = {c.name for c in model.__table__.columns}
        assert {"secret_encrypted", "created_at", "expires_at"} <= columns
    assert EndpointSecret(expires_at=NOW).is_live(NOW - timedelta(seconds=1))
    assert not InboundSourceSecret(expires_at=NOW).is_live(NOW)
