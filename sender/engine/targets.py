"""Where and how to send: each claimed endpoint's URL, headers, timeout and live secrets.

Read afresh for every claimed batch, one query per batch, not per delivery: a rotated secret,
a new URL or new headers apply to the very next claim (a partner switching to the new secret
at once must not see deliveries signed only with the old one). Decrypted secrets are cached
by their ciphertext; whether an endpoint is enabled is the claim's business.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.crypto import SecretBox
from app.models import Endpoint, EndpointSecret
from sender.deliver import Target
from sender.engine.sql import chunks

# An endpoint's timeout is clamped to this range, whatever its row says.
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 1, 30
SECRET_CACHE_MAX = 10_000
KNOWN_TARGETS_MAX = 50_000


class TargetReader:
    """Reads send targets; remembers the last one per endpoint to size the next lease."""

    def __init__(self, secret_box: Callable[[], SecretBox], default_timeout_s: float) -> None:
        # A callable: the box (and a development key file) is loaded on first use.
        self.secret_box = secret_box
        self.default_timeout_s = default_timeout_s
        self._secret_cache: dict[str, str] = {}
        self._lock = threading.Lock()
        self._known: dict[str, Target] = {}

    def longest_timeout(self) -> float:
        """The longest timeout among the endpoints seen so far (at least the default)."""
        with self._lock:
            known = [t.timeout_s for t in self._known.values()]
        return max([float(self.default_timeout_s), *known])

    def read(self, session: Session, endpoint_ids: set[str], now: datetime) -> dict[str, Target]:
        """Send targets (secrets decrypted, newest first) for `endpoint_ids`."""
        secrets: dict[str, list[tuple[datetime, str, str]]] = {}
        rows: dict[str, Any] = {}
        for chunk in chunks(sorted(endpoint_ids)):
            for row in session.execute(
                    select(Endpoint.id, Endpoint.url, Endpoint.headers, Endpoint.timeout_s,
                           Endpoint.rate_limit_per_s, EndpointSecret.id.label("secret_id"),
                           EndpointSecret.created_at, EndpointSecret.expires_at,
                           EndpointSecret.secret_encrypted)
                    .outerjoin(EndpointSecret, EndpointSecret.endpoint_id == Endpoint.id)
                    .where(Endpoint.id.in_(chunk))):
                rows[row.id] = row
                if row.secret_id is not None and (row.expires_at is None
                                                  or row.expires_at > now):
                    secrets.setdefault(row.id, []).append(
                        (row.created_at, row.secret_id, row.secret_encrypted))
        found: dict[str, Target] = {}
        for endpoint_id, row in rows.items():
            live = sorted(secrets.get(endpoint_id, []), reverse=True)  # newest signs first
            timeout = row.timeout_s or self.default_timeout_s
            found[endpoint_id] = Target(
                endpoint_id=endpoint_id, url=row.url,
                secrets=tuple(self._decrypt(token) for _, _, token in live),
                headers=dict(row.headers or {}),
                timeout_s=float(min(max(timeout, MIN_TIMEOUT_S), MAX_TIMEOUT_S)),
                rate_limit_per_s=row.rate_limit_per_s)
        with self._lock:
            if len(self._known) > KNOWN_TARGETS_MAX:
                self._known.clear()
            self._known.update(found)
        return found

    def _decrypt(self, token: str) -> str:
        secret = self._secret_cache.get(token)
        if secret is None:
            secret = self.secret_box().decrypt(token)
            if len(self._secret_cache) > SECRET_CACHE_MAX:
                self._secret_cache.clear()
            self._secret_cache[token] = secret
        return secret
