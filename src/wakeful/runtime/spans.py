"""The runtime's spans: one per run attempt, per superstep and per task, with the store
writes beneath them (see ``docs/observability.md``).

A run attempt's W3C trace context is stored in the checkpoints it commits (metadata key
``trace``, only while tracing is on), so a process that recovers the run after a crash
starts its attempt with a link to the crashed one."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from wakeful import telemetry
from wakeful.telemetry import NO_SPAN, SpanLike, StoreCalls

if TYPE_CHECKING:
    from wakeful.metrics import Metrics

T = TypeVar("T")

TRACE_KEY = "trace"
"""The checkpoint metadata key holding the trace context of the attempt that wrote it."""


def begin_run(operation: str, thread_id: str, graph: str, run_id: str | None = None) -> SpanLike:
    """Start (not current) the span of one run attempt: ``start``, ``resume`` or
    ``recover``. ``NO_SPAN`` while tracing is off."""
    if telemetry.tracer() is None:
        return NO_SPAN
    attributes = {
        "wakeful.run.operation": operation,
        "wakeful.thread.id": thread_id,
        "wakeful.graph": graph,
    }
    if run_id is not None:
        attributes["wakeful.run.id"] = run_id
    return telemetry.start(f"wakeful.run {graph}", attributes)


def link_crashed(attempt: SpanLike, metadata: Any) -> None:
    """Link a recovering attempt to the attempt that wrote the checkpoint it recovers."""
    if attempt is NO_SPAN or not isinstance(metadata, dict):
        return
    found = telemetry.link(metadata.get(TRACE_KEY), {"wakeful.link": "recovered_from"})
    if found is not None:
        attempt.add_link(found.context, found.attributes)  # type: ignore[attr-defined]


def traced_metadata(metadata: dict[str, Any], trace: dict[str, str]) -> dict[str, Any]:
    """``metadata`` naming the current attempt's trace (unchanged while tracing is off)."""
    return {**metadata, TRACE_KEY: trace} if trace else metadata


def store_calls(store: object, metrics: Metrics | None) -> StoreCalls | None:
    """The store-write observer of a run, or ``None`` (plain calls) when there is nothing
    to record: tracing off and no metrics."""
    seconds = metrics.commit_seconds if metrics is not None else None
    if seconds is None and telemetry.tracer() is None:
        return None
    return StoreCalls(store, seconds)


def _task_attributes(entry: dict[str, Any], step: int, reused: bool) -> dict[str, Any]:
    return {
        "wakeful.task.id": entry["id"],
        "wakeful.node": entry["node"],
        "wakeful.step": step,
        "wakeful.task.reused": reused,
    }


def task_span(entry: dict[str, Any], step: int) -> Any:
    """The span of one task of a traced run (a ``with`` target)."""
    return telemetry.span(f"wakeful.task {entry['node']}", _task_attributes(entry, step, False))


def reused_task(entry: dict[str, Any], step: int) -> None:
    """A zero-length span for a task whose recorded result a recovery reuses."""
    name = f"wakeful.task {entry['node']}"
    telemetry.finish(telemetry.start(name, _task_attributes(entry, step, True)))


def step_span(step: int, tasks: int) -> Any:
    """The span of one superstep of a traced run (a ``with`` target)."""
    return telemetry.span(
        f"wakeful.superstep {step}", {"wakeful.step": step, "wakeful.step.tasks": tasks}
    )


async def in_attempt(
    attempt: SpanLike, run: Callable[[], Awaitable[T]], status: Callable[[], str]
) -> T:
    """Await ``run()`` with ``attempt`` current, then end the span with the run's
    ``status()`` (failed only when the run failed or was fenced)."""
    ended: BaseException | None = None
    with telemetry.use(attempt):
        try:
            return await run()
        except BaseException as exc:
            ended = exc
            raise
        finally:
            attempt.set_attribute("wakeful.run.status", status())
            telemetry.finish(attempt, ended if status() in ("failed", "fenced") else None)
