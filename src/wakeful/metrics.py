"""Prometheus metrics through ``prometheus-client``: counters, histograms and gauges with
labels, process metrics, the text exposition format, and its multiprocess mode.

``Metrics`` is the set of a process's metrics, in a registry of its own (so two ``Metrics``
never clash). The HTTP layer counts requests, submits and conflicts; a worker holding the
same object counts leases, settles, retries, queue wait and run durations, and its runtime
and agents record store-write latency, model and tool timings. Worker metrics are registered
on first use or by a ``Worker`` (``Metrics.register_worker``), so a server alone does not
show them. Scrape-time gauges (queue depth, live workers) are computed by the caller and
passed to ``render``.

Multiprocess mode: with ``PROMETHEUS_MULTIPROC_DIR`` set (before the first ``Metrics`` is
made) every process writes its values to files there and ``render`` aggregates the files of
all processes, as ``prometheus_client.multiprocess`` documents; see
``docs/observability.md``. ``prometheus_client`` is imported when the first ``Metrics`` is
made, so importing this module stays cheap."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

log = logging.getLogger("wakeful.metrics")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
F = TypeVar("F", bound="_Family")
_PASSED_MAX = 1024
"""Label sets remembered per metric as passed, at most (then forgotten and learnt again)."""

FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Buckets (seconds) for store writes and HTTP requests."""
SLOW = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
"""Buckets (seconds) for queue waits, runs and tools."""
FIRST_TOKEN = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)
TOKEN_RATE = (1.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1280.0)


def multiprocess() -> bool:
    """Whether ``prometheus_client`` runs in multiprocess mode in this process."""
    return bool(os.environ.get(MULTIPROC_ENV))


class _Family:
    """A ``prometheus_client`` metric registered in ``registry`` (default: a registry of
    its own), called with labels as keywords."""

    kind = "untyped"

    def __init__(
        self,
        name: str,
        help: str,
        labels: Iterable[str] = (),
        *,
        registry: Any = None,
        **options: Any,
    ) -> None:
        from prometheus_client import CollectorRegistry

        self.name = name
        self.help = help
        self.labels = tuple(labels)
        self._registry = registry if registry is not None else CollectorRegistry()
        self._metric = self._make(name, help, self.labels, self._registry, **options)
        self._children: dict[tuple[str, ...], Any] = {}
        self._passed: dict[tuple[tuple[str, Any], ...], Any] = {}
        """The child of each set of labels as a call passed them (a worker records about 8
        labelled values per dispatch: one dictionary lookup each, decision 0022)."""
        self._names = frozenset(self.labels)

    @staticmethod
    def _make(name: str, help: str, labels: tuple[str, ...], registry: Any, **options: Any) -> Any:
        raise NotImplementedError

    def _child(self, labels: Mapping[str, str]) -> Any:
        if not self.labels:
            if labels:
                raise ValueError(f"{self.name} takes no labels, got {sorted(labels)}")
            return self._metric
        passed = tuple(labels.items())  # names and values, in the caller's order
        try:
            return self._passed[passed]
        except KeyError:
            pass
        except TypeError:  # a value that cannot be hashed: named by its str(), as always
            return self._checked(labels)
        child = self._checked(labels)
        # only string values are remembered: 1 == True, but they name two children
        if all(type(value) is str for value in labels.values()):
            if len(self._passed) >= _PASSED_MAX:
                self._passed.clear()
            self._passed[passed] = child
        return child

    def _checked(self, labels: Mapping[str, str]) -> Any:
        if labels.keys() != self._names:
            raise ValueError(f"{self.name} takes labels {self.labels}, got {sorted(labels)}")
        key = tuple([str(labels[name]) for name in self.labels])
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._metric.labels(*key)
        return child

    def _sample(self, suffix: str, labels: Mapping[str, str]) -> float:
        self._child(labels)  # checks the label names
        found = self._registry.get_sample_value(self.name + suffix, dict(labels))
        return float(found or 0.0)


class Counter(_Family):
    """A monotonically increasing count per label combination. Thread-safe."""

    kind = "counter"

    @staticmethod
    def _make(name: str, help: str, labels: tuple[str, ...], registry: Any, **options: Any) -> Any:
        from prometheus_client import Counter as PromCounter

        return PromCounter(name, help, labels, registry=registry, **options)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        self._child(labels).inc(amount)

    def value(self, **labels: str) -> float:
        """This process's count for ``labels``."""
        return self._sample("", labels)


class Histogram(_Family):
    """Observations in ``buckets``, with ``_sum`` and ``_count``, per label combination."""

    kind = "histogram"

    @staticmethod
    def _make(name: str, help: str, labels: tuple[str, ...], registry: Any, **options: Any) -> Any:
        from prometheus_client import Histogram as PromHistogram

        return PromHistogram(name, help, labels, registry=registry, **options)

    def observe(self, value: float, **labels: str) -> None:
        self._child(labels).observe(max(value, 0.0))

    def count(self, **labels: str) -> float:
        """This process's number of observations for ``labels``."""
        return self._sample("_count", labels)


class Summary(Histogram):
    """Kept for compatibility: a histogram (its ``_sum`` and ``_count`` are as before)."""


@dataclass(frozen=True)
class Gauge:
    """A value computed at scrape time: ``values`` maps label values to numbers."""

    name: str
    help: str
    labels: tuple[str, ...] = ()
    values: Mapping[tuple[str, ...], float] = field(default_factory=dict)
    kind = "gauge"


class LiveGauge(_Family):
    """A gauge this process sets (in multiprocess mode: summed over live processes)."""

    kind = "gauge"

    @staticmethod
    def _make(name: str, help: str, labels: tuple[str, ...], registry: Any, **options: Any) -> Any:
        from prometheus_client import Gauge as PromGauge

        return PromGauge(name, help, labels, registry=registry, multiprocess_mode="livesum")

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self._child(labels).inc(amount)

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        self._child(labels).dec(amount)

    def value(self, **labels: str) -> float:
        return self._sample("", labels)


class _WorkerMetric(Generic[F]):
    """A metric of worker processes, defined on ``Metrics`` but registered on its first
    use (or by ``Metrics.register_worker``): a server's ``/metrics`` then shows no lease,
    settle or run counters it never counts. The registered family replaces this descriptor
    in the instance's ``__dict__``, so later reads cost an attribute lookup."""

    def __init__(
        self, family: type[F], name: str, help: str, labels: Iterable[str] = (), **options: Any
    ) -> None:
        self.family, self.name, self.help = family, name, help
        self.labels, self.options = tuple(labels), options
        self.attr = name

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _WorkerMetric[F]: ...
    @overload
    def __get__(self, obj: Metrics, owner: type | None = None) -> F: ...
    def __get__(self, obj: Metrics | None, owner: type | None = None) -> F | _WorkerMetric[F]:
        if obj is None:
            return self
        made = obj._register(self.family, self.name, self.help, self.labels, **self.options)
        obj.__dict__[self.attr] = made
        return made


class Metrics:
    """The process's metrics. Share one instance between the server and a worker.

    The HTTP layer's metrics (and fenced writes, which both count) are registered at once;
    a worker's (leases, settles, retries, queue wait, runs, store writes, model and tool
    timings) on first use, and all of them when a ``Worker`` is made
    (``register_worker``): a process's scrape lists what it counts, not what other kinds
    of process do."""

    leases = _WorkerMetric(Counter, "wakeful_leases_total", "Dispatches leased by workers.")
    retries = _WorkerMetric(
        Counter, "wakeful_retries_total", "Dispatches settled for a retry by workers."
    )
    stream_checkpoint_failures = _WorkerMetric(
        Counter,
        "wakeful_stream_checkpoint_failures_total",
        "Stream checkpoints that could not be read, written or deleted.",
    )
    settles = _WorkerMetric(
        Counter,
        "wakeful_settles_total",
        "Dispatches settled by workers, by outcome.",
        ("outcome",),
    )
    stalled_runs = _WorkerMetric(
        Counter,
        "wakeful_stalled_runs_total",
        "Runs whose claim stopped being renewed because they made no progress and were "
        "not waiting for ClaimPolicy.stall_after seconds (another worker takes them over).",
    )
    exhausted = _WorkerMetric(
        Counter,
        "wakeful_exhausted_total",
        "Exhausted dispatches terminalised as indeterminate.",
    )
    commit_seconds = _WorkerMetric(
        Histogram,
        "wakeful_store_write_duration_seconds",
        "Store writes (commit, claim_and_commit, claim_next, settle) by store and operation.",
        ("store", "operation"),
        buckets=FAST,
    )
    queue_wait = _WorkerMetric(
        Histogram,
        "wakeful_queue_wait_seconds",
        "From a dispatch becoming available (enqueue, or a retry's due time) to its lease.",
        ("kind",),
        buckets=SLOW,
    )
    run_seconds = _WorkerMetric(
        Histogram,
        "wakeful_run_duration_seconds",
        "One worker attempt at a dispatch, lease to settle, by target and outcome.",
        ("target", "outcome"),
        buckets=SLOW,
    )
    first_token = _WorkerMetric(
        Histogram,
        "wakeful_model_time_to_first_token_seconds",
        "From sending a model request to its first streamed delta.",
        ("model",),
        buckets=FIRST_TOKEN,
    )
    token_rate = _WorkerMetric(
        Histogram,
        "wakeful_model_output_tokens_per_second",
        "Output tokens per second of a model turn (first delta to end).",
        ("model",),
        buckets=TOKEN_RATE,
    )
    model_retries = _WorkerMetric(
        Counter,
        "wakeful_model_retries_total",
        "Model stream failures retried or recovered, by error kind.",
        ("model", "kind"),
    )
    recoveries = _WorkerMetric(
        Counter,
        "wakeful_stream_recoveries_total",
        "Stream recovery plans used (retry, R1-R4, resumed).",
        ("kind",),
    )
    tool_seconds = _WorkerMetric(
        Histogram,
        "wakeful_tool_duration_seconds",
        "Tool calls that ran, by tool and outcome.",
        ("tool", "outcome"),
        buckets=SLOW,
    )
    limit_waits = _WorkerMetric(
        Counter,
        "wakeful_limit_waits_total",
        "Model calls that waited for their rate-limit bucket, by key.",
        ("key",),
    )
    limit_blocks = _WorkerMetric(
        Counter,
        "wakeful_limit_blocks_total",
        "Provider rate-limit refusals (429) that blocked a key for the fleet, by key.",
        ("key",),
    )
    webhooks = _WorkerMetric(
        Counter,
        "wakeful_webhook_attempts_total",
        "Webhook delivery attempts recorded by workers, by outcome: delivered, failed (to be "
        "retried) or dead (given up, or refused).",
        ("outcome",),
    )
    running = _WorkerMetric(
        LiveGauge,
        "wakeful_worker_running_dispatches",
        "Dispatches this worker process is running now (its live leases).",
    )

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry(auto_describe=True)
        self._families: dict[str, _Family] = {}
        if not multiprocess():  # process metrics are per process: not aggregable
            from prometheus_client import PlatformCollector, ProcessCollector

            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
        self._define()

    def _define(self) -> None:
        c, h = self.counter, self.histogram
        self.http_requests = c(
            "wakeful_http_requests_total",
            "HTTP requests by route template, method and status.",
            ("route", "method", "status"),
        )
        self.http_seconds = h(
            "wakeful_http_request_duration_seconds",
            "Time to answer HTTP requests (to the end of the response).",
            ("route", "method"),
            FAST,
        )
        self.submits = c(
            "wakeful_submits_total",
            "Work accepted through the API (start, resume, cancel, message), replays included.",
            ("kind",),
        )
        self.conflicts = c(
            "wakeful_conflicts_total", "Requests answered 409 Conflict, by route.", ("route",)
        )
        self.stale_claims = c(
            "wakeful_stale_claims_total",
            "Fenced writes refused because the claim token was stale (StaleClaim seen).",
        )
        self.quarantines = c("wakeful_quarantines_total", "Dispatches quarantined by an operator.")

    def register_worker(self) -> None:
        """Register every worker metric now, at zero, so that a worker's ``/metrics`` lists
        them before their first use (``Worker`` calls it; idempotent)."""
        for name, value in vars(Metrics).items():
            if isinstance(value, _WorkerMetric):
                getattr(self, name)

    def _register(
        self, family: type[F], name: str, help: str, labels: Iterable[str], **options: Any
    ) -> F:
        existing = self._families.get(name)
        if existing is not None:
            if type(existing) is not family:
                raise ValueError(f"{name} is registered as a {existing.kind}")
            return existing
        made = family(name, help, labels, registry=self.registry, **options)
        self._families[name] = made
        return made

    def counter(self, name: str, help: str, labels: Iterable[str] = ()) -> Counter:
        """Register (or return the registered) counter ``name``."""
        return self._register(Counter, name, help, labels)

    def histogram(
        self, name: str, help: str, labels: Iterable[str] = (), buckets: Iterable[float] = FAST
    ) -> Histogram:
        """Register (or return the registered) histogram ``name``."""
        return self._register(Histogram, name, help, labels, buckets=tuple(buckets))

    def summary(self, name: str, help: str, labels: Iterable[str] = ()) -> Histogram:
        """Kept for compatibility: registers a histogram (it has ``_sum`` and ``_count``)."""
        return self.histogram(name, help, labels)

    def live_gauge(self, name: str, help: str, labels: Iterable[str] = ()) -> LiveGauge:
        """Register (or return) a gauge this process sets; summed over live processes in
        multiprocess mode."""
        return self._register(LiveGauge, name, help, labels)

    def render(self, gauges: Iterable[Gauge] = ()) -> str:
        """The exposition text of every metric (of every process in multiprocess mode),
        then the scrape-time ``gauges``."""
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.core import GaugeMetricFamily

        source = self.registry
        if multiprocess():
            from prometheus_client.multiprocess import MultiProcessCollector

            source = CollectorRegistry()
            MultiProcessCollector(source)  # type: ignore[no-untyped-call]
        text = generate_latest(source).decode()
        computed = list(gauges)
        if not computed:
            return text

        class _Computed:
            def collect(self) -> Iterable[Any]:
                for gauge in computed:
                    family = GaugeMetricFamily(gauge.name, gauge.help, labels=gauge.labels)
                    for key, value in sorted(gauge.values.items()):
                        family.add_metric(list(key), value)
                    yield family

        extra = CollectorRegistry(auto_describe=False)
        extra.register(_Computed())
        return text + generate_latest(extra).decode()


async def serve_metrics(metrics: Metrics, host: str, port: int) -> asyncio.Server:
    """A minimal HTTP endpoint answering ``GET /metrics`` (for worker processes, which run
    no web framework), served from the event loop (no thread). Logs one INFO line with its
    URL (``wakeful.metrics``; port 0 shows the port bound). Close the returned server to
    stop it."""

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

    server = await asyncio.start_server(handle, host, port)
    bound = server.sockets[0].getsockname()[1] if server.sockets else port
    shown = f"[{host}]" if ":" in host else host
    log.info(
        "serving metrics at http://%s:%d/metrics",
        shown,
        bound,
        extra={"url": f"http://{shown}:{bound}/metrics"},
    )
    return server


__all__ = [
    "CONTENT_TYPE",
    "Counter",
    "Gauge",
    "Histogram",
    "LiveGauge",
    "Metrics",
    "Summary",
    "multiprocess",
    "serve_metrics",
]
