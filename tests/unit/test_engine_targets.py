"""The targets a claim's rows build are reused while nothing they are built from changes, and
the longest timeout (which sizes every lease) follows the endpoints' timeouts both ways."""

from __future__ import annotations

from collections import namedtuple
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography.fernet import Fernet

from app.crypto import SecretBox
from sender.engine.targets import TargetReader

Row = namedtuple(
    "Row",
    "endpoint_id url headers public_headers timeout_s rate_limit_per_s send_traceparent "
    "secret_id created_at expires_at secret_encrypted",
)
NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
BOX = SecretBox([Fernet.generate_key().decode()])


def _row(endpoint_id: str = "ep_1", plain: str = "whsec_one", **changed: Any) -> Row:
    values: dict[str, Any] = {
        "endpoint_id": endpoint_id,
        "url": "https://example.com/hook",
        "headers": '{"x-team": "a"}',
        "public_headers": "[]",
        "timeout_s": 10,
        "rate_limit_per_s": None,
        "send_traceparent": False,
        "secret_id": f"sec_{plain}",
        "created_at": NOW - timedelta(days=1),
        "expires_at": None,
        "secret_encrypted": BOX.encrypt(plain),
    }
    values.update(changed)
    return Row(**values)


def test_a_target_is_built_once_while_its_rows_are_the_same():
    reader = TargetReader(lambda: BOX, 15)
    row = _row()
    first, _ = reader.build([row], NOW)
    again, _ = reader.build([row, row], NOW)  # the claim repeats rows per delivery
    assert again["ep_1"] is first["ep_1"]
    assert first["ep_1"].headers == {"x-team": "a"}


def test_a_changed_column_or_secret_builds_a_new_target():
    reader = TargetReader(lambda: BOX, 15)
    row = _row()
    first, _ = reader.build([row], NOW)
    moved, _ = reader.build([row._replace(url="https://example.com/v2")], NOW)
    assert moved["ep_1"].url == "https://example.com/v2"
    newer = _row(plain="whsec_two", created_at=NOW)
    rotated, _ = reader.build([row, newer], NOW)
    assert rotated["ep_1"].secrets == ("whsec_two", "whsec_one")  # newest signs first
    expired, _ = reader.build([row, newer._replace(expires_at=NOW - timedelta(seconds=1))], NOW)
    assert expired["ep_1"].secrets == ("whsec_one",)
    headers, _ = reader.build([row._replace(headers='{"x-team": "b"}')], NOW)
    assert headers["ep_1"].headers == {"x-team": "b"}
    assert reader.build([row], NOW)[0]["ep_1"] is first["ep_1"]


def test_unreadable_headers_are_never_kept_as_a_target():
    reader = TargetReader(lambda: BOX, 15)
    bad = _row(headers="not json")
    for _ in range(2):
        found, broken = reader.build([bad], NOW)
        assert "ep_1" in broken and found["ep_1"].secrets == ()


def test_the_longest_timeout_follows_the_endpoints_both_ways():
    reader = TargetReader(lambda: BOX, 15)
    assert reader.longest_timeout() == 15
    reader.build([_row("ep_1", timeout_s=30), _row("ep_2", timeout_s=20)], NOW)
    assert reader.longest_timeout() == 30
    reader.build([_row("ep_1", timeout_s=5)], NOW)  # the longest one shortened
    assert reader.longest_timeout() == 20
    reader.build([_row("ep_2", timeout_s=1)], NOW)
    assert reader.longest_timeout() == 15  # never below the default
