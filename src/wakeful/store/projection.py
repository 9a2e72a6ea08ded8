"""The in-memory projection of a whole store.

Every accepted mutation is one ``Mutation`` record (``wakeful.store.mutations``, re-exported
here). ``State.apply`` is deterministic: the
same records applied in the same order give the same state, so the memory store applies
records directly and the file store replays its log through the same code. Records carry
every value decided when they were planned (tokens, times, ids); ``apply`` never reads a
clock and never fails on a record that was planned against the same state.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec

from wakeful.records import (
    Branch,
    Checkpoint,
    Claim,
    Dispatch,
    Event,
    InboxMessage,
    Message,
    OutboxEntry,
    PendingWrite,
    PruneReport,
    Receipt,
    Schedule,
    WorkerInfo,
)
from wakeful.store.branching import branch_of, view_length, view_segments
from wakeful.store.fairness import FairTags
from wakeful.store.keyslots import KeySlots

# re-exported: the records were defined here, and callers import them from here
from wakeful.store.mutations import (
    Cancelled as Cancelled,
)
from wakeful.store.mutations import (
    Claimed as Claimed,
)
from wakeful.store.mutations import (
    Committed as Committed,
)
from wakeful.store.mutations import (
    Compacted as Compacted,
)
from wakeful.store.mutations import (
    Debounced as Debounced,
)
from wakeful.store.mutations import (
    Deleted as Deleted,
)
from wakeful.store.mutations import (
    Delivered as Delivered,
)
from wakeful.store.mutations import (
    Enqueued as Enqueued,
)
from wakeful.store.mutations import (
    Leased as Leased,
)
from wakeful.store.mutations import (
    LeaseGrant as LeaseGrant,
)
from wakeful.store.mutations import (
    Mutation as Mutation,
)
from wakeful.store.mutations import (
    PinsReleased as PinsReleased,
)
from wakeful.store.mutations import (
    Promoted as Promoted,
)
from wakeful.store.mutations import (
    Pruned as Pruned,
)
from wakeful.store.mutations import (
    Purged as Purged,
)
from wakeful.store.mutations import (
    Quarantined as Quarantined,
)
from wakeful.store.mutations import (
    Released as Released,
)
from wakeful.store.mutations import (
    Renewed as Renewed,
)
from wakeful.store.mutations import (
    Requeued as Requeued,
)
from wakeful.store.mutations import (
    ScheduleDeleted as ScheduleDeleted,
)
from wakeful.store.mutations import (
    SchedulePut as SchedulePut,
)
from wakeful.store.mutations import (
    Settled as Settled,
)
from wakeful.store.mutations import (
    Unstaged as Unstaged,
)
from wakeful.store.mutations import (
    WorkerBeat as WorkerBeat,
)
from wakeful.store.mutations import (
    WorkerRegistered as WorkerRegistered,
)
from wakeful.store.mutations import (
    WorkerRetired as WorkerRetired,
)
from wakeful.store.mutations import settled_record as settled_record
from wakeful.store.pins import apply_pins
from wakeful.store.projected_due import promote
from wakeful.store.projected_index import CLAIMABLE as CLAIMABLE
from wakeful.store.projected_index import QueueIndexes
from wakeful.store.projected_retention import prune_state

# ------------------------------------------------------------------------ state


@dataclass
class StagedEntry:
    source_thread: str
    entry: OutboxEntry
    at: datetime


@dataclass
class ThreadState:
    thread_id: str
    version: int = 0
    tenant: str | None = None
    claim: Claim | None = None
    history: list[tuple[Checkpoint, datetime]] = field(default_factory=list)
    checkpoint_ids: set[str] = field(default_factory=set)
    writes: dict[str, PendingWrite] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    floor: int = 1
    messages: list[Message] = field(default_factory=list)
    message_ids: set[str] = field(default_factory=set)
    receipts: dict[str, tuple[str, Receipt, datetime]] = field(default_factory=dict)
    inbox: dict[str, InboxMessage] = field(default_factory=dict)
    delivered: set[str] = field(default_factory=set)
    inbox_revision: int = 0
    updated_at: datetime | None = None
    orders: list[int] = field(default_factory=list)
    """Parallel to ``history``: each checkpoint's commit order (the thread version of the
    commit that added it), increasing, so a page of history is a bisection away."""
    cp_order: dict[str, int] = field(default_factory=dict)
    """Derived from ``history`` and ``orders``: checkpoint id -> commit order."""
    branches: list[Branch] = field(default_factory=list)
    branch_orders: list[int] = field(default_factory=list)
    """Parallel to ``branches``: the commit order of each branch's first checkpoint."""

    @property
    def latest(self) -> Checkpoint | None:
        return self.history[-1][0] if self.history else None

    @property
    def message_count(self) -> int:
        """How many messages the head branch's view shows."""
        if not self.branches:
            return len(self.messages)
        return view_length(view_segments(self.branches, len(self.branches)), len(self.messages))

    def index_of(self, checkpoint_id: str) -> int | None:
        """The position of ``checkpoint_id`` in ``history``, or None."""
        order = self.cp_order.get(checkpoint_id)
        if order is None:
            return None
        return bisect.bisect_left(self.orders, order)

    def branch_at(self, checkpoint_id: str) -> int:
        """The branch a checkpoint of the history was committed on."""
        return branch_of(self.branch_orders, self.cp_order[checkpoint_id])

    def keep_history(self, keep: list[tuple[Checkpoint, datetime]]) -> None:
        """Keep only ``keep`` (a subsequence of ``history``), with its orders."""
        kept = {cp.id for cp, _ in keep}
        pairs = zip(self.history, self.orders, strict=True)
        self.orders = [o for (cp, _), o in pairs if cp.id in kept]
        for cp, _ in self.history:
            if cp.id not in kept:
                self.cp_order.pop(cp.id, None)
                self.checkpoint_ids.discard(cp.id)
        self.history = keep

    @property
    def next_seq(self) -> int:
        return self.floor + len(self.events)

    @property
    def tenant_bound(self) -> bool:
        """As ``ThreadSnapshot.tenant_bound``: fixed by the first commit, or before it by a
        write that named a tenant."""
        return self.version > 0 or self.tenant is not None

    def foreign(self, tenant: str | None) -> bool:
        """Whether a write naming ``tenant`` (``None``: naming none) is refused here."""
        return tenant is not None and self.foreign_checkpoint(tenant)

    def foreign_checkpoint(self, tenant: str | None) -> bool:
        """Whether a checkpoint of ``tenant`` is refused here (its ``None`` names no tenant,
        which a thread fixed to a tenant refuses too)."""
        return self.tenant_bound and self.tenant != tenant

    def bind(self, tenant: str | None) -> None:
        """Fix the tenant to ``tenant`` if a write named one and nothing fixed it yet."""
        if tenant is not None and not self.tenant_bound:
            self.tenant = tenant


@dataclass
class State(QueueIndexes):
    threads: dict[str, ThreadState] = field(default_factory=dict)
    epochs: dict[str, int] = field(default_factory=dict)
    """The highest token issued (or epoch advanced to) per thread; survives deletion."""
    dispatches: dict[str, Dispatch] = field(default_factory=dict)
    dispatch_order: dict[str, int] = field(default_factory=dict)
    dispatch_seq: int = 0
    dedupe: dict[str, str] = field(default_factory=dict)
    open_by_thread: dict[str, set[str]] = field(default_factory=dict)
    outbox: dict[int, StagedEntry] = field(default_factory=dict)
    stage_seq: int = 0
    workers: dict[str, WorkerInfo] = field(default_factory=dict)
    schedules: dict[str, Schedule] = field(default_factory=dict)
    claimable: list[tuple[int, float, int, str]] = field(default_factory=list)
    """Derived (never persisted): the pending and leased dispatches in claim order, as
    ``(-priority, enqueue order, dispatch_id)``, so ``claim_next`` never sorts the queue."""
    scheduled: list[tuple[datetime, int, str]] = field(default_factory=list)
    """Derived: the ``scheduled`` dispatches as ``(available_at, enqueue order, id)``."""
    slots: dict[str, set[str]] = field(default_factory=dict)
    """Derived: per thread, the dispatches holding its run slot (``holds_slot``)."""
    queued: dict[str, list[str]] = field(default_factory=dict)
    """Derived: per thread, its ``queued`` dispatches in enqueue order."""
    keys: KeySlots = field(default_factory=KeySlots)
    fair: FairTags = field(default_factory=FairTags)  # derived: pending tags (fairness)
    """Derived: the concurrency keys' limits, admitted and waiting dispatches."""

    def __post_init__(self) -> None:
        self.build_indexes()

    def thread(self, thread_id: str) -> ThreadState:
        found = self.threads.get(thread_id)
        if found is None:
            found = self.threads[thread_id] = ThreadState(thread_id)
        return found

    # -------------------------------------------------------------- apply

    def apply(self, record: Mutation) -> PruneReport | None:
        """Apply one record. Returns the report for ``Pruned``, else ``None``."""
        match record:
            case Claimed(claim=claim, tenant=tenant):
                t = self.thread(claim.thread_id)
                t.claim = claim
                t.bind(tenant)
                self.epochs[claim.thread_id] = claim.token
            case Renewed(thread_id=tid, token=token, expires_at=expires):
                t = self.threads[tid]
                assert t.claim is not None
                t.claim = msgspec.structs.replace(t.claim, expires_at=expires)
                for did in self.open_by_thread.get(tid, ()):
                    d = self.dispatches[did]
                    if d.status == "leased" and d.token == token:
                        self._put_dispatch(msgspec.structs.replace(d, lease_until=expires))
            case Released(thread_id=tid):
                self.threads[tid].claim = None
            case Committed(thread_id=tid, claim=claim, settled=settled, commit=commit):
                if claim is not None:
                    self.apply(Claimed(claim))
                self._apply_commit(record)
                if settled is not None:
                    self._apply_settle(settled)
                if commit.release:
                    self.threads[tid].claim = None
            case Compacted(thread_id=tid, floor=floor):
                t = self.threads[tid]
                del t.events[: floor - t.floor]
                t.floor = floor
            case Deleted(thread_id=tid, epoch=epoch):
                self.threads.pop(tid, None)
                self.epochs[tid] = epoch
                for seq in [s for s, e in self.outbox.items() if e.source_thread == tid]:
                    del self.outbox[seq]
            case Pruned(policy=policy, at=at):
                return prune_state(self, policy, at)
            case Enqueued(dispatch=d, fence=fence):
                if fence is not None:
                    self.apply(fence)
                if d.kind == "resume" and d.status != "scheduled":
                    self._retire_awaiting(d.thread_id, d.created_at)  # (when due if delayed)
                self.dispatch_seq += 1
                self.dispatch_order[d.dispatch_id] = self.dispatch_seq
                if d.dedupe_key is not None:
                    self.dedupe[d.dedupe_key] = d.dispatch_id
                self._put_dispatch(d)
                if d.tenant is not None:
                    self.thread(d.thread_id).bind(d.tenant)
            case Leased(grants=grants, at=at):
                for grant in grants:
                    d = self.dispatches[grant.dispatch_id]
                    self.apply(Claimed(grant.claim, d.tenant))
                    self._put_dispatch(
                        msgspec.structs.replace(
                            d,
                            status="leased",
                            attempts=d.attempts + 1,
                            token=grant.claim.token,
                            holder=grant.claim.holder,
                            lease_until=grant.claim.expires_at,
                            updated_at=at,
                            pinned_version=d.pinned_version or grant.pin,
                        )
                    )
            case Settled():
                self._apply_settle(record)
            case Promoted():
                promote(self, record)
            case Debounced(dispatch_id=did, payload=payload, available_at=due, at=at):
                d = self.dispatches[did]
                self._put_dispatch(
                    msgspec.structs.replace(d, payload=payload, available_at=due, updated_at=at)
                )
            case Cancelled(thread_id=tid, reason=reason, epoch=epoch, dispatch=cancel, at=at):
                for did in list(self.open_by_thread.get(tid, ())):
                    d = self.dispatches[did]
                    self._put_dispatch(
                        msgspec.structs.replace(
                            d,
                            status="done",
                            lease_until=None,
                            last_error=f"cancelled: {reason}",
                            updated_at=at,
                        )
                    )
                self.epochs[tid] = epoch
                if tid in self.threads:
                    self.threads[tid].claim = None
                self.apply(Enqueued(cancel))
            case Quarantined(dispatch_id=did, at=at):
                d = self.dispatches[did]
                self._put_dispatch(
                    msgspec.structs.replace(
                        d, status="quarantined", lease_until=None, updated_at=at
                    )
                )
            case PinsReleased():
                apply_pins(self, record)
            case Requeued(dispatch_id=did, at=at):
                d = self.dispatches[did]
                self._put_dispatch(
                    msgspec.structs.replace(
                        d,
                        status="pending",
                        attempts=0,
                        token=None,
                        holder=None,
                        lease_until=None,
                        available_at=at,
                        updated_at=at,
                        released_from=None,  # the operator's decision: run it on this code
                    )
                )
            case Purged(dispatch_id=did, at=at):
                tid = self.dispatches[did].thread_id
                self._drop_dispatch(did)
                self._admit(tid, at)
            case WorkerRegistered(worker=worker):
                self.workers[worker.worker_id] = worker
            case WorkerBeat(worker_id=wid, at=at):
                self.workers[wid] = msgspec.structs.replace(self.workers[wid], last_heartbeat=at)
            case WorkerRetired(worker_id=wid, at=at):
                self.workers[wid] = msgspec.structs.replace(self.workers[wid], stopped_at=at)
            case Delivered(target_thread=target, message=message, dispatch=dispatch):
                if message is not None:
                    t = self.thread(target)
                    t.inbox[message.message_id] = message
                    t.delivered.add(message.message_id)
                    t.inbox_revision = message.revision
                if dispatch is not None:
                    self.apply(Enqueued(dispatch))
            case Unstaged(stage_seq=seq):
                self.outbox.pop(seq, None)
            case SchedulePut(schedule=schedule):
                self.schedules[schedule.name] = schedule
            case ScheduleDeleted(name=name):
                self.schedules.pop(name, None)
        return None

    def _apply_commit(self, record: Committed) -> None:
        commit, receipt, at = record.commit, record.receipt, record.at
        t = self.thread(record.thread_id)
        if commit.checkpoint is not None:
            # a first commit without a checkpoint leaves an unbound thread's tenant None,
            # which its version (then > 0) fixes
            t.bind(commit.checkpoint.tenant)
        if commit.branch_from is not None:
            assert commit.checkpoint is not None
            t.branches.append(
                Branch(
                    number=len(t.branches) + 1,
                    parent=t.branch_at(commit.branch_from),
                    fork_point=commit.branch_from,
                    old_head=t.latest.id if t.latest is not None else None,
                    checkpoint_id=commit.checkpoint.id,
                    messages=commit.branch_messages,
                    message_start=len(t.messages),
                    at=at,
                )
            )
            t.branch_orders.append(receipt.version)
        if commit.checkpoint is not None:
            t.history.append((commit.checkpoint, at))
            t.orders.append(receipt.version)
            t.cp_order[commit.checkpoint.id] = receipt.version
            t.checkpoint_ids.add(commit.checkpoint.id)
            t.writes = {}
        if commit.drop_checkpoints:
            dropped = set(commit.drop_checkpoints)
            t.keep_history([entry for entry in t.history if entry[0].id not in dropped])
        for write in commit.writes:
            t.writes[write.task_id] = write
        for seq, draft in zip(receipt.events, commit.events, strict=True):
            t.events.append(
                Event(
                    thread_id=record.thread_id,
                    seq=seq,
                    at=at,
                    type=draft.type,
                    data=draft.data,
                    run_id=draft.run_id,
                    checkpoint_id=draft.checkpoint_id,
                    task_id=draft.task_id,
                )
            )
        for message in commit.messages:
            t.messages.append(message)
            t.message_ids.add(message.id)
        for entry in commit.outbox:
            self.stage_seq += 1
            self.outbox[self.stage_seq] = StagedEntry(record.thread_id, entry, at)
        for message_id in commit.consume:
            del t.inbox[message_id]
        if commit.operation_id is not None:
            t.receipts[commit.operation_id] = (record.payload_hash, receipt, at)
        t.version = receipt.version
        t.updated_at = at

    def _apply_settle(self, record: Settled) -> None:
        d = self.dispatches[record.dispatch_id]
        t = self.threads.get(d.thread_id)
        if t is not None and t.claim is not None and t.claim.token == record.token:
            t.claim = None
        if record.status == "pending":
            later = record.available_at is not None and record.available_at > record.at
            d = msgspec.structs.replace(
                d,
                status="scheduled" if later else "pending",  # a retry's backoff, a sleep
                token=None,
                holder=None,
                lease_until=None,
                available_at=record.available_at,
                last_error=record.error,
                updated_at=record.at,
            )
        else:
            d = msgspec.structs.replace(
                d,
                status=record.status,
                lease_until=None,
                updated_at=record.at,
            )
        self._put_dispatch(d)
        if record.status == "done":
            self._admit(d.thread_id, record.at)


def json_copy(value: Any, type_: Any) -> Any:
    """Round-trip ``value`` through JSON as ``type_``: validates it and detaches it from the
    caller's mutable objects."""
    return msgspec.json.decode(msgspec.json.encode(value), type=type_)
