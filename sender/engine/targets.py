"""Where and how to send: each claimed endpoint's URL, headers, timeout and live secrets.

Read afresh for every claimed batch, one query per batch, not per delivery (on PostgreSQL
part of the claim's own statement, `claim.claim_with_targets`): a rotated secret,
a new URL or new headers apply to the very next claim (a partner switching to the new secret
at once must not see deliveries signed only with the old one). Decrypted secrets are cached
by their ciphertext; whether an endpoint is enabled is the claim's business.

An endpoint that cannot be sent to (no live secret, a secret KURIR_SECRET_KEY cannot decrypt,
stored headers or a rate limit the API would have refused) is reported as `Unsendable`, with
the error class its deliveries' attempts record. It is never an exception: one broken
endpoint must not stop the rest of the batch.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Text, cast, select
from sqlalchemy.orm import Session

from app import secret_ring
from app.crypto import SecretBox
from app.models import Endpoint, EndpointSecret
from sender.deliver import Target
from sender.engine.errors import (
    ERROR_BAD_HEADERS,
    ERROR_BAD_RATE_LIMIT,
    ERROR_INTERNAL,
    ERROR_NO_SECRET,
    ERROR_SECRET_UNDECRYPTABLE,
)
from sender.engine.sql import chunks, ids_in
from sender.engine.work import Unsendable

log = logging.getLogger(__name__)

# An endpoint's timeout is clamped to this range, whatever its row says.
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 1, 30
SECRET_CACHE_MAX = 10_000
KNOWN_TARGETS_MAX = 50_000

Targets = tuple[dict[str, Target], dict[str, Unsendable]]


def target_columns() -> list[Any]:
    """What a target is built from: the endpoint's columns, and one of its secrets (or none).

    Headers as stored, as text (decoded only when a target is built, `_stored_json`): one
    unreadable value must fail its endpoint only, and text keys the built-target cache.
    """
    return [
        Endpoint.url,
        cast(Endpoint.headers, Text).label("headers"),
        cast(Endpoint.public_headers, Text).label("public_headers"),
        Endpoint.timeout_s,
        Endpoint.rate_limit_per_s,
        Endpoint.send_traceparent,
        EndpointSecret.id.label("secret_id"),
        EndpointSecret.created_at,
        EndpointSecret.expires_at,
        EndpointSecret.secret_encrypted,
    ]


def _targets_statement(postgres: bool) -> Any:
    """Built once per dialect, run as Core on the session's connection: no statement built,
    keyed or run through the ORM per batch."""
    return (
        select(Endpoint.id.label("endpoint_id"), *target_columns())
        .outerjoin(EndpointSecret, EndpointSecret.endpoint_id == Endpoint.id)
        .where(ids_in(Endpoint.id, "b_ids", postgres))
    )


_TARGETS = {postgres: _targets_statement(postgres) for postgres in (True, False)}


class TargetReader:
    """Reads send targets; remembers the last one per endpoint to size the next lease."""

    def __init__(self, secret_box: Callable[[], SecretBox], default_timeout_s: float) -> None:
        # A callable: the box (and a development key file) is loaded on first use.
        self.secret_box = secret_box
        self.default_timeout_s = default_timeout_s
        self._secret_cache: dict[str, str] = {}
        self._lock = threading.Lock()
        self._known: dict[str, Target] = {}
        self._longest = 0.0  # of the timeouts in `_known`
        # Targets already built, by everything they are built from (the row's columns as
        # stored and the live secrets' ciphertexts): at a trickle a claim per delivery reads
        # the same endpoint again and again, and a changed column or secret is a new key.
        self._built: dict[tuple[Any, ...], Target] = {}

    def longest_timeout(self) -> float:
        """The longest timeout among the endpoints seen so far (at least the default)."""
        with self._lock:
            return max(float(self.default_timeout_s), self._longest)

    def read(self, session: Session, endpoint_ids: set[str], now: datetime) -> Targets:
        """A target for every endpoint found (secrets decrypted, newest first), and why
        those that cannot be sent to cannot (their targets then carry no secret)."""
        connection = session.connection()
        statement = _TARGETS[connection.dialect.name == "postgresql"]
        rows: list[Any] = []
        for chunk in chunks(sorted(endpoint_ids)):
            rows += connection.execute(statement, {"b_ids": list(chunk)}).all()
        return self.build(rows, now)

    def build(self, rows: list[Any], now: datetime) -> Targets:
        """The targets of rows of `target_columns()` with `endpoint_id`: one row per endpoint
        and secret, repeated as often as the query that read them likes (the claim repeats
        them per delivery)."""
        secrets: dict[str, dict[str, tuple[datetime, str, str]]] = {}
        endpoints: dict[str, Any] = {}
        for row in rows:
            endpoints[row.endpoint_id] = row
            if row.secret_id is not None and secret_ring.is_live(row.expires_at, now):
                secrets.setdefault(row.endpoint_id, {})[row.secret_id] = (
                    row.created_at,
                    row.secret_id,
                    row.secret_encrypted,
                )
        found: dict[str, Target] = {}
        unsendable: dict[str, Unsendable] = {}
        for endpoint_id, row in endpoints.items():
            # Newest signs first.
            tokens = tuple(
                token for _, _, token in sorted(secrets.get(endpoint_id, {}).values(), reverse=True)
            )
            key = (
                endpoint_id,
                row.url,
                row.headers,
                row.public_headers,
                row.timeout_s,
                row.rate_limit_per_s,
                row.send_traceparent,
                tokens,
            )
            built = self._built.get(key)
            if built is not None:
                found[endpoint_id] = built
                continue
            timeout = row.timeout_s or self.default_timeout_s
            bare = Target(
                endpoint_id=endpoint_id,
                url=row.url,
                secrets=(),
                timeout_s=float(min(max(timeout, MIN_TIMEOUT_S), MAX_TIMEOUT_S)),
            )
            try:
                target = self._complete(bare, row, list(tokens))
            except Exception as exc:  # a bug must fail this endpoint, not the batch
                log.exception(
                    "reading an endpoint's target failed", extra={"endpoint_id": endpoint_id}
                )
                target = Unsendable(ERROR_INTERNAL, type(exc).__name__)
            if isinstance(target, Unsendable):
                found[endpoint_id] = bare
                unsendable[endpoint_id] = target
            else:
                found[endpoint_id] = target
                if len(self._built) >= KNOWN_TARGETS_MAX:
                    self._built.clear()
                self._built[key] = target
        with self._lock:
            self._remember(found)
        return found, unsendable

    def _remember(self, found: dict[str, Target]) -> None:
        """Keep the latest target per endpoint and the longest timeout among them (lock
        held): read per claim, so kept up to date here instead of recomputed there."""
        known = self._known
        if len(known) > KNOWN_TARGETS_MAX:
            known.clear()
            self._longest = 0.0
        shorter = False
        for endpoint_id, target in found.items():
            before = known.get(endpoint_id)
            shorter |= before is not None and before.timeout_s > target.timeout_s
            known[endpoint_id] = target
            self._longest = max(self._longest, target.timeout_s)
        if shorter:
            self._longest = max((t.timeout_s for t in known.values()), default=0.0)

    def _complete(self, bare: Target, row: Any, tokens: list[str]) -> Target | Unsendable:
        """`bare` with its secrets, headers and rate limit, or why it cannot be sent to."""
        try:
            secrets = tuple(self._decrypt(token) for token in tokens)
        except ValueError as exc:
            return Unsendable(ERROR_SECRET_UNDECRYPTABLE, str(exc))
        if not secrets:
            return Unsendable(ERROR_NO_SECRET, "endpoint has no active signing secret")
        headers = _stored_headers(row.headers)
        if headers is None:
            return Unsendable(
                ERROR_BAD_HEADERS, "stored headers are not a JSON object of name: value"
            )
        public = _stored_json(row.public_headers)
        if public is None:
            public = []
        if not isinstance(public, list) or not all(isinstance(n, str) for n in public):
            return Unsendable(
                ERROR_BAD_HEADERS, "stored public_headers are not a JSON list of header names"
            )
        rate = row.rate_limit_per_s
        if rate is not None and rate < 1:
            return Unsendable(
                ERROR_BAD_RATE_LIMIT, f"stored rate_limit_per_s is {rate}; it must be null or >= 1"
            )
        return Target(
            endpoint_id=bare.endpoint_id,
            url=bare.url,
            secrets=secrets,
            headers=headers,
            public_headers=frozenset(n.lower() for n in public),
            timeout_s=bare.timeout_s,
            rate_limit_per_s=rate,
            send_traceparent=bool(row.send_traceparent),
        )

    def _decrypt(self, token: str) -> str:
        secret = self._secret_cache.get(token)
        if secret is None:
            secret = self.secret_box().decrypt(token)
            if len(self._secret_cache) > SECRET_CACHE_MAX:
                self._secret_cache.clear()
            self._secret_cache[token] = secret
        return secret


_UNREADABLE = object()


def _stored_json(raw: Any) -> Any:
    """A JSON column's value as stored, or `_UNREADABLE`.

    PostgreSQL's driver hands JSON back decoded; SQLite hands back the text, which a
    hand-edited row may have made anything.
    """
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return _UNREADABLE
    return raw


def _stored_headers(raw: Any) -> dict[str, Any] | None:
    """The headers column as an object, or None when it holds anything else."""
    value = _stored_json(raw)
    if value is None:
        return {}
    return value if isinstance(value, dict) else None
