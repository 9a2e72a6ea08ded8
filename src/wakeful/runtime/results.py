"""What a run produces: ``RunOutcome`` (how it ended or paused), and what each task
returns to the superstep (``TaskResult``); ``frontier_entries`` names a superstep's tasks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgspec

from wakeful.records import (
    Checkpoint,
    EventDraft,
    Message,
    OutboxEntry,
    PendingWrite,
    RunStatus,
)
from wakeful.runtime.context import Ticket
from wakeful.runtime.spans import traced_metadata

if TYPE_CHECKING:
    from wakeful.runtime.graph import TaskSpec


class RunOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How a run ended (or paused), as ``await handle.result()`` returns it.

    - ``status == "completed"``: ``state`` is the graph's final state (the state type's JSON
      form: a dict for a dict or Struct state), e.g. ``outcome.state["answer"]``.
    - ``status == "suspended"``: ``tickets`` are the questions the run waits on; answer them
      with ``Runtime.resume(thread_id, graph, {ticket.id: answer})``.

    Failed, cancelled and fenced runs do not return an outcome: ``result()`` raises
    ``RunFailed``, ``RunCancelled`` or ``CheckpointWriteFailed``. An agent's run returns an
    ``AgentReply`` instead, whose ``text`` is the final answer."""

    thread_id: str
    run_id: str
    status: RunStatus
    state: Any
    tickets: tuple[Ticket, ...] = ()
    wake_at: datetime | None = None
    """A run asleep (``ctx.sleep``): when it wakes. Its status is ``suspended``, its
    tickets the sleeps, which the wake-up answers."""

    def __repr__(self) -> str:
        # The state can be a whole conversation: show its shape, not its contents.
        if isinstance(self.state, dict):
            keys = [f"{k!r}: ..." for k in list(self.state)[:8]]
            shape = "{" + ", ".join(keys) + (", ...}" if len(self.state) > 8 else "}")
        else:
            shape = type(self.state).__name__
        waits = f", tickets={[t.id for t in self.tickets]!r}" if self.tickets else ""
        return (
            f"RunOutcome(status={self.status!r}, thread_id={self.thread_id!r}, "
            f"run_id={self.run_id!r}, state={shape}{waits})"
        )


def successor(
    cp: Checkpoint,
    status: RunStatus,
    state: Any,
    frontier: list[Any],
    messages: int,
    now: datetime,
    trace: dict[str, str],
    meta: dict[str, Any],
) -> Checkpoint:
    """The run's checkpoint after ``cp``. Its metadata records the message count as of it
    (``messages``) and the nodes whose tasks produced it (``cp``'s frontier): time travel
    reads both (docs/time-travel.md). ``meta["subgraphs"]``, when not empty, records what
    ran inside the subgraph nodes of that superstep, by node path."""
    ordinal = int(cp.metadata.get("ordinal", 0)) + 1
    metadata = {
        **cp.metadata,
        "ordinal": ordinal,
        "answers": {},
        "tickets": [],
        "source": "loop",
        "nodes": list(dict.fromkeys(str(e["node"]) for e in cp.frontier)),
        "messages": messages,
        **meta,
    }
    if not meta.get("subgraphs"):  # a record of its own superstep only, never inherited
        metadata.pop("subgraphs", None)
    if trace:
        metadata = traced_metadata(metadata, trace)
    return Checkpoint(
        id=f"{cp.run_id}-c{ordinal}",
        parent=cp.id,
        run_id=cp.run_id,
        status=status,
        state=state,
        created_at=now,
        tenant=cp.tenant,
        frontier=frontier,
        metadata=metadata,
    )


def frontier_entries(step: int, tasks: list[TaskSpec]) -> list[dict[str, Any]]:
    return [
        {"id": f"s{step}-t{i}", "node": t.node, "arg": t.arg, "sent": t.sent}
        for i, t in enumerate(tasks)
    ]


@dataclass
class TaskResult:
    entry: dict[str, Any]
    updates: dict[str, Any] | None = None
    tickets: tuple[Ticket, ...] = ()
    carry: tuple[PendingWrite, ...] = ()
    """Writes the suspended checkpoint carries for this interrupted task (a subgraph's)."""
    error: str | None = None
    transient: bool = False
    """The error is retryable (a ``WakefulError`` with ``retryable``): do not fail the run."""
    events: tuple[EventDraft, ...] = ()
    """Events of a result that was not committed on its own (they go with the barrier)."""
    messages: tuple[Message, ...] = ()
    outbox: tuple[OutboxEntry, ...] = ()
    callbacks: tuple[Callable[[], Awaitable[None]], ...] = ()
    subgraphs: dict[str, Any] = field(default_factory=dict)
    """For a subgraph node: what ran inside it, by node path (checkpoint metadata)."""


def task_value(result: TaskResult) -> dict[str, Any]:
    """A finished task's pending write value: its updates (and its subgraphs' record)."""
    if result.subgraphs:
        return {"updates": result.updates, "subgraphs": result.subgraphs}
    return {"updates": result.updates}


def reused(entry: dict[str, Any], write: PendingWrite) -> TaskResult:
    """The result of a task an earlier attempt finished, from its pending write."""
    value = write.value
    return TaskResult(
        entry, updates=value.get("updates") or {}, subgraphs=value.get("subgraphs") or {}
    )


__all__ = ["RunOutcome", "TaskResult", "frontier_entries"]
