"""Immutable domain records.

Every record is a frozen ``msgspec.Struct`` and encodes to JSON; nothing is ever pickled.
Times are timezone-aware UTC ``datetime`` values with microsecond precision and round-trip
exactly through every store. Values typed ``Any`` are JSON values (``dict``, ``list``,
``str``, ``int``, ``float``, ``bool``, ``None``); a store returns them as decoded JSON, so a
value that is not JSON (a ``datetime`` inside a state dict, say) comes back as its JSON form.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, TypeAlias

import msgspec

RunStatus: TypeAlias = Literal[
    "running", "suspended", "completed", "failed", "cancelled", "indeterminate", "interrupted"
]
"""``interrupted``: ended by a newer submission with ``if_busy="interrupt"`` (what it
committed stays; event ``run.interrupted`` names the interrupting run)."""
RUN_STATUSES: frozenset[str] = frozenset(
    ("running", "suspended", "completed", "failed", "cancelled", "indeterminate", "interrupted")
)
TERMINAL_STATUSES: frozenset[str] = frozenset(
    ("completed", "failed", "cancelled", "indeterminate", "interrupted")
)

Role: TypeAlias = Literal["system", "user", "assistant", "tool"]

DispatchKind: TypeAlias = Literal["start", "resume", "cancel", "message"]
DispatchStatus: TypeAlias = Literal[
    "scheduled", "queued", "waiting_key", "pending", "leased", "awaiting", "done", "quarantined"
]
"""``scheduled``: waiting for its ``available_at`` (a delayed run, a retry's backoff, a
sleeping run's wake-up, a debounced submission); the claim's due step moves it on when the
store's clock reaches it. ``queued``: a run's dispatch waiting for its thread's run slot
(the thread is busy with an unfinished run); it becomes ``pending`` when the slot frees
(see ``Dispatch``). ``waiting_key``: a dispatch that holds its thread's slot but waits for
a slot of its ``concurrency_key`` (that many dispatches of the key are pending or leased
already); it becomes ``pending`` when one of them settles, is suspended or is cancelled."""

IfBusy: TypeAlias = Literal["enqueue", "reject", "interrupt", "rollback", "coalesce"]
"""What a new run does when its thread is busy (``Dispatch.if_busy``, docs/busy-threads.md)."""
IF_BUSY: frozenset[str] = frozenset(("enqueue", "reject", "interrupt", "rollback", "coalesce"))

FORMAT_VERSION = 1


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """A lease on a thread. ``token`` is the fencing token: strictly greater than every token
    issued for the thread before. The claim is live while the store's clock is at or before
    ``expires_at``."""

    thread_id: str
    holder: str
    token: int
    expires_at: datetime

    def is_live(self, now: datetime) -> bool:
        return now <= self.expires_at


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    """A thread's committed state. ``parent`` is the id of the checkpoint it replaces
    (``None`` for a thread's first). ``frontier`` is what is left to run, as the runtime
    describes it; ``metadata`` is free-form JSON."""

    id: str
    parent: str | None
    run_id: str
    status: RunStatus
    state: Any
    created_at: datetime
    tenant: str | None = None
    format_version: int = FORMAT_VERSION
    frontier: list[Any] = msgspec.field(default_factory=list)
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class PendingWrite(msgspec.Struct, frozen=True, kw_only=True):
    """The result of one finished task, stored against ``checkpoint_id`` so recovery reuses
    it. One write per ``task_id`` and checkpoint."""

    checkpoint_id: str
    task_id: str
    node: str
    value: Any


class EventDraft(msgspec.Struct, frozen=True, kw_only=True):
    """An event as a commit proposes it; the store numbers and timestamps it."""

    type: str
    data: Any = None
    run_id: str | None = None
    checkpoint_id: str | None = None
    task_id: str | None = None


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """A durable event: ``seq`` is 1, 2, 3 ... per thread, never reused."""

    thread_id: str
    seq: int
    at: datetime
    type: str
    data: Any = None
    run_id: str | None = None
    checkpoint_id: str | None = None
    task_id: str | None = None


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """One conversation message. ``id`` is unique within its thread."""

    id: str
    role: Role
    content: Any = None
    tool_calls: list[Any] = msgspec.field(default_factory=list)
    tool_call_id: str | None = None
    run_id: str | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class OutboxEntry(msgspec.Struct, frozen=True, kw_only=True):
    """A message for another thread, staged inside the source thread's commit and delivered
    to the target's inbox by the relay. ``message_id`` makes delivery idempotent."""

    message_id: str
    target_thread: str
    payload: Any = None
    correlation_id: str | None = None


class InboxMessage(msgspec.Struct, frozen=True, kw_only=True):
    """A delivered, not yet consumed message. ``revision`` numbers a thread's inbox
    appends 1, 2, 3 ..."""

    message_id: str
    correlation_id: str | None
    payload: Any
    revision: int
    at: datetime
    source_thread: str | None = None


class Commit(msgspec.Struct, frozen=True, kw_only=True):
    """An atomic, fenced write to one thread. See ``ThreadStore.commit`` for the checks."""

    token: int
    checkpoint: Checkpoint | None = None
    writes: tuple[PendingWrite, ...] = ()
    events: tuple[EventDraft, ...] = ()
    messages: tuple[Message, ...] = ()
    operation_id: str | None = None
    expected_version: int | None = None
    outbox: tuple[OutboxEntry, ...] = ()
    consume: tuple[str, ...] = ()
    release: bool = False
    """End the claim with this commit, as ``release`` would right after it."""
    settle: Settle | None = None
    """Settle the thread's leased dispatch in the same atomic step (which also ends the
    claim), as ``settle(dispatch_id, token, outcome)`` would right after it."""
    drop_checkpoints: tuple[str, ...] = ()
    """Ids of earlier checkpoints to remove from the thread's history in the same atomic
    step: retention a caller chooses for itself (a LangGraph saver's ``prune`` and
    ``delete_for_runs``). Each must be in the history and none may be the latest after
    this commit."""
    branch_from: str | None = None
    """Branch the thread: the commit's new ``checkpoint`` continues from this earlier
    checkpoint of the history (its ``parent`` must name it) instead of the latest (naming
    the latest is allowed too: it only narrows the message view to ``branch_messages``). The
    checkpoints after it stay readable as an abandoned branch; the thread's head moves to a
    new branch (``ThreadStore.branches``) whose message view is the first
    ``branch_messages`` messages of the fork point's view, then this commit's messages and
    every later one. Nothing committed is removed."""
    branch_messages: int = 0
    """With ``branch_from``: how many messages of the fork point's branch view the new branch
    keeps (the message count as of the fork point: the runtime records it in each checkpoint
    as ``metadata["messages"]``)."""


class Branch(msgspec.Struct, frozen=True, kw_only=True):
    """One branch of a thread's history, created by a commit with ``Commit.branch_from``.
    Branch 0 is the thread's original line and has no record; branches are numbered 1, 2, 3
    ... in the order they were made, and the newest is always the thread's head.

    ``parent``: the branch the fork point is on. ``fork_point``: the checkpoint it continues
    from. ``old_head``: the latest checkpoint before it (the abandoned branch's end).
    ``checkpoint_id``: its first checkpoint (the branching commit's). ``messages``: how many
    messages of the parent branch's view it keeps; ``message_start``: where its own messages
    begin in the thread's append order (every message ever committed, counted from 0)."""

    number: int
    parent: int
    fork_point: str
    old_head: str | None
    checkpoint_id: str
    messages: int
    message_start: int
    at: datetime


class CheckpointEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One checkpoint of a thread's history as ``ThreadStore.history`` reads it: the
    checkpoint, when it was committed, the branch it was committed on, and ``order``, a
    number that increases with commit order within the thread (what ``before`` pages by)."""

    checkpoint: Checkpoint
    committed_at: datetime
    branch: int
    order: int


class Receipt(msgspec.Struct, frozen=True, kw_only=True):
    """What an applied commit returns. A retried operation returns the same receipt."""

    thread_id: str
    version: int
    checkpoint_id: str | None
    events: tuple[int, ...]
    operation_id: str | None = None


class ThreadSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A consistent read of one thread. ``claim`` is the current claim record, which may
    have expired (compare ``claim.expires_at`` with the store's clock)."""

    thread_id: str
    version: int
    checkpoint: Checkpoint | None
    writes: tuple[PendingWrite, ...]
    claim: Claim | None
    tenant: str | None
    message_count: int
    last_seq: int = 0
    event_floor: int = 1
    branch: int = 0
    """The head's branch: 0 until a commit branched the thread (``Commit.branch_from``).
    ``message_count`` counts the head branch's message view."""

    @property
    def tenant_bound(self) -> bool:
        """Whether the thread's tenant is fixed (to ``tenant``, which may be ``None``): by
        its first commit, or before any commit by a write that named a tenant (an enqueue,
        a claim or a lease of a dispatch of that tenant). A write naming another tenant is
        then ``TenantMismatch``."""
        return self.version > 0 or self.tenant is not None


class ThreadSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One row of ``list_threads``."""

    thread_id: str
    tenant: str | None
    version: int
    checkpoint_id: str | None
    status: RunStatus | None
    message_count: int
    last_seq: int
    updated_at: datetime


class RunSegment(msgspec.Struct, frozen=True, kw_only=True):
    """One row of ``runs``: a stretch of consecutive checkpoints of one run id in a thread's
    history (a run id that comes back after another run starts a new segment).

    ``status`` and ``graph`` (``metadata["graph"]`` when a string) are the latest
    checkpoint's; ``first_id``/``started_at`` are the oldest checkpoint retention kept.
    ``checkpoints`` counts the segment's kept checkpoints; the SQL stores count from the
    oldest kept one to the latest as they were committed, so there one a caller removed from
    between them with ``Commit.drop_checkpoints`` still counts."""

    run_id: str
    status: RunStatus
    graph: str | None
    first_id: str
    last_id: str
    started_at: datetime
    updated_at: datetime
    checkpoints: int


class RetentionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """What ``prune`` may remove. ``None`` leaves that kind of data alone. Ages are seconds
    measured by the store's clock against the time the data was stored. The latest
    checkpoint of a thread, its pending writes, its messages and its inbox are never pruned."""

    checkpoint_max_age: float | None = None
    keep_checkpoints: int | None = None
    event_max_age: float | None = None
    keep_events: int | None = None
    receipt_max_age: float | None = None
    settled_dispatch_max_age: float | None = None


class PruneReport(msgspec.Struct, frozen=True, kw_only=True):
    checkpoints: int = 0
    events: int = 0
    receipts: int = 0
    dispatches: int = 0


# --------------------------------------------------------------------------- queue


class Dispatch(msgspec.Struct, frozen=True, kw_only=True):
    """A durable request to execute work on a thread.

    A caller builds one with ``dispatch_id``, ``thread_id``, ``kind`` and ``payload`` (and
    optionally ``priority``, ``available_at``, ``max_attempts``, ``dedupe_key``, ``tenant``);
    the store fills the delivery fields. ``attempts`` counts claims; ``token`` is the fencing
    token of the thread claim granted with the current lease.

    ``tenant``: the tenant the work is submitted for. Enqueueing it fixes the thread's tenant
    if nothing fixed it yet, and is refused with ``TenantMismatch`` on a thread of another
    tenant (see ``DispatchQueue.enqueue``). ``None``: the work names no tenant (the store's
    internal dispatches, a cancel, single-tenant use).

    Busy threads: each thread has one run slot. A ``start`` or ``message`` dispatch takes it
    when enqueued on a thread that is not busy (``pending``); otherwise it waits ``queued``
    behind the dispatch named by ``queued_behind`` and is admitted (``pending``) in enqueue
    order when the slot frees: its holder settles ``done``, is cancelled or is purged. A
    suspended run (``awaiting``) keeps the slot and its ``resume`` inherits it; a ``cancel``
    holds it until it settles. ``if_busy`` says what a submission does when the thread is
    busy: ``enqueue`` (wait), ``reject`` (``ThreadBusy``, nothing stored), ``interrupt``
    (wait, and the busy run is fenced through ``cancel``; the run it interrupts ends
    ``interrupted``), ``rollback`` (as ``interrupt``; the run's ending also branches the
    thread back to where it was before the run started) or ``coalesce``
    (consecutive waiting ``coalesce`` submissions are admitted as one run: the first one,
    whose ``coalesced`` names the others; they settle ``done`` with ``answered_by`` naming it)."""

    dispatch_id: str
    thread_id: str
    kind: DispatchKind
    payload: Any = None
    priority: int = 0
    available_at: datetime | None = None
    max_attempts: int = 5
    dedupe_key: str | None = None
    status: DispatchStatus = "pending"
    attempts: int = 0
    token: int | None = None
    holder: str | None = None
    lease_until: datetime | None = None
    last_error: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    tenant: str | None = None
    if_busy: IfBusy = "enqueue"
    queued_behind: str | None = None
    """The dispatch this one waited behind when it was enqueued ``queued`` (set by the store)."""
    coalesced: tuple[str, ...] = ()
    """The ``coalesce`` submissions this admitted dispatch answers besides itself, in enqueue
    order (set by the store)."""
    answered_by: str | None = None
    """The dispatch whose run answered this coalesced submission (set by the store)."""
    pinned_version: str | None = None
    """The code version whose workers alone may lease this dispatch (set by the store): the
    version of the worker that first leased it, or for a ``resume`` the one of the run it
    continues. ``None``: any worker (a start not leased yet, a released pin)."""
    released_from: str | None = None
    """The version this dispatch was pinned to until no worker of it was left alive for the
    pin grace (``DispatchQueue.release_pins``): its claimant applies the target's
    ``on_version_change`` policy (set by the store)."""
    debounce_key: str | None = None
    """Debounce (issue 39): while a ``scheduled`` dispatch of the same thread and key exists,
    enqueueing this one replaces that dispatch's ``payload`` and ``available_at`` and returns
    it (its id, not this one's) instead of storing another: a burst of submissions within
    the window starts one run, with the last input. ``None``: no debounce."""
    concurrency_key: str | None = None
    """Concurrency key (issue 39): at most ``concurrency_limit`` dispatches of one key are
    admitted (``pending`` or ``leased``) at once, across every worker; the others wait
    ``waiting_key``. A suspended run (``awaiting``) holds no key slot; a lapsed lease keeps
    its slot until its dispatch is leased again and settled. A ``resume`` takes the key of
    the run it continues when that run has one. Given with ``concurrency_limit``, or not at
    all."""
    concurrency_limit: int | None = None
    """The key's limit (at least 1). The latest enqueue of a key sets the key's limit."""
    fair_tag: float = 0.0
    """The dispatch's place among equal priorities (set by the store when it becomes
    ``pending``): the claim takes the lowest first, so tenants are served round-robin
    (issue 39, docs/flow-control.md)."""

    @property
    def exhausted(self) -> bool:
        """True once every attempt of the budget has been used."""
        return self.attempts >= self.max_attempts


class Schedule(msgspec.Struct, frozen=True, kw_only=True):
    """A recurring submission of ``target`` (``wakeful.schedule``): a tick every time
    ``cron`` (read in ``timezone``) or every ``every`` seconds matches, fired exactly once per
    fleet by ``wakeful.fire_due`` as the dispatch ``sched:{name}:{tick in UTC}``.

    ``next_fire_at`` is the earliest tick not fired yet (``None``: none left). ``revision``
    counts the stored versions: ``ScheduleStore.put_schedule`` replaces a schedule only when
    given its current revision (compare-and-set), and the store sets ``revision``,
    ``created_at`` and ``updated_at``."""

    name: str
    target: str
    cron: str | None = None
    every: float | None = None
    input: Any = None
    thread: str | None = None
    thread_template: str | None = None
    timezone: str = "UTC"
    overlap: Literal["skip", "enqueue", "allow"] = "skip"
    catch_up: Literal["skip", "latest", "all"] = "latest"
    max_catch_up: int = 10
    tenant: str | None = None
    paused: bool = False
    next_fire_at: datetime | None = None
    last_tick: datetime | None = None
    last_dispatch_id: str | None = None
    waiting_since: datetime | None = None
    """With ``overlap="enqueue"``: the first tick waiting for the previous tick's run to end
    (``next_fire_at`` is then when the firers look again)."""
    fired: int = 0
    """Dispatches fired so far (ticks and triggers)."""
    revision: int = 0
    created_at: datetime | None = None
    updated_at: datetime | None = None


class Lease(msgspec.Struct, frozen=True, kw_only=True):
    """A claimed dispatch with its thread claim. ``exhausted`` means the retry budget is
    spent: the claimant records the run's terminal ``indeterminate`` state and settles
    ``Done``."""

    dispatch: Dispatch
    claim: Claim
    exhausted: bool
    snapshot: ThreadSnapshot | None = None
    """The thread as read in the same atomic step that granted ``claim`` (so it includes
    the claim), or ``None`` from a store that does not read it there."""


class Done(msgspec.Struct, frozen=True, tag="done"):
    """The dispatch's work is finished (or terminally resolved)."""


class Awaiting(msgspec.Struct, frozen=True, tag="awaiting"):
    """The run suspended for input; the dispatch is parked until the fleet resolves it."""


class Retry(msgspec.Struct, frozen=True, tag="retry"):
    """Make the dispatch available again after ``delay`` seconds, keeping ``error``."""

    delay: float = 0.0
    error: str | None = None


Outcome: TypeAlias = Done | Awaiting | Retry


class Settle(msgspec.Struct, frozen=True, kw_only=True):
    """A settle carried by a ``Commit``: the run's last commit and the end of its lease
    become one atomic step (one transaction, one fsync)."""

    dispatch_id: str
    outcome: Outcome


class WorkerIdentity(msgspec.Struct, frozen=True, kw_only=True):
    worker_id: str
    incarnation_id: str
    generation: int


class WorkerInfo(msgspec.Struct, frozen=True, kw_only=True):
    worker_id: str
    incarnation_id: str
    generation: int
    registered_at: datetime
    last_heartbeat: datetime
    stopped_at: datetime | None = None
    """When this incarnation recorded its graceful stop (``DispatchQueue.retire_worker``);
    ``None`` while it runs, or if it died without stopping. A new registration clears it."""
    version: str | None = None
    """The code version this incarnation runs (``Worker(version=...)``); ``None`` for a
    worker that named none (an older wakeful)."""


class StreamCheckpoint(msgspec.Struct, frozen=True, kw_only=True):
    """The unfinished model turn of a run. Best-effort; the thread commit stays the
    authority. ``token`` is the claim token of the run writing it."""

    run_id: str
    thread_id: str
    model: str
    partial_text: str = ""
    tool_calls: list[Any] = msgspec.field(default_factory=list)
    in_flight_tool: Any = None
    retry_count: int = 0
    token: int = 0
    updated_at: datetime | None = None
    task_id: str | None = None
    """The task (model step) of the run the turn belongs to, so a checkpoint left over from
    an earlier step is never mistaken for the current one."""
    message_id: str | None = None
    """The id the assistant message will have once the turn is committed (what a live stream
    of the turn names it by)."""
