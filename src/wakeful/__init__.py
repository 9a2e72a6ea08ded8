"""wakeful: a durable runtime for LLM agents.

Every run executes under a fenced claim on its thread and records its progress as atomic
commits to a store, so a crashed or paused process never loses committed work, never records
it twice, and never lets a stale process write. Start with ``open_store``.
"""

from wakeful.clock import Clock, ManualClock, SystemClock
from wakeful.errors import (
    CorruptStore,
    DispatchConflict,
    InvalidCommit,
    InvalidInput,
    InvalidState,
    NotFound,
    OperationConflict,
    ReplayUnavailable,
    StaleClaim,
    StoreClosed,
    StoreLocked,
    StoreRefused,
    StoreUnavailable,
    StreamCheckpointError,
    TenantMismatch,
    ThreadBusy,
    UnsupportedStore,
    VersionConflict,
    WakefulError,
    WorkerSuperseded,
)
from wakeful.records import (
    Awaiting,
    Checkpoint,
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
    Settle,
    StreamCheckpoint,
    ThreadSnapshot,
    ThreadSummary,
    WorkerIdentity,
    WorkerInfo,
)
from wakeful.store import open_store
from wakeful.store.contract import Store

__version__ = "0.1.0"

_FLEET = ("submit", "resume", "cancel", "send_message")


def __getattr__(name: str) -> object:
    """``wakeful.submit`` and friends, imported on first use (they pull in the fleet)."""
    if name in _FLEET:
        from wakeful.fleet import client

        return getattr(client, name)
    raise AttributeError(f"module 'wakeful' has no attribute {name!r}")


__all__ = [
    "Awaiting",
    "Checkpoint",
    "Claim",
    "Clock",
    "Commit",
    "CorruptStore",
    "Dispatch",
    "DispatchConflict",
    "Done",
    "Event",
    "EventDraft",
    "InboxMessage",
    "InvalidCommit",
    "InvalidInput",
    "InvalidState",
    "Lease",
    "ManualClock",
    "Message",
    "NotFound",
    "OperationConflict",
    "OutboxEntry",
    "PendingWrite",
    "PruneReport",
    "Receipt",
    "ReplayUnavailable",
    "RetentionPolicy",
    "Retry",
    "Settle",
    "StaleClaim",
    "Store",
    "StoreClosed",
    "StoreLocked",
    "StoreRefused",
    "StoreUnavailable",
    "StreamCheckpoint",
    "StreamCheckpointError",
    "SystemClock",
    "TenantMismatch",
    "ThreadBusy",
    "ThreadSnapshot",
    "ThreadSummary",
    "UnsupportedStore",
    "VersionConflict",
    "WakefulError",
    "WorkerIdentity",
    "WorkerInfo",
    "WorkerSuperseded",
    "__version__",
    "cancel",
    "open_store",
    "resume",
    "send_message",
    "submit",
]
