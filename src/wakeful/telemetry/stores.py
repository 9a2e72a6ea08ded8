"""One wrapper for the store writes the runtime and the worker make (commit,
claim_and_commit, claim_next, settle): a client span with the backend (``db.system``) and
the outcome (``ok`` or the refusal, e.g. ``StaleClaim``), and the write's latency in a
histogram by store and operation.

It wraps the call sites, not the backends, so every store (a third party's too) is
observed the same way. With tracing off and no histogram it only awaits the call.

A write's span is a leaf: it is not made the current span while the write runs (no context
attach and detach, about 4 % of what a traced run adds). A log line written by a store during
the write carries the span around the write (the superstep's or the run's), and a database
driver's own instrumentation, if any, records its spans beside the write's rather than
beneath it."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from wakeful.telemetry import tracing

T = TypeVar("T")

_SYSTEMS = {
    "memory": "memory",
    "file": "file",
    "sqlite": "sqlite",
    "postgres": "postgresql",
}
_by_type: dict[type, str] = {}
_CLIENT: Any = tracing.kind("client")


class Observe(Protocol):
    """A histogram: ``observe(seconds, store=..., operation=...)``."""

    def observe(self, value: float, **labels: str) -> None: ...


def db_system(store: object) -> str:
    """The backend's name for ``db.system``: ``postgresql``, ``sqlite``, ``file``,
    ``memory``, or the store class's module for a store wakeful does not ship."""
    cls = type(store)
    known = _by_type.get(cls)
    if known is not None:
        return known
    name = cls.__module__
    for base in cls.__mro__:  # a subclass of a shipped store (a test's fault injector)
        parts = base.__module__.split(".")
        if parts[:2] == ["wakeful", "store"] and len(parts) > 2:
            name = _SYSTEMS.get(parts[2], parts[2])
            break
    _by_type[cls] = name
    return name


class StoreCalls:
    """Observes the writes to one store. ``seconds``: the latency histogram (labels
    ``store`` and ``operation``), or ``None`` to record spans only."""

    __slots__ = ("seconds", "system")

    def __init__(self, store: object, seconds: Observe | None = None) -> None:
        self.system = db_system(store)
        self.seconds = seconds

    async def __call__(
        self,
        operation: str,
        call: Callable[[], Awaitable[T]],
        thread_id: str | None = None,
    ) -> T:
        """Await ``call()`` (one store write named ``operation``) timed by its span."""
        t = tracing.tracer()
        if t is None and self.seconds is None:
            return await call()
        started = time.perf_counter()
        try:
            if t is None:
                return await call()
            attributes = {
                "db.system": self.system,
                "db.system.name": self.system,
                "db.operation.name": operation,
            }
            if thread_id is not None:
                attributes["wakeful.thread.id"] = thread_id
            span: Any = t.start_span(
                f"{operation} {self.system}",
                kind=_CLIENT,
                attributes=attributes,
                record_exception=False,
                set_status_on_exception=False,
            )
            try:
                result = await call()
            except BaseException as exc:
                span.set_attribute("wakeful.outcome", type(exc).__name__)
                tracing.failed(span, exc)
                span.end()
                raise
            span.set_attribute("wakeful.outcome", "ok")
            span.end()
            return result
        finally:
            if self.seconds is not None:
                self.seconds.observe(
                    time.perf_counter() - started, store=self.system, operation=operation
                )

    async def timed(self, operation: str, call: Callable[[], Awaitable[T]]) -> T:
        """Await ``call()`` recording its latency only, no span: for a call that mostly
        finds nothing (a worker's poll), whose span is recorded only when it found work."""
        if self.seconds is None:
            return await call()
        started = time.perf_counter()
        try:
            return await call()
        finally:
            self.seconds.observe(
                time.perf_counter() - started, store=self.system, operation=operation
            )
