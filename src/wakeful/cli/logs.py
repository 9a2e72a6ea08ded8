"""Logging for every command: ``--log-level`` and ``--log-format text|json`` (also
``WAKEFUL_LOG_LEVEL`` / ``WAKEFUL_LOG_FORMAT``), on stderr, so stdout stays the command's
output.

Text lines read ``2025-01-01T12:00:00.123Z INFO wakeful.fleet: message``; JSON lines are one
object per record with ``at``, ``level``, ``logger``, ``message`` and the record's structured
fields (the worker's ``target``, ``thread``, ``dispatch``, ``attempt``, ``outcome``,
``duration``...)."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

import click

from wakeful.telemetry.logs import TraceContextFilter

LEVELS = ("debug", "info", "warning", "error")
SERVICE_COMMANDS = frozenset({"worker", "relay", "serve", "hand-serve"})
"""Long-running commands log at ``info`` by default (one line per dispatch, ...); the rest
at ``warning``."""

_STANDARD = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}
_NOISY = ("psycopg.pool", "psycopg", "nats", "httpx", "httpcore")
"""Libraries whose own retry chatter duplicates what wakeful reports once; they log only at
``--log-level debug``."""


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields given with ``extra=...``, and the trace and span ids of a record
    written inside a span (``wakeful.telemetry``; absent when tracing is off)."""
    found = {k: v for k, v in vars(record).items() if k not in _STANDARD}
    for name in ("trace_id", "span_id"):
        if not found.get(name):
            found.pop(name, None)
    return found


def _timestamp(record: logging.LogRecord) -> str:
    at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{at}.{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        trace_id = getattr(record, "trace_id", "")
        if trace_id:
            line += f" [trace_id={trace_id} span_id={getattr(record, 'span_id', '')}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "at": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(fields(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure(level: str, fmt: str) -> None:
    """Route every logger to stderr at ``level`` in ``fmt`` (replacing earlier handlers)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(TraceContextFilter())  # a line names the trace it was written in
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    numeric = getattr(logging, level.upper())
    root.setLevel(numeric)
    for name in _NOISY:
        logging.getLogger(name).setLevel(numeric if numeric <= logging.DEBUG else logging.ERROR)
    logging.captureWarnings(True)


def _command_name(ctx: click.Context) -> str:
    names = []
    while ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return "-".join(reversed(names))


def _apply(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    ctx.meta[f"wakeful.{param.name}"] = value
    level = ctx.meta.get("wakeful.log_level")
    fmt = ctx.meta.get("wakeful.log_format")
    if "wakeful.log_level" in ctx.meta and "wakeful.log_format" in ctx.meta:
        if level is None:
            level = "info" if _command_name(ctx) in SERVICE_COMMANDS else "warning"
        configure(level, fmt or "text")
    return value


def logging_options() -> list[click.Option]:
    """The two options every command gets (see ``wakeful.cli.attach_common_options``)."""
    return [
        click.Option(
            ["--log-level"],
            type=click.Choice(LEVELS, case_sensitive=False),
            default=None,
            envvar="WAKEFUL_LOG_LEVEL",
            expose_value=False,
            callback=_apply,
            help="Log level on stderr (default: info for worker, relay and servers, else "
            "warning; $WAKEFUL_LOG_LEVEL).",
        ),
        click.Option(
            ["--log-format"],
            type=click.Choice(["text", "json"]),
            default="text",
            show_default=True,
            envvar="WAKEFUL_LOG_FORMAT",
            expose_value=False,
            callback=_apply,
            help="Log line format: text, or one JSON object per line ($WAKEFUL_LOG_FORMAT).",
        ),
    ]
