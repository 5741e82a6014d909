"""Event handlers: the application's own code, run inside the transaction that applies an event.

A handler is a function ``handler(ctx: HandlerContext) -> None``. It is found either

- by a dotted path on the source: ``{"event_type": "payment.*", "path": "billing.hooks:on_paid"}``
  (a bare string ``"billing.hooks:on_paid"`` matches every event type), or
- through the Python entry point group ``kurir.inbound_handlers``, whose entry point *name* is
  the event-type pattern (``payment.* = billing.hooks:on_paid``); those run for every source.

Patterns are shell-style (``fnmatch``): ``*``, ``payment.*``, ``orders/paid``.

A handler runs only when its event is applied, and in the same database transaction: if it
raises, nothing of that event is applied and the event ends ``failed``. A handler marked
*side-effect only* (``@side_effect_only`` or ``"side_effect_only": true`` in the spec) also
runs for stale events (``ctx.stale`` is True); it is for audit trails and metrics and must
not change resource state.
"""

from __future__ import annotations

import functools
import importlib
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from importlib.metadata import entry_points
from typing import Any, Protocol

from sqlalchemy.orm import Session

from app.errors import ValidationFailed
from app.models import InboundEvent, InboundSource, ResourceState

ENTRY_POINT_GROUP = "kurir.inbound_handlers"
SIDE_EFFECT_ATTR = "kurir_side_effect_only"
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
                     r"(:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)?$")
MAX_HANDLERS = 50

Handler = Callable[["HandlerContext"], None]


class HasHandlers(Protocol):
    @property
    def handlers(self) -> Any: ...


@dataclass
class HandlerContext:
    """What a handler sees: the open session, the source, the event and the resource state."""

    session: Session
    source: InboundSource
    event: InboundEvent
    state: ResourceState | None
    stale: bool = False
    _payload: Any = field(default=None, repr=False)

    @property
    def payload(self) -> Any:
        """The event body parsed as JSON (it was valid JSON when it was received)."""
        if self._payload is None:
            self._payload = json.loads(self.event.raw_body)
        return self._payload


@dataclass(frozen=True)
class BoundHandler:
    pattern: str
    path: str
    func: Handler
    side_effect_only: bool


def side_effect_only(func: Handler) -> Handler:
    """Mark a handler as audit/metrics only: it also runs for stale events, touching no state."""
    setattr(func, SIDE_EFFECT_ATTR, True)
    return func


def resolve(path: str) -> Handler:
    """Import ``module:attr`` (or ``module.attr``) and return the callable.

    Raises:
        ValueError: the path is malformed, cannot be imported, or is not callable.
    """
    if not isinstance(path, str) or not _DOTTED.fullmatch(path):
        raise ValueError(f"{path!r} is not a dotted path like package.module:function")
    if ":" in path:
        module_name, attr = path.split(":", 1)
    else:
        module_name, _, attr = path.rpartition(".")
        if not module_name:
            raise ValueError(f"{path!r} names no module")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r}: {exc}") from None
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"{module_name!r} has no attribute {attr!r}") from None
    if not callable(target):
        raise ValueError(f"{path!r} is not callable")
    return target  # type: ignore[no-any-return]


def validate_specs(specs: Iterable[Any]) -> list[dict[str, Any]]:
    """Normalise a source's handler list and check every path resolves.

    Raises:
        ValidationFailed: a spec is malformed or its path cannot be imported.
    """
    if specs is None:
        return []
    if isinstance(specs, str | bytes | dict) or not isinstance(specs, Iterable):
        raise ValidationFailed("handlers must be a list", code="invalid_handler")
    result: list[dict[str, Any]] = []
    for spec in specs:
        if isinstance(spec, str):
            spec = {"event_type": "*", "path": spec}
        if not isinstance(spec, dict) or not isinstance(spec.get("path"), str):
            raise ValidationFailed(
                'a handler is "module:function" or {"event_type", "path", "side_effect_only"}',
                code="invalid_handler")
        unknown = set(spec) - {"event_type", "path", "side_effect_only"}
        if unknown:
            raise ValidationFailed(f"unknown handler field(s): {', '.join(sorted(unknown))}",
                                   code="invalid_handler")
        pattern = spec.get("event_type", "*")
        if not isinstance(pattern, str) or not pattern or len(pattern) > 200:
            raise ValidationFailed("handler event_type must be a non-empty pattern",
                                   code="invalid_handler")
        flag = spec.get("side_effect_only", False)
        if not isinstance(flag, bool):
            raise ValidationFailed("side_effect_only must be a boolean", code="invalid_handler")
        try:
            resolve(spec["path"])
        except ValueError as exc:
            raise ValidationFailed(f"handler {spec['path']!r}: {exc}",
                                   code="invalid_handler") from None
        result.append({"event_type": pattern, "path": spec["path"], "side_effect_only": flag})
    if len(result) > MAX_HANDLERS:
        raise ValidationFailed(f"at most {MAX_HANDLERS} handlers", code="invalid_handler")
    return result


# Handlers imported, by dotted path (each source names at most MAX_HANDLERS): the least
# recently used is forgotten at the bound and imported again (from sys.modules) when needed.
RESOLVED_HANDLERS_MAX = 256


@functools.lru_cache(maxsize=RESOLVED_HANDLERS_MAX)
def _resolved(path: str) -> Handler:
    return resolve(path)


@functools.cache
def _entry_point_handlers() -> tuple[BoundHandler, ...]:
    found = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        func = ep.load()
        found.append(BoundHandler(ep.name, ep.value, func,
                                  bool(getattr(func, SIDE_EFFECT_ATTR, False))))
    return tuple(found)


def reload_entry_points() -> None:
    """Forget the cached entry points (after installing a plugin in a running process)."""
    _entry_point_handlers.cache_clear()


def handlers_for(source: HasHandlers, event_type: str | None) -> list[BoundHandler]:
    """Entry-point handlers first, then the source's own, in their configured order."""
    bound = [h for h in _entry_point_handlers() if fnmatchcase(event_type or "", h.pattern)]
    for spec in source.handlers or []:
        if isinstance(spec, str):
            spec = {"event_type": "*", "path": spec}
        if not fnmatchcase(event_type or "", spec.get("event_type", "*")):
            continue
        func = _resolved(spec["path"])
        flag = bool(spec.get("side_effect_only")) or bool(getattr(func, SIDE_EFFECT_ATTR, False))
        bound.append(BoundHandler(spec.get("event_type", "*"), spec["path"], func, flag))
    return bound


def run_handlers(ctx: HandlerContext) -> int:
    """Run the handlers that apply; a stale event runs only side-effect handlers."""
    ran = 0
    for handler in handlers_for(ctx.source, ctx.event.event_type):
        if ctx.stale and not handler.side_effect_only:
            continue
        handler.func(ctx)
        ran += 1
    return ran
