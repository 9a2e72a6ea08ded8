"""Tracing, store-call observation and log correlation for every layer (no-op without an
OpenTelemetry SDK). See ``docs/observability.md``.

- ``configure(tracer_provider=..., enabled=..., capture_content=...)``: what records.
- ``span``/``start``/``use``/``finish``: spans with attributes, events and links.
- ``inject``/``extract``/``link``: the W3C trace context to and from a plain dict.
- ``redact_spans``: credentials in every span's URL attributes redacted as it starts.
- ``StoreCalls``: the one wrapper around the store writes of the runtime and the worker.
- ``TraceContextFilter``/``instrument_logging``: trace and span ids on log records.
"""

from wakeful.telemetry.logs import TRACE_FORMAT, TraceContextFilter, instrument_logging
from wakeful.telemetry.stores import StoreCalls, db_system
from wakeful.telemetry.tracing import (
    NO_SPAN,
    SpanLike,
    capture_content,
    configure,
    current,
    extract,
    failed,
    finish,
    ids,
    inject,
    kind,
    link,
    redact_spans,
    span,
    start,
    tracer,
    use,
)

__all__ = [
    "NO_SPAN",
    "TRACE_FORMAT",
    "SpanLike",
    "StoreCalls",
    "TraceContextFilter",
    "capture_content",
    "configure",
    "current",
    "db_system",
    "extract",
    "failed",
    "finish",
    "ids",
    "inject",
    "instrument_logging",
    "kind",
    "link",
    "redact_spans",
    "span",
    "start",
    "tracer",
    "use",
]
