"""Inbound sources: who may call us, how they sign, where their fields live, how to pull state.

A source's secrets are stored encrypted (``runtime.secret_box``); several may be valid at once
so a partner can rotate without a window of 401s. Its field mapping is the scheme's preset
(:data:`app.inbound.mapping.PRESETS`) with the source's own overrides on top; overrides are
validated when the source is configured, never at the first callback.

The receiver reads a source on every callback, so :func:`verification_config` keeps a small
per-process cache (``CONFIG_CACHE_TTL_S``); a change made elsewhere is seen within that time,
a change made in this process at once.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from app import headers as header_rules
from app.clock import utcnow
from app.config import Settings
from app.crypto import SecretBox
from app.errors import Conflict, NotFound, ValidationFailed
from app.inbound import handlers as handler_registry
from app.inbound import mapping as field_mapping
from app.inbound.verify import SCHEMES, standard_webhooks_key
from app.models import InboundSource, InboundSourceSecret

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,99}$")
MAX_SECRET_LENGTH = 1000
MAX_SECRETS = 10
CONFIG_CACHE_TTL_S = 5.0


@dataclass(frozen=True)
class VerificationConfig:
    """What the receiver needs to check and read one callback, detached from any session."""

    source_id: str
    name: str
    scheme: str
    secrets: tuple[str, ...]
    tolerance_s: int
    mapping: field_mapping.FieldMapping


def validate_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValidationFailed(
            "source name must be 1-100 characters of a-z, 0-9, '.', '_' or '-', "
            "starting with a letter or digit",
            code="invalid_source",
            details={"field": "name"},
        )
    return name


def validate_scheme(scheme: str) -> str:
    if scheme not in SCHEMES:
        raise ValidationFailed(
            f"scheme must be one of {', '.join(SCHEMES)}",
            code="invalid_source",
            details={"field": "scheme"},
        )
    return scheme


def validate_secret(scheme: str, secret: object) -> str:
    """Refuse a secret that could never verify anything (empty, huge, undecodable)."""
    if not isinstance(secret, str) or not secret.strip():
        raise ValidationFailed("a secret must be a non-empty string", code="invalid_secret")
    if len(secret) > MAX_SECRET_LENGTH or secret != secret.strip():
        raise ValidationFailed(
            f"a secret must be at most {MAX_SECRET_LENGTH} characters without surrounding "
            "whitespace",
            code="invalid_secret",
        )
    if scheme == "standard-webhooks":
        try:
            standard_webhooks_key(secret)
        except ValueError as exc:
            raise ValidationFailed(
                f"not a Standard Webhooks secret: {exc}", code="invalid_secret"
            ) from None
    return secret


def validate_mapping(overrides: object) -> dict[str, str | None]:
    """Overrides as {field: path or None}; every path is checked by mapping.validate_path."""
    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping):
        raise ValidationFailed("mapping must be an object of field: path", code="invalid_mapping")
    result: dict[str, str | None] = {}
    for key, path in overrides.items():
        if key not in field_mapping.FIELDS:
            raise ValidationFailed(
                f"unknown mapping field {key!r}; known: {', '.join(field_mapping.FIELDS)}",
                code="invalid_mapping",
                details={"field": key},
            )
        if path is not None:
            try:
                field_mapping.validate_path(path)
            except ValueError as exc:
                raise ValidationFailed(
                    f"mapping {key}: {exc}", code="invalid_mapping", details={"field": key}
                ) from None
        result[str(key)] = path
    return result


def validate_tolerance(tolerance_s: object) -> int:
    if (
        isinstance(tolerance_s, bool)
        or not isinstance(tolerance_s, int)
        or not 1 <= tolerance_s <= 86400
    ):
        raise ValidationFailed(
            "tolerance_s must be an integer between 1 and 86400",
            code="invalid_source",
            details={"field": "tolerance_s"},
        )
    return tolerance_s


def validate_reconcile_url(url: object, settings: Settings) -> str | None:
    """A pull URL is fetched by our workers: the SSRF guard applies as for endpoints."""
    if url is None or url == "":
        return None
    if not isinstance(url, str) or len(url) > 2000:
        raise ValidationFailed("reconcile_url must be a URL", code="invalid_reconcile_url")
    from app.inbound.reconcile import check_reconcile_url

    try:
        check_reconcile_url(url, settings)
    except ValueError as exc:
        raise ValidationFailed(
            f"reconcile_url refused: {exc}", code="invalid_reconcile_url"
        ) from None
    return url


def create_source(
    session: Session,
    box: SecretBox,
    settings: Settings,
    *,
    name: str,
    scheme: str,
    secrets: Sequence[str],
    tolerance_s: int | None = None,
    mapping: Mapping[str, str | None] | None = None,
    allow_gaps: bool = True,
    handlers: Iterable[Any] = (),
    reconcile_url: str | None = None,
    allow_handler_paths: bool = False,
) -> InboundSource:
    """Create a source with its secrets; the caller commits.

    `handlers` select handlers registered by name (KURIR_INBOUND_HANDLERS); only with
    `allow_handler_paths` (the operator's command line) may they name a module path.

    Raises:
        ValidationFailed: any field is invalid (the message names it).
        Conflict: a source of that name exists.
    """
    validate_name(name)
    validate_scheme(scheme)
    if isinstance(secrets, str) or not secrets:
        raise ValidationFailed("at least one secret is required", code="invalid_secret")
    if len(secrets) > MAX_SECRETS:
        raise ValidationFailed(f"at most {MAX_SECRETS} secrets", code="invalid_secret")
    checked = [validate_secret(scheme, s) for s in secrets]
    tolerance = validate_tolerance(
        settings.inbound_tolerance_seconds if tolerance_s is None else tolerance_s
    )
    overrides = validate_mapping(mapping)
    if not isinstance(allow_gaps, bool):
        raise ValidationFailed(
            "allow_gaps must be a boolean", code="invalid_source", details={"field": "allow_gaps"}
        )
    handler_specs = handler_registry.validate_specs(
        handlers, settings.handler_registry, allow_paths=allow_handler_paths
    )
    url = validate_reconcile_url(reconcile_url, settings)
    if session.scalar(select(InboundSource.id).where(InboundSource.name == name)):
        raise Conflict(f"a source named {name!r} already exists", code="source_exists")
    source = InboundSource(
        name=name,
        scheme=scheme,
        tolerance_s=tolerance,
        mapping=overrides,
        allow_gaps=allow_gaps,
        handlers=handler_specs,
        reconcile_url=url,
    )
    session.add(source)
    now = utcnow()
    # The first secret given is the newest: it verifies first.
    for offset, secret in enumerate(reversed(checked)):
        session.add(
            InboundSourceSecret(
                source=source,
                secret_encrypted=box.encrypt(secret),
                created_at=now + timedelta(microseconds=offset),
            )
        )
    session.flush()
    invalidate_cache(name)
    return source


def add_secret(
    session: Session,
    box: SecretBox,
    source: InboundSource,
    secret: str,
    *,
    rotate: bool = False,
    overlap_s: int = 0,
    now: datetime | None = None,
) -> InboundSourceSecret:
    """Add a secret; with ``rotate`` the older ones stay valid only for ``overlap_s`` more."""
    validate_secret(source.scheme, secret)
    now = now or utcnow()
    live = [s for s in source.secrets if s.expires_at is None or s.expires_at > now]
    if len(live) >= MAX_SECRETS:
        raise ValidationFailed(
            f"a source has at most {MAX_SECRETS} valid secrets", code="invalid_secret"
        )
    if rotate:
        expires = now + timedelta(seconds=overlap_s)
        for existing in live:
            if existing.expires_at is None or existing.expires_at > expires:
                existing.expires_at = expires
    row = InboundSourceSecret(source=source, secret_encrypted=box.encrypt(secret), created_at=now)
    session.add(row)
    session.flush()
    invalidate_cache(source.name)
    return row


def active_secrets(source: InboundSource, box: SecretBox, now: datetime) -> list[str]:
    """Every secret that verifies right now, newest first."""
    live = [s for s in source.secrets if s.expires_at is None or s.expires_at > now]
    live.sort(key=lambda s: (s.created_at, s.id), reverse=True)
    return [box.decrypt(s.secret_encrypted) for s in live]


def effective_mapping(source: InboundSource) -> field_mapping.FieldMapping:
    """The scheme's preset with the source's overrides applied."""
    return field_mapping.merge(field_mapping.PRESETS[source.scheme], source.mapping or {})


def get_source(session: Session, name: str) -> InboundSource:
    # A name no source could have (NUL, 1 MB, ...) is not looked up: PostgreSQL would refuse
    # a NUL in the query, and the caller would take that for the store being down.
    source = (
        session.scalar(
            select(InboundSource)
            .where(InboundSource.name == name)
            .options(selectinload(InboundSource.secrets))
        )
        if NAME_PATTERN.fullmatch(name)
        else None
    )
    if source is None:
        shown = name if len(name) <= 100 else name[:100] + "..."
        raise NotFound(f"no inbound source named {shown!r}", details={"source": shown})
    return source


def list_sources(session: Session) -> list[InboundSource]:
    return list(
        session.scalars(
            select(InboundSource)
            .order_by(InboundSource.name)
            .options(selectinload(InboundSource.secrets))
        )
    )


# ------------------------------------------------------------------------- receiver's cache

# Bound of the cache (one entry per source name looked up and found): at the bound it is
# emptied and refilled from the database. Names that are not sources are never cached.
CONFIG_CACHE_MAX = 1000
_cache: dict[str, tuple[float, VerificationConfig]] = {}
_cache_lock = threading.Lock()


def invalidate_cache(name: str | None = None) -> None:
    with _cache_lock:
        if name is None:
            _cache.clear()
        else:
            _cache.pop(name, None)


def verification_config(
    session_factory: Any, box: SecretBox, name: str, now: datetime | None = None
) -> VerificationConfig:
    """The source's scheme, live secrets, tolerance and mapping, cached for a few seconds.

    Raises:
        NotFound: there is no such source.
        sqlalchemy.exc.SQLAlchemyError: the database cannot be read (the caller answers 503).
    """
    clock = time.monotonic()
    with _cache_lock:
        hit = _cache.get(name)
        if hit and clock - hit[0] < CONFIG_CACHE_TTL_S:
            return hit[1]
    with session_factory() as session:
        source = get_source(session, name)
        config = VerificationConfig(
            source_id=source.id,
            name=source.name,
            scheme=source.scheme,
            secrets=tuple(active_secrets(source, box, now or utcnow())),
            tolerance_s=source.tolerance_s,
            mapping=effective_mapping(source),
        )
        session.rollback()
    with _cache_lock:
        if len(_cache) >= CONFIG_CACHE_MAX:
            _cache.clear()
        _cache[name] = (clock, config)
    return config


def source_to_dict(source: InboundSource, now: datetime | None = None) -> dict[str, Any]:
    """The API shape of a source; secrets are never shown, only their ids and lifetimes."""
    from app.clock import isoformat

    now = now or utcnow()
    mapping = effective_mapping(source)
    return {
        "id": source.id,
        "name": source.name,
        "scheme": source.scheme,
        "tolerance_s": source.tolerance_s,
        "mapping": {name: getattr(mapping, name) for name in field_mapping.FIELDS},
        "mapping_overrides": dict(source.mapping or {}),
        "allow_gaps": source.allow_gaps,
        "handlers": list(source.handlers or []),
        "reconcile_url": header_rules.redact_url(source.reconcile_url),
        "receive_path": f"/inbound/{source.name}",
        "secrets": [
            {
                "id": s.id,
                "created_at": isoformat(s.created_at),
                "expires_at": isoformat(s.expires_at),
                "active": s.expires_at is None or s.expires_at > now,
            }
            for s in sorted(source.secrets, key=lambda s: (s.created_at, s.id), reverse=True)
        ],
        "created_at": isoformat(source.created_at),
        "updated_at": isoformat(source.updated_at),
    }
