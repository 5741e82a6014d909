"""Versions a publish must produce: from the publisher's renditions first, then down the
downgrade chain, each under the bounds of `downgrades`; and the pins a publish could never
serve."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jmespath.parser import ParsedResult
from jsonschema.protocols import Validator
from sqlalchemy import Connection, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.event_types import downgrades
from app.event_types.registry import MAX_DOWNGRADE_HOPS, apply_downgrade, compile_downgrade
from app.event_types.schema import compile_schema, data_errors, validators
from app.models import EventType

# ---------------------------------------------------------------------------- versions


@dataclass(frozen=True)
class Version:
    """One registered version of a type, ready to validate and to downgrade from."""

    id: str
    version: int
    deprecated: bool
    sunset_at: datetime | None
    validator: Validator
    downgrade: ParsedResult | None


class _DowngradeCache:
    """Compiled downgrade expressions by event-type row id (they are immutable)."""

    def __init__(self, max_size: int = 4096) -> None:
        self._items: dict[str, ParsedResult] = {}
        self._lock = threading.Lock()
        self._max = max_size

    def get(self, key: str, expression: str) -> ParsedResult:
        found = self._items.get(key)
        if found is None:
            found = compile_downgrade(expression)
            with self._lock:
                if len(self._items) >= self._max:
                    self._items.clear()
                self._items[key] = found
        return found


compiled_downgrades = _DowngradeCache()


def versions_of(session: Session | Connection, name: str) -> dict[int, Version]:
    """Every registered version of the type `name`, by number (one query)."""
    rows = session.execute(
        select(
            EventType.id,
            EventType.version,
            EventType.deprecated,
            EventType.sunset_at,
            EventType.downgrade,
        ).where(EventType.name == name)
    ).all()
    found: dict[int, Version] = {}
    for type_id, version, deprecated, sunset_at, downgrade in rows:
        validator = validators.get(type_id)
        if validator is None:
            schema = session.scalar(select(EventType.schema).where(EventType.id == type_id))
            validator = compile_schema(schema or {})
            validators.put(type_id, validator)
        compiled = compiled_downgrades.get(type_id, downgrade) if downgrade else None
        found[version] = Version(type_id, version, bool(deprecated), sunset_at, validator, compiled)
    return found


class VersionUnavailable(Exception):
    """No rendition and no chain of downgrades makes this version from the published one."""

    def __init__(self, version: int) -> None:
        super().__init__(f"version {version} cannot be produced")
        self.version = version


class VersionInvalid(Exception):
    """A produced version breaks its own schema."""

    def __init__(self, version: int, source: str, errors: list[dict[str, str]]) -> None:
        super().__init__(f"version {version} ({source}) does not match its schema")
        self.version = version
        self.source = source
        self.errors = errors


class VersionTooLarge(Exception):
    """Making this version went past a budget (`reason`: `bytes` or `work`)."""

    def __init__(self, version: int, reason: str, limit: int) -> None:
        super().__init__(f"version {version} is too large to produce ({reason} over {limit})")
        self.version = version
        self.reason = reason
        self.limit = limit


def reachable(
    downgradable: dict[int, bool], published: int, renditions: set[int]
) -> dict[int, int]:
    """Version -> downgrades needed to make it, for every version a publish of `published`
    with these renditions can make; `downgradable` says, per registered version, whether it
    declares a downgrade. Structural only: nothing runs.

    A link v+1 -> v needs both registered and v+1's downgrade; transforms never go up; a
    version more than `MAX_DOWNGRADE_HOPS` links below its nearest source is out of reach.
    """
    found: dict[int, int] = {}
    for version in sorted(downgradable, reverse=True):
        if version == published or (version in renditions):
            found[version] = 0
        elif version < published and version + 1 in found and downgradable.get(version + 1):
            hops = found[version + 1] + 1
            if hops <= MAX_DOWNGRADE_HOPS:
                found[version] = hops
    return found


def produce(
    versions: dict[int, Version],
    published: int,
    data: dict[str, Any],
    renditions: dict[int, dict[str, Any]],
    wanted: set[int],
    *,
    max_bytes: int = Settings.max_payload_bytes,
) -> dict[int, tuple[dict[str, Any], str]]:
    """`data` in every wanted version other than the published one, and in every rendition,
    with how it was made.

    A publisher's rendition wins over a transform; otherwise version v comes from v+1 (itself
    a rendition or produced) through v+1's downgrade, at most `MAX_DOWNGRADE_HOPS` links.
    Transforms never go up: a wanted version above the published one exists only as a
    rendition. Every rendition and every version made on the way is validated against its own
    schema; the downgrades made for one event share one work budget, and each version they
    make is at most `max_bytes` of JSON.

    Raises:
        VersionUnavailable: a wanted version cannot be made.
        VersionInvalid: a made version breaks its schema, or its downgrade does not apply.
        VersionTooLarge: making a version went past the size or work budget.
    """
    made: dict[int, tuple[dict[str, Any], str]] = {}
    reach = reachable(
        {v: row.downgrade is not None for v, row in versions.items()},
        published,
        set(renditions) & set(versions),
    )
    meter = downgrades.Meter(max_bytes)

    def make(version: int) -> dict[str, Any]:
        if version in made:
            return made[version][0]
        if version == published:
            return data
        if version not in versions or version not in reach:
            raise VersionUnavailable(version)
        if version in renditions:
            result, source = renditions[version], "rendition"
        else:
            expression = versions[version + 1].downgrade
            if expression is None:  # `reachable` rules this out
                raise VersionUnavailable(version)
            source = "downgrade"
            try:
                result = apply_downgrade(expression, make(version + 1), meter)
            except downgrades.TooLarge as exc:
                raise VersionTooLarge(version, exc.reason, exc.limit) from None
            except downgrades.Failed as exc:
                raise VersionInvalid(
                    version,
                    source,
                    [
                        {
                            "path": "/",
                            "message": f"the downgrade does not apply: {exc}",
                            "keyword": "downgrade",
                        }
                    ],
                ) from None
            if not isinstance(result, dict):
                raise VersionInvalid(
                    version,
                    source,
                    [
                        {
                            "path": "/",
                            "message": "the downgrade did not produce a JSON object",
                            "keyword": "type",
                        }
                    ],
                )
        errors = data_errors(versions[version].validator, result)
        if errors:
            raise VersionInvalid(version, source, errors)
        made[version] = (result, source)
        return result

    for version in sorted(set(wanted) | set(renditions), reverse=True):
        make(version)
    return {v: made[v] for v in set(wanted) | set(renditions) if v != published}


# ---------------------------------------------------------------------------- pins


def unreachable_pins(session: Session, pins: dict[str, int]) -> list[dict[str, Any]]:
    """The pins `{type: version}` that a publish of the type's newest version could not
    serve through downgrades alone: `[{type, version, newest}]`, by type name."""
    if not pins:
        return []
    downgradable: dict[str, dict[int, bool]] = {}
    for name, version, has_downgrade in session.execute(
        select(EventType.name, EventType.version, EventType.downgrade.is_not(None)).where(
            EventType.name.in_(list(pins))
        )
    ):
        downgradable.setdefault(name, {})[int(version)] = bool(has_downgrade)
    problems = []
    for name, version in sorted(pins.items()):
        family = downgradable.get(name, {})
        if not family:
            continue  # an unknown type is another refusal
        newest = max(family)
        if version not in reachable(family, newest, set()):
            problems.append({"type": name, "version": version, "newest": newest})
    return problems
