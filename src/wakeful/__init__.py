"""wakeful: a durable runtime for LLM agents.

Every run executes under a fenced claim on its thread and records its progress as atomic
commits to a store, so a crashed or paused process never loses committed work, never records
it twice, and never lets a stale process write.

What a user types first is here: ``open_store``, ``Graph``/``START``/``END``, ``Runtime``
and ``ClaimPolicy``, ``Agent`` and ``tool``, ``Worker`` and ``Registry``, ``submit``,
``resume``, ``cancel``, ``send_message`` and every error class. The runtime, agent and fleet
names are imported on first use, so ``import wakeful`` loads only the records, the errors and
the store opener; their subpackage paths (``wakeful.runtime.Runtime``...) stay valid.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from wakeful.clock import Clock, ManualClock, SystemClock
from wakeful.errors import (
    CheckpointWriteFailed,
    ChildFailed,
    CorruptStore,
    DispatchConflict,
    GraphChanged,
    GraphInvalid,
    InvalidCommit,
    InvalidInput,
    InvalidState,
    NotFound,
    NothingToRecover,
    NotSuspended,
    OperationConflict,
    OutcomeUnknown,
    ReplayUnavailable,
    RequestRefused,
    RunCancelled,
    RunFailed,
    RunInProgress,
    RunInterrupted,
    RunStalled,
    RunYielded,
    ScheduleContended,
    StaleClaim,
    StoreClosed,
    StoreLocked,
    StoreRefused,
    StoreUnavailable,
    StreamCheckpointError,
    TenantMismatch,
    ThreadBusy,
    UnknownTicket,
    UnsupportedStore,
    VersionConflict,
    WakefulError,
    WorkerSuperseded,
)
from wakeful.records import (
    Awaiting,
    Branch,
    Checkpoint,
    CheckpointEntry,
    Claim,
    Commit,
    Dispatch,
    Done,
    Event,
    EventDraft,
    InboxMessage,
    Lease,
    Message,
    OutboxEntry,
    PendingWrite,
    PruneReport,
    Receipt,
    RetentionPolicy,
    Retry,
    RunSegment,
    Schedule,
    Settle,
    StreamCheckpoint,
    ThreadSnapshot,
    ThreadSummary,
    WorkerIdentity,
    WorkerInfo,
)
from wakeful.store import open_store
from wakeful.store.contract import Store

if TYPE_CHECKING:
    from wakeful.agent import Agent, AgentReply, tool
    from wakeful.client import Client, SyncClient
    from wakeful.fleet import Registry, Worker
    from wakeful.fleet.client import cancel, resume, send_message, submit
    from wakeful.fleet.hand import (
        HandConflict,
        HandError,
        HandIndeterminate,
        HandOutcomeUnknown,
        HandRejected,
        HandUnavailable,
        UnknownTool,
    )
    from wakeful.fleet.schedules import fire_due, schedule
    from wakeful.providers.base import ProviderError
    from wakeful.runtime import (
        END,
        START,
        ClaimPolicy,
        Graph,
        RunHandle,
        RunOutcome,
        Runtime,
        Send,
    )
    from wakeful.runtime.history import (
        CheckpointView,
        HistoryEntry,
        checkpoint_at,
        fork,
        history,
        messages_at,
    )

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "END": "wakeful.runtime",
    "START": "wakeful.runtime",
    "ClaimPolicy": "wakeful.runtime",
    "Graph": "wakeful.runtime",
    "RunHandle": "wakeful.runtime",
    "RunOutcome": "wakeful.runtime",
    "Runtime": "wakeful.runtime",
    "Send": "wakeful.runtime",
    "CheckpointView": "wakeful.runtime.history",
    "HistoryEntry": "wakeful.runtime.history",
    "checkpoint_at": "wakeful.runtime.history",
    "fork": "wakeful.runtime.history",
    "history": "wakeful.runtime.history",
    "messages_at": "wakeful.runtime.history",
    "Agent": "wakeful.agent",
    "Client": "wakeful.client",
    "SyncClient": "wakeful.client",
    "AgentReply": "wakeful.agent",
    "tool": "wakeful.agent",
    "Registry": "wakeful.fleet",
    "Worker": "wakeful.fleet",
    "cancel": "wakeful.fleet.client",
    "resume": "wakeful.fleet.client",
    "send_message": "wakeful.fleet.client",
    "submit": "wakeful.fleet.client",
    "schedule": "wakeful.fleet.schedules",
    "fire_due": "wakeful.fleet.schedules",
    "ProviderError": "wakeful.providers.base",
    "HandConflict": "wakeful.fleet.hand",
    "HandError": "wakeful.fleet.hand",
    "HandIndeterminate": "wakeful.fleet.hand",
    "HandOutcomeUnknown": "wakeful.fleet.hand",
    "HandRejected": "wakeful.fleet.hand",
    "HandUnavailable": "wakeful.fleet.hand",
    "UnknownTool": "wakeful.fleet.hand",
}
"""Names imported on first access, and the module each comes from."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'wakeful' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "END",
    "START",
    "Agent",
    "AgentReply",
    "Awaiting",
    "Branch",
    "Checkpoint",
    "CheckpointEntry",
    "CheckpointView",
    "CheckpointWriteFailed",
    "ChildFailed",
    "Claim",
    "ClaimPolicy",
    "Client",
    "Clock",
    "Commit",
    "CorruptStore",
    "Dispatch",
    "DispatchConflict",
    "Done",
    "Event",
    "EventDraft",
    "Graph",
    "GraphChanged",
    "GraphInvalid",
    "HandConflict",
    "HandError",
    "HandIndeterminate",
    "HandOutcomeUnknown",
    "HandRejected",
    "HandUnavailable",
    "HistoryEntry",
    "InboxMessage",
    "InvalidCommit",
    "InvalidInput",
    "InvalidState",
    "Lease",
    "ManualClock",
    "Message",
    "NotFound",
    "NotSuspended",
    "NothingToRecover",
    "OperationConflict",
    "OutboxEntry",
    "OutcomeUnknown",
    "PendingWrite",
    "ProviderError",
    "PruneReport",
    "Receipt",
    "Registry",
    "ReplayUnavailable",
    "RequestRefused",
    "RetentionPolicy",
    "Retry",
    "RunCancelled",
    "RunFailed",
    "RunHandle",
    "RunInProgress",
    "RunInterrupted",
    "RunOutcome",
    "RunSegment",
    "RunStalled",
    "RunYielded",
    "Runtime",
    "Schedule",
    "ScheduleContended",
    "Send",
    "Settle",
    "StaleClaim",
    "Store",
    "StoreClosed",
    "StoreLocked",
    "StoreRefused",
    "StoreUnavailable",
    "StreamCheckpoint",
    "StreamCheckpointError",
    "SyncClient",
    "SystemClock",
    "TenantMismatch",
    "ThreadBusy",
    "ThreadSnapshot",
    "ThreadSummary",
    "UnknownTicket",
    "UnknownTool",
    "UnsupportedStore",
    "VersionConflict",
    "WakefulError",
    "Worker",
    "WorkerIdentity",
    "WorkerInfo",
    "WorkerSuperseded",
    "__version__",
    "cancel",
    "checkpoint_at",
    "fire_due",
    "fork",
    "history",
    "messages_at",
    "open_store",
    "resume",
    "schedule",
    "send_message",
    "submit",
    "tool",
]
