"""Ids sort by creation, which cursor pagination relies on."""

from __future__ import annotations

from app.ids import new_id


def test_ids_are_prefixed_unique_and_sortable() -> None:
    ids = [new_id("evt") for _ in range(5000)]
    assert all(i.startswith("evt_") and len(i) == 30 for i in ids)
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
