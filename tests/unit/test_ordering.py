"""The pure parts of ordered delivery: the default key and the per-delivery headers."""

from __future__ import annotations

from app.signing import generate_secret
from sender import ordering
from sender.deliver import request_headers


def test_the_default_key_is_the_resource_type_and_id() -> None:
    assert ordering.default_key({"type": "order", "id": "o-1", "version": 3}) == "order:o-1"
    assert ordering.default_key(None) is None


def test_a_default_key_too_long_to_store_is_hashed_the_same_way_every_time() -> None:
    resource = {"type": "t" * 200, "id": "i" * 200}
    key = ordering.default_key(resource)
    assert key is not None and key.startswith("sha256:") and len(key) <= 255
    assert key == ordering.default_key(dict(resource))
    assert key != ordering.default_key({"type": "t" * 200, "id": "j" * 200})


def test_headers_carry_the_sequence_and_name_the_previous_event_after_the_first() -> None:
    assert ordering.headers(None, None) is None
    assert ordering.headers(1, None) == {"webhook-sequence": "1"}
    assert ordering.headers(8, "evt_7") == {"webhook-sequence": "8", "webhook-previous-id": "evt_7"}


def test_ordering_headers_cannot_be_forged_by_custom_headers_and_are_sent() -> None:
    sent = request_headers(
        "evt_1",
        b"{}",
        [generate_secret()],
        {"webhook-sequence": "99", "X-Team": "a"},
        1_700_000_000,
        ordering.headers(3, "evt_0"),
    )
    assert sent["webhook-sequence"] == "3" and sent["webhook-previous-id"] == "evt_0"
    assert sent["X-Team"] == "a"
