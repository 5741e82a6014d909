"""`/metrics` in the Prometheus text format: who may scrape, what is shown, how long it is kept.

The figures are `app.services.metrics`' (read from the stores at scrape time); this face
renders them. A store that does not answer is reported as `kurir_<store>_up 0`, never as a
failed scrape. Attempts and their latency are counters (totals kept apart from the rows, which
retention purges); rows by state are gauges.

What a scrape may cost and show (docs/security.md):
- a render is a fixed number of SQL statements, whatever the number of endpoints, and is
  kept for `CACHE_TTL_S` seconds per process, so scraping in a loop cannot keep the
  database busy;
- the default series carry no partner uid and no endpoint id (aggregates only); the
  per-endpoint series (`partner`, `endpoint` labels) are served only when
  `KURIR_METRICS_TOKEN` is set, i.e. to a scraper that had to authenticate. Their
  cardinality is bounded by the endpoints that have something to show: live pull endpoints,
  and endpoints that hold at least one ordering key.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime

import redis
from flask import Blueprint, Flask, Response, current_app, request

from app.errors import Unauthorized
from app.models import DELIVERY_STATES, DL_STATES, INBOUND_STATUSES
from app.services import metrics as figures
from app.web.context import runtime

log = logging.getLogger(__name__)

blueprint = Blueprint("metrics", __name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# How long a render is served again before the stores are read anew (per API process).
CACHE_TTL_S = 5.0


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float, **labels: str) -> None:
        label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        number = repr(float(value)) if isinstance(value, float) else str(int(value))
        self.lines.append(f"{name}{{{label_text}}} {number}" if label_text else f"{name} {number}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _database_metrics(out: _Writer, found: figures.Figures, *, detailed: bool) -> None:
    out.family(
        "kurir_deliveries",
        "gauge",
        "Deliveries in the database, by state (on PostgreSQL, once deliveries hold "
        f"{figures.ESTIMATED_FROM:,} rows, succeeded and dead are estimated from the table's "
        "statistics).",
    )
    for state in sorted(set(DELIVERY_STATES) | set(found.deliveries)):
        out.sample("kurir_deliveries", found.deliveries.get(state, 0), state=state)

    attempts = found.attempts
    out.family(
        "kurir_attempts",
        "counter",
        "Delivery attempts ever recorded, by outcome (success = 2xx answer, http_error = "
        "any other answer, network_error = no answer: timeout, refused, blocked); "
        "retention's purges do not lower it.",
    )
    out.sample("kurir_attempts", attempts.success, outcome="success")
    out.sample("kurir_attempts", attempts.http_error, outcome="http_error")
    out.sample("kurir_attempts", attempts.network_error, outcome="network_error")
    out.family(
        "kurir_attempt_duration_seconds",
        "histogram",
        "Duration of delivery attempts, from sending to the end of the response.",
    )
    for bound, n in zip(figures.LATENCY_BUCKETS_S, attempts.within, strict=True):
        out.sample("kurir_attempt_duration_seconds_bucket", n, le=repr(bound))
    out.sample("kurir_attempt_duration_seconds_bucket", attempts.total, le="+Inf")
    out.sample("kurir_attempt_duration_seconds_sum", attempts.duration_ms / 1000.0)
    out.sample("kurir_attempt_duration_seconds_count", attempts.total)

    out.family(
        "kurir_dead_letters",
        "gauge",
        "Dead letters, by state (open = needs an operator; on PostgreSQL, once they are "
        f"{figures.ESTIMATED_FROM:,} rows, resent and discarded are estimated).",
    )
    for state in DL_STATES:
        out.sample("kurir_dead_letters", found.dead_letters.get(state, 0), state=state)

    out.family("kurir_endpoints", "gauge", "Endpoints, by state.")
    for state in sorted({"enabled", "disabled"} | set(found.endpoints)):
        out.sample("kurir_endpoints", found.endpoints.get(state, 0), state=state)

    _feed_metrics(out, found, detailed=detailed)
    _ordering_metrics(out, found, detailed=detailed)

    out.family(
        "kurir_inbound_events",
        "gauge",
        "Received partner callbacks, by status (on PostgreSQL, once they are "
        f"{figures.ESTIMATED_FROM:,} rows, applied and ignored are estimated).",
    )
    for status in sorted(set(INBOUND_STATUSES) | set(found.inbound)):
        out.sample("kurir_inbound_events", found.inbound.get(status, 0), status=status)

    _retention_metrics(out, found)


def _retention_metrics(out: _Writer, found: figures.Figures) -> None:
    """What retention did per kind of history (read from its marks: one statement)."""
    out.family(
        "kurir_retention_rows_purged_total",
        "counter",
        "Rows retention has purged, by kind of history (KURIR_RETAIN_<KIND>_DAYS).",
    )
    for mark in found.retention:
        out.sample("kurir_retention_rows_purged_total", mark.purged_total, kind=mark.kind.value)
    out.family(
        "kurir_retention_oldest_row_age_seconds",
        "gauge",
        "Age of the oldest row kept of each kind, as of the last retention run (0: none).",
    )
    for mark in found.retention:
        out.sample(
            "kurir_retention_oldest_row_age_seconds",
            _age(found.now, mark.oldest_kept_at),
            kind=mark.kind.value,
        )
    out.family(
        "kurir_retention_last_run_timestamp_seconds",
        "gauge",
        "When retention last ran over each kind (Unix time; 0: never).",
    )
    for mark in found.retention:
        ran = mark.last_run_at.timestamp() if mark.last_run_at else 0.0
        out.sample("kurir_retention_last_run_timestamp_seconds", float(ran), kind=mark.kind.value)


def _age(now: datetime, oldest: datetime | None) -> float:
    return 0.0 if oldest is None else max(0.0, (now - oldest).total_seconds())


def _feed_metrics(out: _Writer, found: figures.Figures, *, detailed: bool) -> None:
    """What pull endpoints' consumers have not acknowledged: in aggregate, and per endpoint
    for an authenticated scraper."""
    now, lags = found.now, found.pull
    out.family("kurir_pull_endpoints", "gauge", "Live pull endpoints.")
    out.sample("kurir_pull_endpoints", len(lags))
    out.family(
        "kurir_pull_lag_events",
        "gauge",
        "Events pull endpoints' consumers have not acknowledged yet, all endpoints together.",
    )
    out.sample("kurir_pull_lag_events", sum(p.lag.events for p in lags))
    out.family(
        "kurir_pull_lag_max_seconds",
        "gauge",
        "Age of the oldest event any pull endpoint's consumer has not acknowledged (0 when none).",
    )
    oldest = [p.lag.oldest_at for p in lags if p.lag.oldest_at is not None]
    out.sample("kurir_pull_lag_max_seconds", _age(now, min(oldest) if oldest else None))
    out.family(
        "kurir_pull_endpoints_backlog_expired",
        "gauge",
        "Pull endpoints whose unacknowledged events reach past retention: their reads "
        "answer 410 backlog_expired until they skip them.",
    )
    out.sample("kurir_pull_endpoints_backlog_expired", sum(1 for p in lags if p.lag.expired))
    if not detailed:
        return
    out.family(
        "kurir_pull_endpoint_lag_events",
        "gauge",
        "Events a pull endpoint's consumer has not acknowledged yet.",
    )
    for p in lags:
        out.sample(
            "kurir_pull_endpoint_lag_events",
            p.lag.events,
            endpoint=p.endpoint_id,
            partner=p.partner_uid,
        )
    out.family(
        "kurir_pull_endpoint_lag_seconds",
        "gauge",
        "Age of the oldest event a pull endpoint's consumer has not acknowledged (0 when none).",
    )
    for p in lags:
        out.sample(
            "kurir_pull_endpoint_lag_seconds",
            _age(now, p.lag.oldest_at),
            endpoint=p.endpoint_id,
            partner=p.partner_uid,
        )
    out.family(
        "kurir_pull_endpoint_expired_events",
        "gauge",
        "Of those, events created before the retention horizon.",
    )
    for p in lags:
        out.sample(
            "kurir_pull_endpoint_expired_events",
            p.lag.expired,
            endpoint=p.endpoint_id,
            partner=p.partner_uid,
        )


def _ordering_metrics(out: _Writer, found: figures.Figures, *, detailed: bool) -> None:
    """Ordering keys held behind a dead delivery (`on_dead: "block"`): nothing more of such a
    key is sent until its letter is resent or discarded."""
    counts = found.blocked
    out.family(
        "kurir_blocked_keys",
        "gauge",
        "Ordering keys held by a dead delivery (on_dead: block), all endpoints together.",
    )
    out.sample("kurir_blocked_keys", sum(c.keys for c in counts))
    out.family(
        "kurir_endpoints_with_blocked_keys", "gauge", "Endpoints holding at least one ordering key."
    )
    out.sample("kurir_endpoints_with_blocked_keys", len(counts))
    if not detailed:
        return
    out.family(
        "kurir_endpoint_blocked_keys",
        "gauge",
        "Ordering keys one endpoint holds (only endpoints holding at least one).",
    )
    for c in counts:
        out.sample(
            "kurir_endpoint_blocked_keys", c.keys, endpoint=c.endpoint_id, partner=c.partner_uid
        )


def render(*, detailed: bool = False) -> str:
    """The whole scrape; `detailed` adds the series labelled by partner and endpoint."""
    rt = runtime()
    out = _Writer()
    database_up = 1
    try:
        with rt.db.begin() as session:
            found = figures.database(session, rt.settings)
        _database_metrics(out, found, detailed=detailed)
    except Exception:
        log.warning("metrics: database query failed", exc_info=True)
        database_up = 0
    out.family("kurir_database_up", "gauge", "1 if the database answered this scrape.")
    out.sample("kurir_database_up", database_up)
    redis_up = 1
    try:
        stats = figures.queue_stats(rt.redis)
    except (redis.RedisError, OSError):
        log.warning("metrics: redis unavailable", exc_info=True)
        stats, redis_up = [], 0
    if stats:
        out.family("kurir_queue_depth", "gauge", "Jobs waiting in each RQ queue.")
        for stat in stats:
            out.sample("kurir_queue_depth", stat.depth, queue=stat.name)
        out.family(
            "kurir_queue_oldest_job_age_seconds",
            "gauge",
            "Age of the oldest job waiting in each queue (0 when empty).",
        )
        for stat in stats:
            out.sample(
                "kurir_queue_oldest_job_age_seconds",
                float(stat.oldest_age_s or 0.0),
                queue=stat.name,
            )
    out.family("kurir_redis_up", "gauge", "1 if Redis answered this scrape.")
    out.sample("kurir_redis_up", redis_up)
    return out.text()


class RenderCache:
    """The last render, served again for `ttl_s` seconds; one render at a time, so scrapes
    arriving together wait for it instead of each reading the stores."""

    def __init__(
        self, ttl_s: float = CACHE_TTL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()
        self._kept: dict[bool, tuple[float, str]] = {}

    def get(self, detailed: bool, make: Callable[[], str]) -> str:
        with self._lock:
            kept = self._kept.get(detailed)
            if kept is not None and self.clock() - kept[0] < self.ttl_s:
                return kept[1]
            text = make()
            self._kept[detailed] = (self.clock(), text)
            return text

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


def cache_of(app: Flask) -> RenderCache:
    """The app's render cache (made on first use)."""
    return app.extensions.setdefault("kurir_metrics", RenderCache())


@blueprint.get("/metrics")
def metrics() -> Response:
    token = runtime().settings.metrics_token
    _require_scrape_token(token)
    detailed = token is not None
    text = cache_of(current_app).get(detailed, lambda: render(detailed=detailed))
    return Response(text, content_type=CONTENT_TYPE)


def warn_if_open(app: Flask) -> None:
    """At start: an open /metrics on a shared (PostgreSQL) deployment is worth a warning."""
    settings = app.extensions["kurir"].settings
    if settings.metrics_token is None and not settings.is_sqlite:
        log.warning(
            "/metrics is open to anyone who can reach this API (KURIR_METRICS_TOKEN is "
            "unset): it shows aggregate delivery figures and no partner or endpoint; "
            "set KURIR_METRICS_TOKEN to require a bearer token (and to add the "
            "per-endpoint series)"
        )


def _require_scrape_token(token: str | None) -> None:
    """With KURIR_METRICS_TOKEN set, a scrape must bear it (Prometheus `authorization`):
    the figures then name partners and endpoints.
    """
    if token is None:
        return
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode(), token.encode()
    ):
        raise Unauthorized("/metrics needs Authorization: Bearer <KURIR_METRICS_TOKEN>")
