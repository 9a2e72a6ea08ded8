"""What a worker records about the work it leases: a span per dispatch attempt that
continues the submitter's trace (from the W3C context ``submit`` stored in the payload),
the queue wait as a span and a histogram, the run's duration by target and outcome, and
the number of dispatches running now."""

from __future__ import annotations

import contextlib
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType

from wakeful import telemetry
from wakeful.clock import Clock
from wakeful.errors import NotFound
from wakeful.fleet.registry import Registry
from wakeful.metrics import Metrics
from wakeful.records import Lease
from wakeful.telemetry import NO_SPAN, SpanLike, StoreCalls


@dataclass
class WorkerStats:
    """What a worker counted (``Worker.stats``)."""

    claimed: int = 0
    done: int = 0
    awaiting: int = 0
    sleeping: int = 0
    """Attempts that ended with their run asleep (``ctx.sleep``), not counted in ``awaiting``."""
    retried: int = 0
    fenced: int = 0
    exhausted: int = 0
    polls: int = 0
    """Completed claim attempts (a test can wait for a worker to have looked)."""


TRACE_FIELD = "trace"
"""The payload field holding the submitter's W3C trace context."""


class Attempt:
    """One worker attempt at a dispatch, observed for as long as it is the ``with`` block
    of ``WorkerObserver.dispatch`` (its span current, counted as running, its duration
    recorded at the end); ``outcome`` is set by the worker when it knows (``done``,
    ``awaiting``, ``retry``, ``fenced``). A plain object rather than a generator's context
    manager: a worker makes one per dispatch."""

    __slots__ = ("_began", "_current", "_metrics", "_target", "outcome", "span")

    def __init__(self, span: SpanLike, metrics: Metrics, target: str) -> None:
        self.span = span
        self.outcome = "error"
        self._metrics = metrics
        self._target = target
        self._began = time.perf_counter()
        self._current: AbstractContextManager[object] | None = None

    def __enter__(self) -> Attempt:
        self._metrics.running.inc()
        self._current = telemetry.use(self.span)
        self._current.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._current is not None:
                self._current.__exit__(kind, exc, tb)
            if exc is not None:
                telemetry.failed(self.span, exc)
        finally:
            self._metrics.running.dec()
            self._metrics.run_seconds.observe(
                time.perf_counter() - self._began, target=self._target, outcome=self.outcome
            )
            self.span.set_attribute("wakeful.dispatch.outcome", self.outcome)
            telemetry.finish(self.span)


def _nanos(moment: datetime) -> int:
    return int(moment.timestamp() * 1e9)


class WorkerObserver:
    """Spans and metrics of one worker's dispatches."""

    def __init__(self, store: object, metrics: Metrics, registry: Registry, clock: Clock) -> None:
        self.metrics = metrics
        self.registry = registry
        self.clock = clock
        self.calls = StoreCalls(store, metrics.commit_seconds)

    def target(self, lease: Lease) -> str:
        """The registered target a dispatch runs (a bounded label), else its kind."""
        payload = lease.dispatch.payload
        named = payload.get("target") if isinstance(payload, dict) else None
        if isinstance(named, str):
            with contextlib.suppress(NotFound):
                return self.registry.get(named).name
        snap = lease.snapshot
        graph = snap.checkpoint.metadata.get("graph") if snap and snap.checkpoint else None
        try:
            return self.registry.for_graph(graph).name
        except NotFound:
            return lease.dispatch.kind

    def dispatch(self, lease: Lease, polled: tuple[int, int]) -> Attempt:
        """The attempt at ``lease`` (leased by a ``claim_next`` that ran from ``polled[0]``
        to ``polled[1]``, in nanoseconds since the epoch), to use as a ``with`` block: its
        span is current for the block."""
        d = lease.dispatch
        payload = d.payload if isinstance(d.payload, dict) else {}
        target = self.target(lease)
        available = d.available_at or d.created_at
        if available is not None:  # by the worker's clock, which the store's should match
            wait = (self.clock.now() - available).total_seconds()
            self.metrics.queue_wait.observe(max(wait, 0.0), kind=d.kind)
        span = self._spans(lease, target, payload.get(TRACE_FIELD), polled)
        return Attempt(span, self.metrics, target)

    def _spans(
        self, lease: Lease, target: str, carrier: object, polled: tuple[int, int]
    ) -> SpanLike:
        """The queue-wait span (enqueue to lease) and the attempt's span, both children
        of the submitter's span when the payload names one; the ``claim_next`` that leased
        it is recorded beneath the attempt (empty polls record no span)."""
        if telemetry.tracer() is None:
            return NO_SPAN
        d = lease.dispatch
        parent = telemetry.extract(carrier)
        attributes: dict[str, str | int] = {
            "wakeful.dispatch.id": d.dispatch_id,
            "wakeful.dispatch.kind": d.kind,
            "wakeful.dispatch.attempt": d.attempts,
            "wakeful.thread.id": d.thread_id,
            "wakeful.target": target,
            "wakeful.claim.token": lease.claim.token,
            "messaging.operation.type": "process",
        }
        available = d.available_at or d.created_at
        if available is not None and _nanos(available) < polled[1]:
            waited = telemetry.start(
                "wakeful.queue.wait",
                {"wakeful.dispatch.id": d.dispatch_id, "wakeful.dispatch.attempt": d.attempts},
                parent=parent,
                start_time=_nanos(available),
            )
            telemetry.finish(waited, end_time=polled[1])
        span = telemetry.start(
            f"wakeful.dispatch {d.kind}",
            attributes,
            kind=telemetry.kind("consumer"),
            parent=parent,
            start_time=polled[0],
        )
        with telemetry.use(span):
            claimed = telemetry.start(
                f"claim_next {self.calls.system}",
                {
                    "db.system": self.calls.system,
                    "db.system.name": self.calls.system,
                    "db.operation.name": "claim_next",
                    "wakeful.outcome": "ok",
                },
                kind=telemetry.kind("client"),
                start_time=polled[0],
            )
            telemetry.finish(claimed, end_time=polled[1])
        return span
