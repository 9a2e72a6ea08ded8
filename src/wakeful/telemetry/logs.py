"""Log records that name the trace they were written in.

``TraceContextFilter`` sets ``trace_id`` and ``span_id`` (lowercase hex, as trace backends
show them; empty strings outside a span or while tracing is off) on every record it sees,
so any formatter can print them: ``TRACE_FORMAT`` does. ``instrument_logging`` installs the
filter on the handlers of a logger (the root logger by default), where it sees the records
of every ``wakeful.*`` logger."""

from __future__ import annotations

import logging

from wakeful.telemetry import tracing

TRACE_FORMAT = (
    "%(asctime)s %(levelname)s %(name)s [trace_id=%(trace_id)s span_id=%(span_id)s] %(message)s"
)


class TraceContextFilter(logging.Filter):
    """Adds ``trace_id`` and ``span_id`` to each record (never drops one). A record that
    already carries them (set by an earlier filter or ``extra=``) keeps its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "trace_id", None) is None:
            found = tracing.ids()
            record.trace_id, record.span_id = found if found is not None else ("", "")
        return True


def instrument_logging(
    logger: logging.Logger | None = None, *, format: str | None = None
) -> TraceContextFilter:
    """Install one ``TraceContextFilter`` on every handler of ``logger`` (default: the
    root logger) and, with ``format``, give those handlers that format. Idempotent: a
    handler keeps a filter it already has. Returns the filter (for a handler added later:
    ``handler.addFilter(it)``)."""
    target = logger if logger is not None else logging.getLogger()
    installed = TraceContextFilter()
    for handler in target.handlers:
        existing = [f for f in handler.filters if isinstance(f, TraceContextFilter)]
        if not existing:
            handler.addFilter(installed)
        if format is not None:
            handler.setFormatter(logging.Formatter(format))
    return installed
