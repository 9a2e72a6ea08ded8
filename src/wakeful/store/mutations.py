"""The mutation records of the memory and file stores: every accepted mutation is one
``Mutation`` record, which ``wakeful.store.projection.State.apply`` applies and the file store
writes to its log. Records carry every value decided when they were planned (tokens, times,
ids)."""

from __future__ import annotations

from datetime import datetime, timedelta

import msgspec

from wakeful.records import (
    Awaiting,
    Claim,
    Commit,
    Dispatch,
    EventDraft,
    InboxMessage,
    Outcome,
    Receipt,
    RetentionPolicy,
    Retry,
    Schedule,
    WorkerInfo,
)


class Claimed(msgspec.Struct, frozen=True, tag="claimed"):
    claim: Claim
    tenant: str | None = None
    """The tenant the claimant named: fixes the thread's tenant if nothing did yet."""


class Renewed(msgspec.Struct, frozen=True, tag="renewed"):
    thread_id: str
    token: int
    expires_at: datetime


class Released(msgspec.Struct, frozen=True, tag="released"):
    thread_id: str
    token: int


class Committed(msgspec.Struct, frozen=True, tag="committed"):
    thread_id: str
    commit: Commit
    receipt: Receipt
    payload_hash: str
    at: datetime
    claim: Claim | None = None
    """Granted just before the commit applied (``claim_and_commit``)."""
    settled: Settled | None = None
    """The settle the commit carried, resolved at commit time."""


class Compacted(msgspec.Struct, frozen=True, tag="compacted"):
    thread_id: str
    floor: int


class Deleted(msgspec.Struct, frozen=True, tag="deleted"):
    thread_id: str
    epoch: int


class Pruned(msgspec.Struct, frozen=True, tag="pruned"):
    policy: RetentionPolicy
    at: datetime


class Enqueued(msgspec.Struct, frozen=True, tag="enqueued"):
    dispatch: Dispatch
    fence: Cancelled | None = None
    """``if_busy="interrupt"``: the cancellation of the busy run, applied first in the same
    atomic step."""


class LeaseGrant(msgspec.Struct, frozen=True):
    dispatch_id: str
    claim: Claim
    pin: str | None = None
    """The version the lease pins an unpinned dispatch to (issue 40)."""


class Leased(msgspec.Struct, frozen=True, tag="leased"):
    grants: tuple[LeaseGrant, ...]
    at: datetime


class Settled(msgspec.Struct, frozen=True, tag="settled"):
    dispatch_id: str
    token: int
    status: str
    available_at: datetime | None
    error: str | None
    at: datetime


class Cancelled(msgspec.Struct, frozen=True, tag="cancelled"):
    thread_id: str
    reason: str
    epoch: int
    dispatch: Dispatch
    at: datetime


class Promoted(msgspec.Struct, frozen=True, tag="promoted"):
    """The claim's due step (issue 38): ``scheduled`` dispatches whose time came, in this
    order, each through admission; ``cancel_ids[i]`` is the id of the cancel intent the
    ``i``-th makes if its ``interrupt``/``rollback`` policy fences the busy run."""

    dispatch_ids: tuple[str, ...]
    cancel_ids: tuple[str | None, ...]
    at: datetime


class Debounced(msgspec.Struct, frozen=True, tag="debounced"):
    """A debounced submission folded into the still ``scheduled`` dispatch of its key: its
    payload and due time replace that dispatch's (issue 39)."""

    dispatch_id: str
    payload: object
    available_at: datetime
    at: datetime


class Quarantined(msgspec.Struct, frozen=True, tag="quarantined"):
    dispatch_id: str
    at: datetime


class PinsReleased(msgspec.Struct, frozen=True, tag="pins_released"):
    """Pins released (``to_version`` ``None``: unpinned, ``released_from`` set), or moved to
    ``to_version`` by ``migrate_runs`` with one event per moved dispatch (thread, draft)."""

    dispatch_ids: tuple[str, ...]
    at: datetime
    to_version: str | None = None
    events: tuple[tuple[str, EventDraft], ...] = ()


class Requeued(msgspec.Struct, frozen=True, tag="requeued"):
    dispatch_id: str
    at: datetime


class Purged(msgspec.Struct, frozen=True, tag="purged"):
    dispatch_id: str
    at: datetime | None = None
    """When it was purged: the time of the admission it may make (a quarantined dispatch
    held its thread's run slot)."""


class WorkerRegistered(msgspec.Struct, frozen=True, tag="worker_registered"):
    worker: WorkerInfo


class WorkerBeat(msgspec.Struct, frozen=True, tag="worker_beat"):
    worker_id: str
    at: datetime


class WorkerRetired(msgspec.Struct, frozen=True, tag="worker_retired"):
    worker_id: str
    at: datetime


class Delivered(msgspec.Struct, frozen=True, tag="delivered"):
    """A staged outbox entry appended to its target's inbox (``message`` is ``None`` when it
    was delivered before) and its ``message`` dispatch enqueued (``None`` when one exists)."""

    stage_seq: int
    target_thread: str
    message: InboxMessage | None
    dispatch: Dispatch | None


class Unstaged(msgspec.Struct, frozen=True, tag="unstaged"):
    stage_seq: int


class SchedulePut(msgspec.Struct, frozen=True, tag="schedule_put"):
    schedule: Schedule  # as stored: its revision and times already decided


class ScheduleDeleted(msgspec.Struct, frozen=True, tag="schedule_deleted"):
    name: str


Mutation = (
    Claimed
    | Renewed
    | Released
    | Committed
    | Compacted
    | Deleted
    | Pruned
    | Enqueued
    | Leased
    | Settled
    | Promoted
    | Debounced
    | Cancelled
    | Quarantined
    | Requeued
    | PinsReleased
    | Purged
    | WorkerRegistered
    | WorkerBeat
    | WorkerRetired
    | Delivered
    | Unstaged
    | SchedulePut
    | ScheduleDeleted
)


__all__ = [
    "Cancelled",
    "Claimed",
    "Committed",
    "Compacted",
    "Debounced",
    "Deleted",
    "Delivered",
    "Enqueued",
    "LeaseGrant",
    "Leased",
    "Mutation",
    "PinsReleased",
    "Promoted",
    "Pruned",
    "Purged",
    "Quarantined",
    "Released",
    "Renewed",
    "Requeued",
    "Settled",
    "Unstaged",
    "WorkerBeat",
    "WorkerRegistered",
    "WorkerRetired",
]


def settled_record(dispatch: Dispatch, token: int, outcome: Outcome, now: datetime) -> Settled:
    """The record of settling ``dispatch`` with a checked ``outcome`` at ``now``."""
    if isinstance(outcome, Retry):
        return Settled(
            dispatch.dispatch_id,
            token,
            "pending",
            now + timedelta(seconds=outcome.delay),
            outcome.error,
            now,
        )
    status = "awaiting" if isinstance(outcome, Awaiting) else "done"
    return Settled(dispatch.dispatch_id, token, status, None, dispatch.last_error, now)
