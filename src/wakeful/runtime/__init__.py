"""The graph runtime: supersteps under fenced claims, durability modes, recovery,
interrupts and subscriptions."""

from wakeful.runtime.children import ChildOutcome, ChildRun
from wakeful.runtime.claims import ClaimPolicy
from wakeful.runtime.context import NodeContext, Ticket
from wakeful.runtime.events import LiveEvent
from wakeful.runtime.graph import (
    END,
    START,
    CompiledGraph,
    Graph,
    RetryPolicy,
    Send,
    append,
    replace,
)
from wakeful.runtime.handle import RunHandle
from wakeful.runtime.history import (
    CheckpointView,
    HistoryEntry,
    checkpoint_at,
    fork,
    history,
    messages_at,
)
from wakeful.runtime.results import RunOutcome
from wakeful.runtime.runtime import Runtime

__all__ = [
    "END",
    "START",
    "CheckpointView",
    "ChildOutcome",
    "ChildRun",
    "ClaimPolicy",
    "CompiledGraph",
    "Graph",
    "HistoryEntry",
    "LiveEvent",
    "NodeContext",
    "RetryPolicy",
    "RunHandle",
    "RunOutcome",
    "Runtime",
    "Send",
    "Ticket",
    "append",
    "checkpoint_at",
    "fork",
    "history",
    "messages_at",
    "replace",
]
