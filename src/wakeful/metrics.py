"""Prometheus metrics, hand-written (no dependency): counters with labels and the text
exposition format (version 0.0.4).

``Metrics`` is the one registry of a process. The HTTP layer counts requests, submits,
conflicts and fenced writes; a worker holding the same object counts leases, retries and
stream-checkpoint failures. Gauges (queue depth) are computed at scrape time by the caller
and passed to ``render``. This module imports nothing from the web stack, so a worker can
use it without FastAPI installed; ``serve_metrics`` exposes it from a worker process.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    if not names:
        return ""
    pairs = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True))
    return "{" + pairs + "}"


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class Counter:
    """A monotonically increasing count per label combination. Thread-safe."""

    kind = "counter"

    def __init__(self, name: str, help: str, labels: Iterable[str] = ()) -> None:
        self.name = name
        self.help = help
        self.labels = tuple(labels)
        self._values: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def _key(self, labels: Mapping[str, str]) -> tuple[str, ...]:
        if set(labels) != set(self.labels):
            raise ValueError(f"{self.name} takes labels {self.labels}, got {sorted(labels)}")
        return tuple(str(labels[name]) for name in self.labels)

    def samples(self) -> list[tuple[str, str, float]]:
        with self._lock:
            items = sorted(self._values.items())
        if not items and not self.labels:
            items = [((), 0.0)]
        return [(self.name, _labels(self.labels, key), value) for key, value in items]


class Summary:
    """Observations as ``_sum`` and ``_count`` per label combination (no quantiles)."""

    kind = "summary"

    def __init__(self, name: str, help: str, labels: Iterable[str] = ()) -> None:
        self.name = name
        self.help = help
        self.labels = tuple(labels)
        self._sum = Counter(name + "_sum", help, self.labels)
        self._count = Counter(name + "_count", help, self.labels)

    def observe(self, value: float, **labels: str) -> None:
        self._sum.inc(max(value, 0.0), **labels)
        self._count.inc(1.0, **labels)

    def samples(self) -> list[tuple[str, str, float]]:
        return self._sum.samples() + self._count.samples()


@dataclass(frozen=True)
class Gauge:
    """A value computed at scrape time: ``values`` maps label values to numbers."""

    name: str
    help: str
    labels: tuple[str, ...] = ()
    values: Mapping[tuple[str, ...], float] = field(default_factory=dict)
    kind = "gauge"

    def samples(self) -> list[tuple[str, str, float]]:
        return [
            (self.name, _labels(self.labels, key), value)
            for key, value in sorted(self.values.items())
        ]


class Metrics:
    """The process's counters. Share one instance between the server and a worker."""

    def __init__(self) -> None:
        self._families: dict[str, Counter | Summary] = {}
        self.http_requests = self.counter(
            "wakeful_http_requests_total",
            "HTTP requests by route template, method and status.",
            ("route", "method", "status"),
        )
        self.http_seconds = self.summary(
            "wakeful_http_request_duration_seconds",
            "Time to answer HTTP requests (to the end of the response).",
            ("route", "method"),
        )
        self.submits = self.counter(
            "wakeful_submits_total",
            "Work accepted through the API (start, resume, cancel, message), replays included.",
            ("kind",),
        )
        self.conflicts = self.counter(
            "wakeful_conflicts_total", "Requests answered 409 Conflict, by route.", ("route",)
        )
        self.stale_claims = self.counter(
            "wakeful_stale_claims_total",
            "Fenced writes refused because the claim token was stale (StaleClaim seen).",
        )
        self.leases = self.counter("wakeful_leases_total", "Dispatches leased by workers.")
        self.retries = self.counter(
            "wakeful_retries_total", "Dispatches settled for a retry by workers."
        )
        self.stream_checkpoint_failures = self.counter(
            "wakeful_stream_checkpoint_failures_total",
            "Stream checkpoints that could not be read, written or deleted.",
        )
        self.settles = self.counter(
            "wakeful_settles_total", "Dispatches settled by workers, by outcome.", ("outcome",)
        )
        self.stalled_runs = self.counter(
            "wakeful_stalled_runs_total",
            "Runs whose claim stopped being renewed because they made no progress and were "
            "not waiting for ClaimPolicy.stall_after seconds (another worker takes them over).",
        )
        self.exhausted = self.counter(
            "wakeful_exhausted_total", "Exhausted dispatches terminalised as indeterminate."
        )

    def counter(self, name: str, help: str, labels: Iterable[str] = ()) -> Counter:
        """Register (or return the registered) counter ``name``."""
        existing = self._families.get(name)
        if isinstance(existing, Counter):
            return existing
        if existing is not None:
            raise ValueError(f"{name} is registered as a {existing.kind}")
        made = Counter(name, help, labels)
        self._families[name] = made
        return made

    def summary(self, name: str, help: str, labels: Iterable[str] = ()) -> Summary:
        existing = self._families.get(name)
        if isinstance(existing, Summary):
            return existing
        if existing is not None:
            raise ValueError(f"{name} is registered as a {existing.kind}")
        made = Summary(name, help, labels)
        self._families[name] = made
        return made

    def render(self, gauges: Iterable[Gauge] = ()) -> str:
        """The exposition text of every counter and summary, then ``gauges``."""
        lines: list[str] = []
        families: list[Counter | Summary | Gauge] = [*self._families.values(), *gauges]
        for family in families:
            lines.append(f"# HELP {family.name} {_escape(family.help)}")
            lines.append(f"# TYPE {family.name} {family.kind}")
            for name, labels, value in family.samples():
                lines.append(f"{name}{labels} {_number(value)}")
        return "\n".join(lines) + "\n"


async def serve_metrics(metrics: Metrics, host: str, port: int) -> asyncio.Server:
    """A minimal HTTP endpoint answering ``GET /metrics`` (for worker processes, which run
    no web framework). Close the returned server to stop it."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            ok = request.split(b" ")[:2] == [b"GET", b"/metrics"]
            body = metrics.render().encode() if ok else b"not found\n"
            status = b"200 OK" if ok else b"404 Not Found"
            kind = CONTENT_TYPE.encode() if ok else b"text/plain"
            writer.write(
                b"HTTP/1.0 "
                + status
                + b"\r\nContent-Type: "
                + kind
                + b"\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)


__all__ = ["CONTENT_TYPE", "Counter", "Gauge", "Metrics", "Summary", "serve_metrics"]
