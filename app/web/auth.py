"""Bearer-key authentication for the `/v1` API: who is calling, as an Actor.

Authentication is the face's job (a 401 names the header problem); what the actor may do is
decided by the services. `require_scope` remains for routes that call no service.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from flask import g, request

from app.errors import Unauthorized
from app.services import keys
from app.services.actor import Actor
from app.web.context import runtime

F = TypeVar("F", bound=Callable[..., Any])


def clear_cache() -> None:
    """Forget every key this process has seen (tests that make keys behind its back)."""
    keys.forget()


def current_actor() -> Actor:
    """The authenticated caller; raises 401 when there is none or the key is wrong."""
    cached = g.get("actor")
    if cached is not None:
        return cached
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise Unauthorized("missing Authorization header (expected: Bearer <api key>)")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Authorization must be: Bearer <api key>")
    actor = keys.authenticate(runtime(), token.strip())
    if actor is None:
        raise Unauthorized("invalid or revoked API key")
    g.actor = actor
    return actor


def require_scope(scope: str) -> Callable[[F], F]:
    """Decorate a view that calls no service: 401 without a valid key, 403 without `scope`."""

    def decorator(view: F) -> F:
        @wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            current_actor().require(scope)
            return view(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorator
