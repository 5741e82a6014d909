"""Tracing with OpenTelemetry: one trace per event, from the publisher's request to every
attempt; nothing at all, at no cost, when it is off.

Tracing is optional twice over: the packages come with the `kurir[otel]` extra, and a process
turns it on only when `KURIR_OTEL=1`, or when `OTEL_EXPORTER_OTLP_ENDPOINT` is set and
`KURIR_OTEL` is not 0 (`Settings.tracing`). Until `configure` (or a test's `enable`) has run,
every function here returns at once: `span` hands out one shared object that does nothing,
`traceparent` answers None, so the delivery engine pays a function call and a global read.

The spans, and how they join across processes (the event row carries the context):

- `kurir.publish` (server): a child of the publisher's `traceparent`; its own context is
  stored with the event (`events.trace_context`), so spans made later, elsewhere, join it;
- `kurir.enqueue` (producer): putting the deliveries on Redis, a child of the publish;
- `kurir.attempt` (client): every attempt a worker makes, a child of the stored publish
  context; to an endpoint with `send_traceparent`, its own context goes out as the request's
  `traceparent` header (never to the others: internal trace ids stay internal by default);
- `kurir.inbound.receive` (server): a callback received, a child of the caller's
  `traceparent`; its context is stored with the inbound event (`inbound_events.trace_context`);
- `kurir.inbound.apply` (consumer): a worker applying that event, a child of the receive.

Nothing here imports OpenTelemetry at module level: without the extra, Kurir runs untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from app import __version__

if TYPE_CHECKING:
    from app.config import Settings

log = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
# Span kinds, by name, so that callers need no OpenTelemetry import.
SERVER, CLIENT, PRODUCER, CONSUMER, INTERNAL = (
    "server",
    "client",
    "producer",
    "consumer",
    "internal",
)

Attributes = Mapping[str, str | int | float | bool]


class _NoSpan:
    """While tracing is off: a context manager and a span at once, doing nothing."""

    __slots__ = ()

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def set_attributes(self, attributes: Attributes) -> None:
        return None

    def is_recording(self) -> bool:
        return False


NO_SPAN = _NoSpan()

# While tracing is on: the tracer, OpenTelemetry's trace module, span kinds by name and the
# W3C propagator. None while it is off: the one thing every call looks at.
_tracer: Any = None
_otel: Any = None
_kinds: dict[str, Any] = {}
_propagator: Any = None


def enabled() -> bool:
    """Whether spans are being made in this process."""
    return _tracer is not None


def configure(settings: Settings) -> bool:
    """Turn tracing on for this process when `settings.tracing` says so; True when it is on.

    A tracer provider already installed (by `opentelemetry-instrument`, say) is used as it
    is. Otherwise one is made from the standard OTEL_* variables (service name, resource
    attributes, sampler, the OTLP endpoint and headers), exporting in batches as
    OTEL_TRACES_EXPORTER says (`settings.otel_traces_exporter`: "otlp" over HTTP, "console"
    or "none"). The service name is
    "kurir" unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES names one. Without the
    `kurir[otel]` packages tracing stays off, with a warning: a missing extra never stops a
    process.
    """
    if not settings.tracing:
        return False
    if _tracer is not None:
        return True
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError:
        log.warning(
            "tracing is asked for (KURIR_OTEL or OTEL_EXPORTER_OTLP_ENDPOINT) but OpenTelemetry "
            "is not installed: pip install 'kurir[otel]'; tracing stays off"
        )
        return False
    installed = trace.get_tracer_provider()
    if isinstance(installed, TracerProvider):
        enable(installed)
        return True
    exporter = settings.otel_traces_exporter
    chosen: SpanExporter | None = None
    if exporter == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning(
                "the OTLP exporter is not installed: pip install 'kurir[otel]'; tracing stays off"
            )
            return False
        chosen = OTLPSpanExporter()
    elif exporter == "console":
        chosen = ConsoleSpanExporter()
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "kurir"}))
    provider = TracerProvider(resource=resource)
    if chosen is not None:
        provider.add_span_processor(BatchSpanProcessor(chosen))
    trace.set_tracer_provider(provider)
    enable(provider)
    log.info("tracing on", extra={"traces_exporter": exporter})
    return True


def enable(provider: Any = None) -> None:
    """Make spans from now on, with `provider` (a TracerProvider; the global one when None).

    Tests pass their own provider (an in-memory exporter) instead of installing it globally.
    """
    global _tracer, _otel, _propagator
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _kinds.update(
        {
            SERVER: trace.SpanKind.SERVER,
            CLIENT: trace.SpanKind.CLIENT,
            PRODUCER: trace.SpanKind.PRODUCER,
            CONSUMER: trace.SpanKind.CONSUMER,
            INTERNAL: trace.SpanKind.INTERNAL,
        }
    )
    _otel = trace
    _propagator = TraceContextTextMapPropagator()
    _tracer = trace.get_tracer("kurir", __version__, tracer_provider=provider)


def disable() -> None:
    """No more spans in this process (the provider, if any, is left as it is)."""
    global _tracer
    _tracer = None


def span(
    name: str,
    *,
    parent: str | None = None,
    kind: str = INTERNAL,
    attributes: Attributes | None = None,
) -> Any:
    """A context manager that makes `name` the current span until it ends, and yields it.

    Its parent is `parent` (a W3C `traceparent` value: from a caller, or stored with a row),
    else the current span. An unreadable `parent` starts a new trace. An exception leaving
    the block is recorded on the span and marks it failed.
    """
    if _tracer is None:
        return NO_SPAN
    return _tracer.start_as_current_span(
        name, context=_context(parent), kind=_kinds[kind], attributes=attributes
    )


def start(
    name: str,
    *,
    parent: str | None = None,
    kind: str = INTERNAL,
    attributes: Attributes | None = None,
) -> Any:
    """A span that is not made current, ended with `end`: for work done for many at once
    (a batch of inbound events applied in one transaction, one span each)."""
    if _tracer is None:
        return NO_SPAN
    return _tracer.start_span(
        name, context=_context(parent), kind=_kinds[kind], attributes=attributes
    )


def end(span_: Any, *, error: str | None = None, attributes: Attributes | None = None) -> None:
    """End a span from `start`, with last attributes and, when `error`, a failed status."""
    if span_ is NO_SPAN:
        return
    if attributes:
        span_.set_attributes(attributes)
    if error is not None:
        failed(span_, error)
    span_.end()


def failed(span_: Any, description: str) -> None:
    """Mark a span failed (an attempt answered 5xx, a callback not applied...)."""
    if span_ is NO_SPAN or _otel is None:
        return
    span_.set_status(_otel.Status(_otel.StatusCode.ERROR, description))


def traceparent(span_: Any = None) -> str | None:
    """The W3C `traceparent` of `span_` (the current span when None): what is stored with a
    row so that later spans, in other processes, join its trace; None while tracing is off."""
    if _tracer is None:
        return None
    carrier: dict[str, str] = {}
    context = None if span_ is None else _otel.set_span_in_context(span_)
    _propagator.inject(carrier, context=context)
    return carrier.get(TRACEPARENT)


def header_value(headers: Any) -> str | None:
    """The `traceparent` among request headers: (name, value) pairs or a mapping."""
    if _tracer is None:
        return None
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    for name, value in pairs:
        if name.lower() == TRACEPARENT:
            return str(value)
    return None


def _context(parent: str | None) -> Any:
    """OpenTelemetry's context for a `traceparent` value; None (the current one) without."""
    if parent is None:
        return None
    return _propagator.extract({TRACEPARENT: parent})
