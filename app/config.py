"""Settings: one frozen object read from the environment, with defaults that work on a laptop.

Every knob Kurir has is a field here, so that the README's configuration table, the CLI and
the tests all read the same names. Invalid values fail at start with a message that names the
variable, never later in the middle of a delivery.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from sqlalchemy.exc import ArgumentError

from app import redis_client
from app.db import prepare_threshold_of

# Seconds between a delivery's attempts after the first: about 3 days in all, 13 attempts.
# When a failure-disabled endpoint is probed: these delays after it was disabled (each from
# the probe before), then every PROBE_EVERY_S until KURIR_PROBE_DAYS have passed.
PROBE_SCHEDULE: tuple[int, ...] = (300, 900, 3600)
PROBE_EVERY_S = 6 * 3600
DEFAULT_RETRY_SCHEDULE: tuple[int, ...] = (5, 300, 1800, 7200, 18000) + (36000,) * 7


class ConfigError(ValueError):
    """A configuration value is missing or malformed; the message names the variable."""


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off", ""}:
        return False
    raise ConfigError(f"{name} must be a boolean (1/0, true/false), got {raw!r}")


def _parse_int(name: str, raw: str, minimum: int | None = None, maximum: int | None = None) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be <= {maximum}, got {value}")
    return value


def _parse_float(name: str, raw: str, minimum: float = 0.0) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    return value


def parse_schedule(text: str) -> tuple[int, ...]:
    """Parse KURIR_RETRY_SCHEDULE strictly, so a typo fails at start-up instead of silently."""
    if not text or not text.strip():
        raise ValueError("retry schedule is empty: expected comma-separated seconds like '5,300'")
    steps: list[int] = []
    for position, raw in enumerate(text.split(","), start=1):
        item = raw.strip()
        if not item.isascii() or not item.isdigit():
            raise ValueError(
                f"retry schedule item {position} ({raw.strip()!r}) is not a positive "
                "whole number of seconds"
            )
        value = int(item)
        if value <= 0:
            raise ValueError(f"retry schedule item {position} must be positive, got {value}")
        steps.append(value)
    return tuple(steps)


def parse_retry_schedule(name: str, raw: str) -> tuple[int, ...]:
    """The retry schedule from the environment: an empty one would mean "never retry" by
    accident, and a typo must stop the start, not change the schedule."""
    try:
        return parse_schedule(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def _parse_cidrs(name: str, raw: str) -> tuple[str, ...]:
    cidrs = tuple(p.strip() for p in raw.split(",") if p.strip())
    for cidr in cidrs:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ConfigError(f"{name} contains an invalid CIDR: {cidr!r}") from None
    return cidrs


def _parse_cron(name: str, raw: str) -> str:
    fields_ = raw.split()
    if len(fields_) != 5:
        raise ConfigError(f"{name} must be a 5-field cron expression, got {raw!r}")
    try:
        from apscheduler.triggers.cron import CronTrigger

        CronTrigger.from_crontab(raw)
    except ValueError as exc:
        raise ConfigError(f"{name} is not a valid cron expression: {exc}") from None
    return raw


# The servers `kurir api` can run the WSGI app under (app/cli/http_servers.py).
HTTP_SERVERS: tuple[str, ...] = ("gunicorn", "granian")


def _parse_choice(choices: tuple[str, ...]) -> Any:
    def parse(name: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
        return value

    return parse


# A handler's dotted path (`package.module:function`) and the name it is registered under.
HANDLER_PATH = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
    r"(:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)?$"
)
HANDLER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")


def _parse_handlers(name: str, raw: str) -> tuple[tuple[str, str], ...]:
    """`name=package.module:function,...`; nothing is imported here."""
    registry: dict[str, str] = {}
    for entry in (part.strip() for part in raw.split(",")):
        if not entry:
            continue
        handler, equals, path = (x.strip() for x in entry.partition("="))
        if not equals or not HANDLER_NAME.fullmatch(handler) or not HANDLER_PATH.fullmatch(path):
            raise ConfigError(f"{name}: {entry!r} is not name=package.module:function")
        if handler in registry:
            raise ConfigError(f"{name}: handler name {handler!r} is given twice")
        registry[handler] = path
    return tuple(registry.items())


def _parse_trusted_proxies(name: str, raw: str) -> int | tuple[str, ...]:
    """A hop count (`1`: one proxy in front) or the proxies' networks (`10.0.0.0/8,...`)."""
    value = raw.strip()
    if not value:
        return 0
    if value.isdigit():
        return _parse_int(name, value, 0, 16)
    return _parse_cidrs(name, value)


def _parse_auto_bool(name: str, raw: str) -> bool | None:
    if raw.strip().lower() in {"", "auto"}:
        return None
    return _parse_bool(name, raw)


def _str(name: str, raw: str) -> str:
    return raw


# One CSP source expression: a keyword, a scheme (`https:`), or an origin with an optional
# `*.` host wildcard, port and path. Nothing that could end the directive (`;`, `,`).
_CSP_SOURCE = re.compile(
    r"^(?:'none'|'self'|[a-z][a-z0-9+.\-]*:|"
    r"(?:[a-z][a-z0-9+.\-]*://)?(?:\*\.)?[A-Za-z0-9.\-]+(?::(?:\d+|\*))?"
    r"(?:/[^\s;,']*)?)$"
)


def _parse_frame_ancestors(name: str, raw: str) -> str:
    """A CSP `frame-ancestors` source list: who may show the portal in a frame."""
    sources = raw.split()
    if not sources:
        raise ConfigError(f"{name} must list at least one source, or 'none'")
    for source in sources:
        if not _CSP_SOURCE.fullmatch(source):
            raise ConfigError(
                f"{name}: {source!r} is not a frame-ancestors source (an "
                "origin like https://app.example.com, a scheme like https:, "
                "'self' or 'none')"
            )
    if "'none'" in sources and len(sources) > 1:
        raise ConfigError(f"{name}: 'none' cannot be combined with other sources")
    return " ".join(sources)


def _parse_public_url(name: str, raw: str) -> str | None:
    value = raw.strip().rstrip("/")
    if not value:
        return None
    if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", value):
        raise ConfigError(
            f"{name} must be an http(s) URL such as https://hooks.example.com, got {raw!r}"
        )
    return value


def _parse_title(name: str, raw: str) -> str:
    value = raw.strip()
    if not value or len(value) > 100:
        raise ConfigError(f"{name} must be 1 to 100 characters")
    return value


def _opt_str(name: str, raw: str) -> str | None:
    return raw or None


def _parse_urls(name: str, raw: str) -> tuple[str, ...]:
    """Comma-separated http(s) URLs (blanks ignored)."""
    urls = tuple(part.strip() for part in raw.split(",") if part.strip())
    for url in urls:
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s]*)?", url):
            raise ConfigError(f"{name}: {url!r} is not an http(s) URL")
    return tuple(dict.fromkeys(urls))


@dataclass(frozen=True)
class Settings:
    """Everything configurable, read once at start; pass it around, never re-read the env."""

    data_dir: Path = Path("var")
    database_url: str | None = None
    redis_url: str | None = None
    secret_key: str | None = None
    max_payload_bytes: int = 256 * 1024
    retry_schedule: tuple[int, ...] = DEFAULT_RETRY_SCHEDULE
    retry_jitter: float = 0.2
    disable_after_failures: int = 8
    disable_after_seconds: int = 86400
    # Failure-disabled endpoints are probed for this many days; the first 2xx re-enables
    # those with auto_recover (unless KURIR_AUTO_RECOVER is off).
    probe_days: int = 7
    auto_recover: bool = True
    allow_private_targets: bool = False
    allowed_cidrs: tuple[str, ...] = ()
    require_https: bool = False
    # New push endpoints must answer an ownership challenge before anything else is sent
    # (an endpoint's own `verify` field overrides this default).
    verify_endpoints: bool = False
    secret_rotation_overlap_seconds: int = 86400
    default_timeout_s: int = 15
    connect_timeout_s: float = 5.0
    idempotency_ttl_seconds: int = 86400
    delivery_lease_seconds: int = 60
    sweep_interval_seconds: float = 2.0
    # The scheduler lease (see app/processes/lease.py); None: derived from the sweep interval,
    # so a standby starts sweeping within two sweep intervals of the active scheduler's death.
    scheduler_lease_seconds: float | None = None
    scheduler_renew_seconds: float | None = None
    worker_threads: int = 16
    # Threads of `kurir scheduler` that run periodic jobs; its database pool is one more (the
    # lease keeper). See app/budget.py for every process's connections.
    scheduler_threads: int = 4
    # How long a thread waits for a pooled connection when the process's budget is in use,
    # before it fails with app.db.PoolExhausted (instead of opening one more).
    db_pool_timeout_s: float = 30.0
    endpoint_concurrency: int = 4
    inbound_tolerance_seconds: int = 300
    reconcile_cron: str = "0 3 * * *"
    # Retention per kind of history (app.lifecycle), in days; only finished history is purged.
    retain_events_days: int = 30
    retain_attempts_days: int = 30
    retain_inbound_days: int = 30
    retain_dead_letters_days: int = 90
    retain_audit_days: int = 365
    # The longest a retention batch may hold the database's writer, in milliseconds.
    retention_batch_ms: int = 50
    # After a retention batch, a pause this many times as long; None: the backend's default
    # (app.lifecycle.purge.DEFAULT_YIELD).
    retention_yield: int | None = None
    # Where retention writes what it purges first (gzip JSON Lines, app.lifecycle.archive);
    # None: purged rows are gone.
    archive_dir: Path | None = None
    log_level: str = "info"
    log_format: str = "text"
    api_workers: int = 2
    api_threads: int = 8
    # The HTTP server under `kurir api` (one of HTTP_SERVERS); docs/benchmarks.md says why.
    http_server: str = "granian"
    metrics_token: str | None = None
    # Handlers a source may select by name: (name, "package.module:function") pairs.
    inbound_handlers: tuple[tuple[str, str], ...] = ()
    # Proxies in front of the API whose X-Forwarded-* headers are believed: a hop count, or
    # their networks. 0 believes none (the peer address is the client).
    trusted_proxies: int | tuple[str, ...] = 0
    # The UI session cookie's Secure flag; None decides per request (see app.web.ui.security).
    cookie_secure: bool | None = None
    # The partner portal: its title, who may frame it (CSP frame-ancestors) and how long a
    # magic link stays usable when its creator does not say.
    portal_title: str = "Webhooks"
    portal_frame_ancestors: str = "'none'"
    portal_link_ttl_seconds: int = 900
    # Kurir's own address as partners reach it, for the links it hands out; None: the address
    # the request that asks for a link came in on.
    public_url: str | None = None
    # What one partner can cause (partner keys and portal sessions; operators are not
    # limited by the rates): live endpoints, and endpoint creations and test events a minute.
    max_endpoints_per_partner: int = 50
    partner_endpoint_creates_per_minute: int = 30
    partner_test_sends_per_minute: int = 10
    # Tracing (app.telemetry): KURIR_OTEL says on (True) or off (False); None (unset, "auto")
    # follows the standard OTEL_EXPORTER_OTLP_ENDPOINT: on when it names a collector.
    otel: bool | None = None
    otel_endpoint: str | None = None
    otel_traces_exporter: str = "otlp"
    # Operator endpoints for Kurir's operational events (app.operational), kept in step with
    # this list by the scheduler; the secret signs them (None: each gets its own).
    operator_webhook_urls: tuple[str, ...] = ()
    operator_webhook_secret: str | None = None

    @property
    def tracing(self) -> bool:
        """Whether this process makes spans (if the `kurir[otel]` packages are installed)."""
        return self.otel if self.otel is not None else bool(self.otel_endpoint)

    @property
    def portal_framable(self) -> bool:
        """Whether some other page may show the portal in a frame."""
        return self.portal_frame_ancestors != "'none'"

    @property
    def resolved_database_url(self) -> str:
        """The URL to connect to: DATABASE_URL, or SQLite in the data dir (embedded default)."""
        if self.database_url:
            return normalise_database_url(self.database_url)
        return f"sqlite:///{(self.data_dir / 'kurir.db').resolve()}"

    @property
    def resolved_scheduler_lease_seconds(self) -> float:
        """How long a scheduler's lease lasts unrenewed: 1.5 sweep intervals by default, so
        expiry plus one renewal attempt of the standby stays within two sweep intervals."""
        if self.scheduler_lease_seconds is not None:
            return self.scheduler_lease_seconds
        return 1.5 * self.sweep_interval_seconds

    @property
    def resolved_scheduler_renew_seconds(self) -> float:
        """How often a scheduler renews (or, standing by, tries to take) the lease: a sixth of
        the lease by default, so the holder has five tries before it runs out."""
        if self.scheduler_renew_seconds is not None:
            return self.scheduler_renew_seconds
        return self.resolved_scheduler_lease_seconds / 6

    @property
    def handler_registry(self) -> dict[str, str]:
        """The named inbound handlers, name -> dotted path."""
        return dict(self.inbound_handlers)

    @property
    def is_sqlite(self) -> bool:
        return self.resolved_database_url.startswith("sqlite")

    @property
    def embedded_redis_socket(self) -> Path:
        return (self.data_dir / "redis.sock").resolve()

    @property
    def resolved_redis_url(self) -> str:
        """REDIS_URL, else the embedded server `kurir up` runs in the data dir, else localhost."""
        if self.redis_url:
            return self.redis_url
        url_file = self.data_dir / "redis.url"
        if url_file.exists():
            return url_file.read_text().strip()
        return "redis://127.0.0.1:6379/0"

    def with_overrides(self, **changes: Any) -> Settings:
        return replace(self, **changes)


def normalise_database_url(url: str) -> str:
    """Accept the `postgres://` spelling many platforms hand out, and pick the psycopg 3 driver."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return url


# env var -> (field name, parser). The README's configuration table mirrors this.
_ENV: dict[str, tuple[str, Any]] = {
    "KURIR_DATA_DIR": ("data_dir", lambda n, r: Path(r)),
    "DATABASE_URL": ("database_url", _opt_str),
    "REDIS_URL": ("redis_url", _opt_str),
    "KURIR_SECRET_KEY": ("secret_key", _opt_str),
    "KURIR_MAX_PAYLOAD_BYTES": (
        "max_payload_bytes",
        lambda n, r: _parse_int(n, r, 1024, 64 * 1024 * 1024),
    ),
    "KURIR_RETRY_SCHEDULE": ("retry_schedule", parse_retry_schedule),
    "KURIR_RETRY_JITTER": ("retry_jitter", lambda n, r: _parse_float(n, r, 0.0)),
    "KURIR_DISABLE_AFTER_FAILURES": ("disable_after_failures", lambda n, r: _parse_int(n, r, 1)),
    "KURIR_DISABLE_AFTER_SECONDS": ("disable_after_seconds", lambda n, r: _parse_int(n, r, 0)),
    "KURIR_PROBE_DAYS": ("probe_days", lambda n, r: _parse_int(n, r, 1, 365)),
    "KURIR_AUTO_RECOVER": ("auto_recover", _parse_bool),
    "KURIR_ALLOW_PRIVATE_TARGETS": ("allow_private_targets", _parse_bool),
    "KURIR_ALLOWED_CIDRS": ("allowed_cidrs", _parse_cidrs),
    "KURIR_REQUIRE_HTTPS": ("require_https", _parse_bool),
    "KURIR_VERIFY_ENDPOINTS": ("verify_endpoints", _parse_bool),
    "KURIR_SECRET_ROTATION_OVERLAP_SECONDS": (
        "secret_rotation_overlap_seconds",
        lambda n, r: _parse_int(n, r, 0),
    ),
    "KURIR_DEFAULT_TIMEOUT_S": ("default_timeout_s", lambda n, r: _parse_int(n, r, 1, 30)),
    "KURIR_CONNECT_TIMEOUT_S": ("connect_timeout_s", lambda n, r: _parse_float(n, r, 0.1)),
    "KURIR_IDEMPOTENCY_TTL_SECONDS": (
        "idempotency_ttl_seconds",
        lambda n, r: _parse_int(n, r, 86400),
    ),
    "KURIR_DELIVERY_LEASE_SECONDS": ("delivery_lease_seconds", lambda n, r: _parse_int(n, r, 5)),
    "KURIR_SWEEP_INTERVAL_SECONDS": (
        "sweep_interval_seconds",
        lambda n, r: _parse_float(n, r, 0.1),
    ),
    "KURIR_SCHEDULER_LEASE_SECONDS": (
        "scheduler_lease_seconds",
        lambda n, r: _parse_float(n, r, 0.3),
    ),
    "KURIR_SCHEDULER_RENEW_SECONDS": (
        "scheduler_renew_seconds",
        lambda n, r: _parse_float(n, r, 0.05),
    ),
    "KURIR_WORKER_THREADS": ("worker_threads", lambda n, r: _parse_int(n, r, 1, 512)),
    "KURIR_SCHEDULER_THREADS": ("scheduler_threads", lambda n, r: _parse_int(n, r, 1, 64)),
    "KURIR_DB_POOL_TIMEOUT_S": ("db_pool_timeout_s", lambda n, r: _parse_float(n, r, 0.1)),
    "KURIR_ENDPOINT_CONCURRENCY": ("endpoint_concurrency", lambda n, r: _parse_int(n, r, 1, 256)),
    "KURIR_INBOUND_TOLERANCE_SECONDS": (
        "inbound_tolerance_seconds",
        lambda n, r: _parse_int(n, r, 1),
    ),
    "KURIR_RECONCILE_CRON": ("reconcile_cron", _parse_cron),
    "KURIR_RETAIN_EVENTS_DAYS": ("retain_events_days", lambda n, r: _parse_int(n, r, 1)),
    "KURIR_RETAIN_ATTEMPTS_DAYS": ("retain_attempts_days", lambda n, r: _parse_int(n, r, 1)),
    "KURIR_RETAIN_INBOUND_DAYS": ("retain_inbound_days", lambda n, r: _parse_int(n, r, 1)),
    "KURIR_RETAIN_DEAD_LETTERS_DAYS": (
        "retain_dead_letters_days",
        lambda n, r: _parse_int(n, r, 1),
    ),
    "KURIR_RETAIN_AUDIT_DAYS": ("retain_audit_days", lambda n, r: _parse_int(n, r, 1)),
    "KURIR_RETENTION_BATCH_MS": ("retention_batch_ms", lambda n, r: _parse_int(n, r, 5, 10_000)),
    "KURIR_RETENTION_YIELD": (
        "retention_yield",
        lambda n, r: _parse_int(n, r, 1, 10_000) if r.strip() else None,
    ),
    "KURIR_ARCHIVE_DIR": ("archive_dir", lambda n, r: Path(r.strip()) if r.strip() else None),
    "KURIR_LOG_LEVEL": ("log_level", _parse_choice(("debug", "info", "warning", "error"))),
    "KURIR_LOG_FORMAT": ("log_format", _parse_choice(("text", "json"))),
    "KURIR_API_WORKERS": ("api_workers", lambda n, r: _parse_int(n, r, 1, 64)),
    "KURIR_API_THREADS": ("api_threads", lambda n, r: _parse_int(n, r, 1, 256)),
    "KURIR_HTTP_SERVER": ("http_server", _parse_choice(HTTP_SERVERS)),
    "KURIR_METRICS_TOKEN": ("metrics_token", _opt_str),
    "KURIR_INBOUND_HANDLERS": ("inbound_handlers", _parse_handlers),
    "KURIR_TRUSTED_PROXIES": ("trusted_proxies", _parse_trusted_proxies),
    "KURIR_COOKIE_SECURE": ("cookie_secure", _parse_auto_bool),
    "KURIR_PORTAL_TITLE": ("portal_title", _parse_title),
    "KURIR_PORTAL_FRAME_ANCESTORS": ("portal_frame_ancestors", _parse_frame_ancestors),
    "KURIR_PORTAL_LINK_TTL_SECONDS": (
        "portal_link_ttl_seconds",
        lambda n, r: _parse_int(n, r, 60, 86400),
    ),
    "KURIR_PUBLIC_URL": ("public_url", _parse_public_url),
    "KURIR_MAX_ENDPOINTS_PER_PARTNER": (
        "max_endpoints_per_partner",
        lambda n, r: _parse_int(n, r, 1, 100_000),
    ),
    "KURIR_PARTNER_ENDPOINT_CREATES_PER_MINUTE": (
        "partner_endpoint_creates_per_minute",
        lambda n, r: _parse_int(n, r, 1, 60_000),
    ),
    "KURIR_PARTNER_TEST_SENDS_PER_MINUTE": (
        "partner_test_sends_per_minute",
        lambda n, r: _parse_int(n, r, 1, 60_000),
    ),
    "KURIR_OPERATOR_WEBHOOK_URL": ("operator_webhook_urls", _parse_urls),
    "KURIR_OPERATOR_WEBHOOK_SECRET": ("operator_webhook_secret", _opt_str),
    "KURIR_OTEL": ("otel", _parse_auto_bool),
    # OpenTelemetry's own variables: read here only to decide whether tracing is on and how it
    # exports; the SDK reads them (and every other OTEL_*) itself.
    "OTEL_EXPORTER_OTLP_ENDPOINT": ("otel_endpoint", _opt_str),
    "OTEL_TRACES_EXPORTER": ("otel_traces_exporter", _parse_choice(("otlp", "console", "none"))),
}

ENV_VARS: tuple[str, ...] = tuple(_ENV)


def load_settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build Settings from an environment mapping (os.environ by default).

    Raises:
        ConfigError: naming the first variable whose value is invalid.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for var, (attr, parser) in _ENV.items():
        raw = env.get(var)
        if raw is None:
            continue
        values[attr] = parser(var, raw)
    values.update(overrides)
    known = {f.name for f in fields(Settings)}
    unknown = set(values) - known
    if unknown:
        raise ConfigError(f"unknown settings: {', '.join(sorted(unknown))}")
    settings = Settings(**values)
    if settings.database_url and not normalise_database_url(settings.database_url).startswith(
        ("sqlite", "postgresql")
    ):
        raise ConfigError(
            f"DATABASE_URL must be a postgresql:// or sqlite:// URL, got {settings.database_url!r}"
        )
    if settings.database_url and not settings.is_sqlite:
        try:
            prepare_threshold_of(settings.resolved_database_url)
        except ArgumentError:
            # SQLAlchemy's message repeats the URL, password and all.
            raise ConfigError("DATABASE_URL is not a valid URL") from None
        except ValueError as exc:
            raise ConfigError(f"DATABASE_URL: {exc}") from None
    if not settings.secret_key and not settings.is_sqlite:
        # The per-data-dir development key is for the embedded default: separate processes or
        # containers on a shared database would each invent their own and fail to decrypt
        # each other's secrets.
        raise ConfigError(
            "KURIR_SECRET_KEY must be set when DATABASE_URL points at "
            "PostgreSQL (every process needs the same key to read signing "
            'secrets); generate one with: python -c "from cryptography.fernet '
            'import Fernet; print(Fernet.generate_key().decode())"'
        )
    if settings.resolved_scheduler_renew_seconds * 3 > settings.resolved_scheduler_lease_seconds:
        # The holder stops starting jobs one renewal interval before its lease runs out: with
        # fewer than three renewals per lease one slow round trip would cost it the lease.
        raise ConfigError(
            "KURIR_SCHEDULER_RENEW_SECONDS must be at most a third of "
            "KURIR_SCHEDULER_LEASE_SECONDS (which defaults to 1.5 × KURIR_SWEEP_INTERVAL_SECONDS)"
        )
    if settings.redis_url:
        try:
            redis_client.check_url(settings.redis_url)
        except redis_client.RedisUrlError as exc:
            raise ConfigError(
                f"REDIS_URL {exc}, got {redis_client.redact(settings.redis_url)!r}"
            ) from None
    return settings
