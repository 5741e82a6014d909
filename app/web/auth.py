"""Bearer-key authentication and scope checks for the `/v1` API."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from flask import g, request

from app.accounts import Principal, authenticate, hash_key
from app.errors import Forbidden, Unauthorized
from app.web.context import runtime

F = TypeVar("F", bound=Callable[..., Any])

# A key lookup per request costs a query on the hot publish path; revocation still takes
# effect within this many seconds.
CACHE_TTL_S = 30.0
# Bound of the cache (one entry per key seen): at the bound it is emptied and refilled, which
# costs one query per key; a flood of wrong keys is never cached at all.
CACHE_MAX_KEYS = 10_000
_cache: dict[str, tuple[float, Principal]] = {}
_cache_lock = threading.Lock()


def _principal_for(token: str) -> Principal | None:
    digest = hash_key(token)
    now = time.monotonic()
    with _cache_lock:
        hit = _cache.get(digest)
        if hit and now - hit[0] < CACHE_TTL_S:
            return hit[1]
    with runtime().db.begin() as session:
        principal = authenticate(session, token)
    if principal is not None:
        with _cache_lock:
            if len(_cache) >= CACHE_MAX_KEYS:
                _cache.clear()
            _cache[digest] = (now, principal)
    return principal


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


def current_principal() -> Principal:
    """The authenticated caller; raises 401 when there is none or the key is wrong."""
    cached = g.get("principal")
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise Unauthorized("missing Authorization header (expected: Bearer <api key>)")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Authorization must be: Bearer <api key>")
    principal = _principal_for(token.strip())
    if principal is None:
        raise Unauthorized("invalid or revoked API key")
    g.principal = principal
    return principal


def require_scope(scope: str) -> Callable[[F], F]:
    """Decorate a view: 401 without a valid key, 403 when the key lacks `scope`."""

    def decorator(view: F) -> F:
        @wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            principal = current_principal()
            if not principal.allows(scope):
                raise Forbidden(f"this API key lacks the scope {scope!r}",
                                details={"required_scope": scope,
                                         "granted": sorted(principal.scopes)})
            return view(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorator
