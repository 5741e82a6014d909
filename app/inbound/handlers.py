"""Event handlers: the application's own code, run inside the transaction that applies an event.

A handler is a function ``handler(ctx: HandlerContext) -> None``. Handlers are code, so only
the operator names code to run, in one of three ways:

- in the configuration: ``KURIR_INBOUND_HANDLERS="on_paid=billing.hooks:on_paid,..."``
  registers handlers *by name*; a source selects them by name, ``{"event_type": "payment.*",
  "handler": "on_paid"}`` (a bare string ``"on_paid"`` matches every event type). This is all
  the HTTP API may do: a name that is not registered is refused and nothing is imported;
- on the command line: ``kurir sources create --handler billing.hooks:on_paid`` may also give a
  dotted path (``{"path": ...}`` in the source), checked by importing it there and then;
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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from importlib.metadata import entry_points
from typing import Any, Protocol

from sqlalchemy.orm import Session

from app.config import HANDLER_PATH
from app.errors import ValidationFailed
from app.models import InboundEvent, InboundSource, ResourceState

ENTRY_POINT_GROUP = "kurir.inbound_handlers"
SIDE_EFFECT_ATTR = "kurir_side_effect_only"
_DOTTED = HANDLER_PATH
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
    return target


def validate_specs(
    specs: Iterable[Any], registry: Mapping[str, str], *, allow_paths: bool = False
) -> list[dict[str, Any]]:
    """Normalise a source's handler list: registered names, or (``allow_paths``, the operator
    on the command line) dotted paths, which are imported here to be sure they resolve.

    Raises:
        ValidationFailed: a spec is malformed, names no registered handler, or (paths) cannot
            be imported. A name that is not registered is never imported.
    """
    if specs is None:
        return []
    if isinstance(specs, str | bytes | dict) or not isinstance(specs, Iterable):
        raise ValidationFailed("handlers must be a list", code="invalid_handler")
    known = ", ".join(sorted(registry)) or "none (set KURIR_INBOUND_HANDLERS)"
    result: list[dict[str, Any]] = []
    for spec in specs:
        if isinstance(spec, str):
            spec = {
                "event_type": "*",
                "path" if allow_paths and spec not in registry else "handler": spec,
            }
        if not isinstance(spec, dict) or (
            not isinstance(spec.get("handler"), str) and not isinstance(spec.get("path"), str)
        ):
            raise ValidationFailed(
                'a handler is a registered name or {"event_type", "handler", "side_effect_only"}',
                code="invalid_handler",
            )
        unknown = set(spec) - {"event_type", "handler", "path", "side_effect_only"}
        if unknown or ("handler" in spec and "path" in spec):
            raise ValidationFailed(
                f"unknown handler field(s): {', '.join(sorted(unknown or {'path'}))}",
                code="invalid_handler",
            )
        pattern = spec.get("event_type", "*")
        if not isinstance(pattern, str) or not pattern or len(pattern) > 200:
            raise ValidationFailed(
                "handler event_type must be a non-empty pattern", code="invalid_handler"
            )
        flag = spec.get("side_effect_only", False)
        if not isinstance(flag, bool):
            raise ValidationFailed("side_effect_only must be a boolean", code="invalid_handler")
        if "handler" in spec:
            name = spec["handler"]
            if name not in registry:
                raise ValidationFailed(
                    f"no handler is registered as {name!r}; registered: {known}",
                    code="unknown_handler",
                    details={"handler": name},
                )
            result.append({"event_type": pattern, "handler": name, "side_effect_only": flag})
            continue
        if not allow_paths:
            raise ValidationFailed(
                "handlers are code: select one registered by name (KURIR_INBOUND_HANDLERS); "
                "only the operator's command line names a module path",
                code="unknown_handler",
                details={"handler": spec["path"]},
            )
        try:
            resolve(spec["path"])
        except ValueError as exc:
            raise ValidationFailed(
                f"handler {spec['path']!r}: {exc}", code="invalid_handler"
            ) from None
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
        found.append(
            BoundHandler(ep.name, ep.value, func, bool(getattr(func, SIDE_EFFECT_ATTR, False)))
        )
    return tuple(found)


def reload_entry_points() -> None:
    """Forget the cached entry points (after installing a plugin in a running process)."""
    _entry_point_handlers.cache_clear()


def _registry() -> Mapping[str, str]:
    """The operator's named handlers, from the process's settings."""
    from app import runtime as runtime_mod

    return runtime_mod.current().settings.handler_registry


def handlers_for(
    source: HasHandlers, event_type: str | None, registry: Mapping[str, str] | None = None
) -> list[BoundHandler]:
    """Entry-point handlers first, then the source's own, in their configured order.

    Raises:
        ValueError: the source selects a name that is no longer registered (the event fails
            with this message rather than running something else).
    """
    bound = [h for h in _entry_point_handlers() if fnmatchcase(event_type or "", h.pattern)]
    for spec in source.handlers or []:
        if isinstance(spec, str):
            spec = {"event_type": "*", "path": spec}
        if not fnmatchcase(event_type or "", spec.get("event_type", "*")):
            continue
        if "handler" in spec:
            names = _registry() if registry is None else registry
            path = names.get(spec["handler"])
            if path is None:
                raise ValueError(
                    f"handler {spec['handler']!r} is not registered (KURIR_INBOUND_HANDLERS)"
                )
        else:
            path = spec["path"]
        func = _resolved(path)
        flag = bool(spec.get("side_effect_only")) or bool(getattr(func, SIDE_EFFECT_ATTR, False))
        bound.append(BoundHandler(spec.get("event_type", "*"), path, func, flag))
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
