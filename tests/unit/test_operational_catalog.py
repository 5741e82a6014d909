"""The catalog of operational event types: the six names, valid schemas whose examples they
accept, and the same contracts migration 0016 registers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from app import event_types
from app.operational import CATALOG, NAMES
from app.vocabulary import OperationalEventType

ROOT = Path(__file__).resolve().parents[2]


def test_exactly_the_six_operational_types() -> None:
    assert {
        "endpoint.disabled",
        "endpoint.recovered",
        "endpoint.verification_failed",
        "delivery.exhausted",
        "ordering.key_blocked",
        "event_type.sunset_passed",
    } == NAMES
    assert {t.value for t in OperationalEventType} == NAMES


def test_each_schema_is_valid_names_partner_and_endpoint_and_accepts_its_example() -> None:
    for spec in CATALOG.values():
        event_types.check_schema(spec.schema)
        assert {"partner", "endpoint"} <= set(spec.schema["required"])
        validator = event_types.compile_schema(spec.schema)
        for example in spec.examples:
            assert event_types.data_errors(validator, example) == [], spec.name
        assert event_types.data_errors(validator, {**spec.examples[0], "surprise": 1})


def test_the_migration_registers_the_catalog_as_it_is() -> None:
    """A registered contract never changes: the catalog's version 1 must stay what 0014
    wrote (a new shape is a new version)."""
    path = ROOT / "migrations/versions/0016_opevents.py"
    spec = importlib.util.spec_from_file_location("migration_0014", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert {t["name"]: (t["schema"], t["description"]) for t in module.TYPES} == {
        name: (t.schema, t.description) for name, t in CATALOG.items()
    }


def test_publishers_cannot_own_operational_names() -> None:
    assert event_types.is_operational("endpoint.disabled")
    assert event_types.is_operational("Delivery.Exhausted")
    assert not event_types.is_operational("payment.succeeded")
