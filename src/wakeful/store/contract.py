"""The store contract: what every backend (memory, file, sqlite, postgres) guarantees.

The contract is async and written once. ``wakeful.testkit`` checks it case by case.

Time: a claim or lease is *live* while the store's clock reads at or before its expiry
(``now <= expires_at``); it has *expired* once the clock is past it. Memory, file and
SQLite stores judge by the clock they were opened with; PostgreSQL by the server's ``now()``.

Tenants: a thread's tenant is *fixed* (``ThreadSnapshot.tenant_bound``) by the first write
that names one, atomically with that write: ``enqueue`` of a dispatch with a ``tenant``,
``claim(tenant=...)``, a lease (``claim_next``) of a dispatch with a ``tenant``, or the first
commit (its checkpoint's tenant; without a checkpoint, ``None``). A write naming another
tenant is then ``TenantMismatch`` and changes nothing, checked before anything that could
name the other tenant's data (a busy refusal names the holder); a write naming no tenant
(``None``) is never refused for its tenant, except a checkpoint, whose ``None`` must match.
Of concurrent first writes of two tenants exactly one gets the thread. ``delete_thread``
removes the binding with everything else.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, runtime_checkable

from wakeful.concurrency import KeyUse
from wakeful.limits import LimitBucket, LimitWaiter, RateLimit
from wakeful.records import (
    Branch,
    Checkpoint,
    CheckpointEntry,
    Claim,
    Commit,
    Dispatch,
    DispatchStatus,
    Event,
    InboxMessage,
    Lease,
    Message,
    Outcome,
    PruneReport,
    Receipt,
    RetentionPolicy,
    RunSegment,
    Schedule,
    StreamCheckpoint,
    ThreadSnapshot,
    ThreadSummary,
    WorkerIdentity,
    WorkerInfo,
)


@runtime_checkable
class ThreadStore(Protocol):
    """Threads: claims, fenced commits, reads and maintenance (DESIGN §3.1-§3.2)."""

    async def claim(
        self, thread_id: str, holder: str, ttl: float, tenant: str | None = None
    ) -> Claim:
        """Grant a claim on ``thread_id`` to ``holder`` for ``ttl`` seconds from now, with a
        token greater than every token issued for the thread before (also before a
        ``delete_thread``). The thread needs no checkpoint. An expired claim is replaced.

        Raises ``ThreadBusy`` (naming the holder and the latest checkpoint) while a live claim
        exists, even one of the same holder; nothing changes then. Of many concurrent
        claimers exactly one wins.

        ``tenant``: the tenant the claimant acts for; fixes the thread's tenant if nothing did
        yet, and is ``TenantMismatch`` (before ``ThreadBusy``) on a thread fixed to another.
        ``None`` names no tenant."""
        ...

    async def renew(self, thread_id: str, token: int, ttl: float) -> Claim:
        """Extend the current claim to ``ttl`` seconds from now. An expired claim that nobody
        replaced can still be renewed. Raises ``StaleClaim`` if ``token`` is not current."""
        ...

    async def release(self, thread_id: str, token: int) -> None:
        """Free the thread at once. A token that is not current is a no-op, so a run never
        releases its successor's claim."""
        ...

    async def commit(self, thread_id: str, commit: Commit) -> Receipt:
        """Apply ``commit`` atomically, or nothing. Checks, in this order:

        1. ``commit.token`` is the current claim (live, or expired and not replaced), else
           ``StaleClaim`` -- except that a recorded ``operation_id`` with the same payload
           still returns its receipt while no claim was granted after ``token`` (so a commit
           that ended its own claim with ``release`` or ``settle`` answers its retries).
           The token stays first, always: once a claim was granted after ``token`` nothing
           is returned or applied, but a recorded ``operation_id`` with the same payload
           makes the ``StaleClaim`` carry its original receipt (``applied_receipt``): the
           retry learns that its operation was applied before the claim was lost;
        2. a recorded ``operation_id``: the same payload (everything but the token) returns
           the original receipt and changes nothing; another payload is ``OperationConflict``;
        3. ``expected_version`` not the thread's version, or ``checkpoint.parent`` not the
           latest checkpoint id: ``VersionConflict``; with ``branch_from`` (whose shape
           ``checkpoint.parent == branch_from`` is input validation), the parent must instead
           be a checkpoint of the history and ``branch_messages`` at most the length of
           the fork point's branch view, else ``InvalidCommit`` (judged with step 4);
        4. writes naming any checkpoint but the one latest after this commit, a duplicate
           task write, a message id already on the thread, a checkpoint id used before,
           consuming an id not in the inbox: ``InvalidCommit``; a checkpoint whose tenant
           differs from the thread's fixed tenant: ``TenantMismatch``;
        5. ``settle``: the dispatch must exist (``NotFound``), belong to this thread
           (``InvalidCommit``) and be leased with ``commit.token`` (``StaleClaim``), exactly
           as ``settle`` checks it.

        Then everything applies: a new checkpoint replaces the latest and drops its pending
        writes (a branching one also records a new ``Branch``, which becomes the head: see
        ``Commit.branch_from``); events get the next contiguous numbers (never reused, not
        after a refusal, a compaction or a restart); messages append in order; outbox
        entries are staged; consumed inbox entries are removed; the version increases by
        one. A thread whose tenant nothing fixed yet gets it from its first applied commit
        (its checkpoint's tenant, else none); a fixed tenant never changes. Last,
        ``settle`` settles the dispatch as ``settle`` would (ending the claim), and
        ``release`` ends the claim as ``release`` would: both in the same atomic step."""
        ...

    async def claim_and_commit(
        self, thread_id: str, holder: str, ttl: float, commit: Commit
    ) -> tuple[Claim, Receipt]:
        """``claim`` then ``commit`` under the granted token, as one atomic step (one
        transaction, one fsync): a run's admission without a separate claim write.
        ``commit.token`` is ignored. Refusals are a checkpoint of another tenant than the
        thread's fixed one (``TenantMismatch``, first), those of ``claim`` (``ThreadBusy``)
        and of ``commit`` (step 2 on); any refusal changes nothing: no claim is granted and
        no token is spent. A recorded ``operation_id`` with the same payload returns its receipt
        beside the new claim."""
        ...

    async def read(self, thread_id: str) -> ThreadSnapshot | None:
        """The thread's consistent snapshot, or ``None`` when the store holds nothing of it
        (no commit, no claim and no fixed tenant: a thread bound by queued work reads as
        version 0 with its tenant)."""
        ...

    async def operation(self, thread_id: str, operation_id: str) -> Receipt | None:
        """The original receipt of the commit applied on ``thread_id`` with ``operation_id``,
        whoever holds the thread now (no token is needed: this is a read), or ``None`` when
        the thread has no such operation recorded: it was never applied, or its record is
        gone. Records go with ``delete_thread`` (everything of the thread: ``None`` after
        it; a thread created again under the id starts with no operations) and with
        ``prune``'s ``receipt_max_age`` (then ``None``: "not known", and a retry of the
        operation would apply it again). Nothing else removes one:
        ``compact_events``, dropped checkpoints and a store's own log compaction keep it
        (its ``events`` may then name numbers below the thread's floor). Operation ids are
        per thread: the same id on another thread is another operation. Tenants: like every
        read of a thread (``read``, ``messages``), it names no tenant and answers for the
        thread id; a caller serving several tenants checks the thread's tenant first."""
        ...

    async def messages(self, thread_id: str, after: int = 0, limit: int = 100) -> list[Message]:
        """Messages in order, skipping the first ``after`` (``after`` is a count, so pass the
        number already read); at most ``limit``. After a branch (``Commit.branch_from``),
        the head branch's view: ``branch_messages`` of the head's number."""
        ...

    async def branch_messages(
        self, thread_id: str, branch: int, after: int = 0, limit: int = 100
    ) -> list[Message]:
        """The message view of branch ``branch`` (0: the thread's original line), paged as
        ``messages`` pages. An abandoned branch's view stays readable: nothing a branch
        leaves behind is removed. ``NotFound`` for a branch the thread does not have; ``[]``
        for an unknown thread. Costs one index range per branch between ``branch`` and 0."""
        ...

    async def branches(self, thread_id: str) -> list[Branch]:
        """The thread's branch records, branch 1 first (``[]`` until a commit branched it);
        the last one is the head's."""
        ...

    async def history(
        self, thread_id: str, before: str | None = None, limit: int = 50
    ) -> list[CheckpointEntry]:
        """``checkpoints`` with each checkpoint's branch and commit order: newest first,
        below checkpoint id ``before`` when given (``[]`` for an unknown ``before``). One
        index range per page, whatever the length of the history."""
        ...

    async def get_checkpoint(self, thread_id: str, checkpoint_id: str) -> CheckpointEntry | None:
        """One checkpoint of the history by id, or ``None`` (never committed, dropped, pruned,
        or the thread deleted)."""
        ...

    async def events_after(
        self, thread_id: str, after_seq: int = 0, limit: int = 100
    ) -> list[Event]:
        """Events with ``seq > after_seq`` ascending, at most ``limit``. Empty for an unknown
        thread. ``ReplayUnavailable(earliest_seq)`` if some of them were compacted away."""
        ...

    async def wait_events(
        self, thread_id: str, after_seq: int = 0, limit: int = 100, timeout: float = 30.0
    ) -> list[Event]:
        """Like ``events_after`` but, when there are none yet, wait up to ``timeout`` seconds
        for a commit through any store over the same storage (other processes included).
        Returns an empty list on timeout."""
        ...

    async def list_threads(
        self, tenant: str | None = None, after: str | None = None, limit: int = 100
    ) -> list[ThreadSummary]:
        """Threads with at least one commit, ordered by id, after the cursor ``after``;
        only ``tenant``'s when given."""
        ...

    async def checkpoints(
        self, thread_id: str, before: str | None = None, limit: int = 100
    ) -> list[tuple[Checkpoint, datetime]]:
        """Checkpoint history newest first (each with the time it was committed), starting
        below checkpoint id ``before`` when given. Retention may have removed old ones."""
        ...

    async def runs(
        self, thread_id: str, before: str | None = None, limit: int = 20
    ) -> list[RunSegment]:
        """The thread's run segments newest first, at most ``limit``: its checkpoint history
        (as ``checkpoints`` reads it, below checkpoint id ``before`` when given) grouped
        into stretches of consecutive checkpoints of one run id (see ``RunSegment``). An
        unknown thread or ``before`` gives ``[]``. Costs a few index probes per segment
        returned, whatever the length of the history."""
        ...

    async def compact_events(self, thread_id: str, before_seq: int) -> int:
        """Drop events with ``seq < before_seq`` (clamped to the end of the log) and return the
        new floor: the earliest seq still readable. The floor never moves back."""
        ...

    async def delete_thread(self, thread_id: str) -> None:
        """Remove everything of the thread: checkpoints, writes, events, messages, receipts,
        inbox and staged outbox, and its claim (whose token becomes stale). Event numbers
        restart at 1; tokens stay monotonic. Deleting an unknown thread is fine. Dispatches
        are delivery state and stay."""
        ...

    async def prune(self, policy: RetentionPolicy) -> PruneReport:
        """Remove superseded data as ``policy`` allows: old checkpoints (never a thread's
        latest), old events (by raising the floor, never lowering it), old operation receipts
        and old settled dispatches."""
        ...

    async def close(self) -> None:
        """Release everything the store holds. Idempotent."""
        ...


@runtime_checkable
class DispatchQueue(Protocol):
    """The durable queue of work and the worker registry (DESIGN §3.3)."""

    async def enqueue(self, dispatch: Dispatch) -> Dispatch:
        """Persist ``dispatch`` as pending before anything acts on it and return it as stored.
        The same ``dispatch_id`` or ``dedupe_key`` with the same thread, kind, tenant and
        payload returns the existing dispatch; with anything else ``DispatchConflict``.

        ``dispatch.tenant`` (when not ``None``) is checked first: on a thread whose tenant is
        fixed to another, ``TenantMismatch`` and nothing is stored; on a thread whose tenant
        nothing fixed yet, the stored dispatch fixes it in the same atomic step."""
        ...

    async def claim_next(
        self,
        holder: str,
        ttl: float,
        limit: int = 1,
        thread_id: str | None = None,
        *,
        version: str | None = None,
        take_starts: bool = True,
    ) -> list[Lease]:
        """Atomically lease up to ``limit`` available dispatches (pending with
        ``available_at`` reached, or leased with an expired lease), highest priority first,
        then oldest first, at most one per thread and only on threads without a live claim.
        With ``thread_id``, only that thread's dispatches are considered (at most one lease):
        the dispatches of every other thread are left as they are (``wakeful run``).
        Each lease grants the thread's claim in the same step; the dispatch's token is that
        claim's token. Every claim counts one attempt; a dispatch claimed past its
        ``max_attempts`` comes with ``exhausted=True``. A lease of a dispatch with a
        ``tenant`` fixes an unbound thread's tenant; one on a thread fixed to another tenant
        is still leased (the claimant retires it without writing to the thread). Each lease
        carries the thread's ``snapshot`` read in the same atomic step, after the grant
        (saving the claimant a read).

        Versions (issue 40): a dispatch pinned to a version (``Dispatch.pinned_version``) is
        leased only by a claimer of that ``version``; an unpinned one only when
        ``take_starts`` (a draining worker passes ``False``). A lease with ``version`` pins
        the unpinned dispatch it grants (not a ``cancel``) to ``version``."""
        ...

    async def release_pins(self, pin_grace: float, limit: int = 100) -> list[Dispatch]:
        """Unpin up to ``limit`` pending (or lapsed-lease) dispatches pinned to a version of
        which no registered worker has been alive for ``pin_grace`` seconds (its last
        heartbeat, or its recorded stop, is older), recording the version in
        ``released_from``; return them as stored. Any worker may call it (no leader): the
        claimant of a released dispatch applies its target's ``on_version_change``."""
        ...

    async def migrate_runs(
        self, from_version: str, to_version: str, limit: int = 100
    ) -> list[Dispatch]:
        """Move up to ``limit`` runs of one version to another (an operator's ``wakeful runs
        migrate``): each dispatch pinned to ``from_version`` that is pending, awaiting (a
        suspended run), quarantined, or leased with a lapsed lease (never one a worker holds
        now), oldest first, is pinned to ``to_version`` (``released_from`` cleared), and its
        thread gets a ``run.migrated`` event (data: ``from``, ``to``, ``dispatch_id`` and
        the thread's latest ``run_id``), in one atomic step; return them as stored. A worker
        of ``to_version`` then continues them on its code (a changed graph structure is
        allowed: the operator said so). ``InvalidInput`` for the same version twice;
        ``NotFound`` unless a registered worker of ``to_version`` has recorded no stop.
        Call again until it returns fewer than ``limit``."""
        ...

    async def settle(self, dispatch_id: str, token: int, outcome: Outcome) -> Dispatch:
        """Record the outcome of a lease: ``Done``, ``Awaiting`` or ``Retry(delay, error)``,
        and release the thread claim if ``token`` is still current. Fenced: if the dispatch
        is not leased with ``token`` or a newer claim was issued on the thread since
        (takeover, cancel, delete), ``StaleClaim`` and nothing changes."""
        ...

    async def cancel(self, thread_id: str, reason: str) -> Dispatch:
        """Persist the intent to cancel the thread's work as a ``cancel`` dispatch, advance
        the thread's epoch (the current owner's renew, commit and settle become
        ``StaleClaim``), release its claim, and retire the thread's other open dispatches.
        A cancel already pending for the thread is returned instead of a second one."""
        ...

    async def get_dispatch(self, dispatch_id: str) -> Dispatch | None: ...

    async def list_dispatches(
        self,
        status: DispatchStatus | None = None,
        thread_id: str | None = None,
        after: str | None = None,
        limit: int = 100,
        tenant: str | None = None,
    ) -> list[Dispatch]:
        """Dispatches in enqueue order after the dispatch id ``after``, filtered. With
        ``tenant``, only those the tenant may see: on threads whose tenant is fixed to it
        (``ThreadSnapshot.tenant``), and submitted for it or for no tenant
        (``Dispatch.tenant`` is ``tenant`` or ``None``). SQL stores answer every filter from an
        index range in enqueue order, so a page costs what it returns, not what other tenants
        or statuses hold."""
        ...

    async def queue_depths(self, limit: int = 10_000) -> dict[DispatchStatus, int]:
        """How many dispatches are ``queued``, ``pending``, ``leased``, ``awaiting`` and
        ``quarantined`` (the five keys, always), each counted up to ``limit``: a count equal
        to ``limit`` means "at least". The cost is bounded by ``limit`` per status, not by
        the queue."""
        ...

    async def quarantine(self, dispatch_id: str) -> Dispatch:
        """Operator action: park exhausted work (attempts >= max_attempts, not live-leased)
        so it is not terminalised automatically; also what a worker does with a released pin
        under ``on_version_change="hold"`` (``released_from`` set, not live-leased).
        ``InvalidState`` otherwise. ``requeue`` clears ``released_from``: the operator's
        decision to run it on the current code."""
        ...

    async def requeue(self, dispatch_id: str) -> Dispatch:
        """Operator action: make quarantined work pending again with a fresh budget."""
        ...

    async def purge(self, dispatch_id: str) -> None:
        """Operator action: delete quarantined or done work for good."""
        ...

    async def register_worker(
        self, worker_id: str, *, version: str | None = None
    ) -> WorkerIdentity:
        """A new ``incarnation_id`` and a ``generation`` greater than any before for
        ``worker_id``. ``version``: the code version the incarnation runs (listed by
        ``list_workers``; a new registration replaces the previous one's)."""
        ...

    async def heartbeat(self, identity: WorkerIdentity) -> None:
        """Record that the worker is alive. ``WorkerSuperseded`` if a newer registration of
        the same worker id exists."""
        ...

    async def retire_worker(self, identity: WorkerIdentity) -> WorkerInfo:
        """Record that this incarnation stopped gracefully (its runs have settled) and return
        the registry entry with ``stopped_at`` set. Idempotent for the same incarnation: a
        second call keeps the first stop time. Fenced like ``heartbeat``: if a newer
        registration of the worker id exists, ``WorkerSuperseded`` and nothing changes (the
        newer incarnation is the one listed; a stale stop must not mark it stopped).
        ``NotFound`` if the worker id never registered. A later ``heartbeat`` of the retired
        incarnation does not clear the stop; only a new registration does."""
        ...

    async def list_workers(self) -> list[WorkerInfo]:
        """Every registered worker id's latest incarnation, by worker id."""
        ...


@runtime_checkable
class Outbox(Protocol):
    """Messages between threads (DESIGN §3.4). Entries are staged by ``Commit.outbox`` and
    consumed by ``Commit.consume``."""

    async def inbox(self, thread_id: str) -> list[InboxMessage]:
        """The thread's delivered, unconsumed messages in revision order."""
        ...

    async def relay_outbox(self, limit: int = 100) -> int:
        """Deliver up to ``limit`` staged entries: append each to its target's inbox (a
        ``message_id`` already delivered there is a no-op, also after consumption), enqueue a
        ``message`` dispatch for the target deduplicated by ``message_id``, and delete the
        staged entry. Returns how many staged entries were handled."""
        ...


@runtime_checkable
class StreamCheckpointStore(Protocol):
    """Best-effort storage of unfinished model turns (DESIGN §3.5). Every method raises
    ``StreamCheckpointError`` on failure."""

    async def get(self, run_id: str) -> StreamCheckpoint | None: ...

    async def put(self, checkpoint: StreamCheckpoint) -> None:
        """Store the run's checkpoint, replacing the previous one. Refused if
        ``checkpoint.token`` is not the current claim of ``checkpoint.thread_id``."""
        ...

    async def delete(self, run_id: str) -> None:
        """Remove the run's checkpoint; removing a missing one is fine."""
        ...

    async def discard(self, run_id: str, task_id: str, token: int) -> None:
        """Remove the run's checkpoint once the turn of ``task_id`` is committed, in one
        conditional write: only if it is that turn's (``task_id``) and was written under a
        claim token not above ``token`` (the committing attempt's, or an earlier attempt's it
        resumed from), so a newer attempt's checkpoint stays. Nothing there is fine."""
        ...


@runtime_checkable
class ScheduleStore(Protocol):
    """Schedules (issue 38) and the store's clock. Every store of ``open_store`` has them;
    ``wakeful.schedule`` and ``wakeful.fire_due`` use them. The store keeps definitions and
    the compare-and-set that advances them; computing ticks is the caller's."""

    async def store_now(self) -> datetime:
        """The store's clock now: what decides whether a dispatch's ``available_at`` is
        reached (PostgreSQL's ``store_now()``, the injected clock elsewhere)."""
        ...

    async def put_schedule(
        self, schedule: Schedule, expected_revision: int | None = None
    ) -> Schedule | None:
        """Store ``schedule`` under its name and return it as stored (``revision`` one more
        than the replaced one's, or 1; ``created_at`` kept from the replaced one;
        ``updated_at`` now). With ``expected_revision``, only if the stored schedule has that
        revision (0: only if none exists): otherwise ``None`` and nothing changes (the
        compare-and-set firers and operators race on). Without it, unconditionally."""
        ...

    async def get_schedule(self, name: str) -> Schedule | None: ...

    async def list_schedules(
        self, tenant: str | None = None, after: str | None = None, limit: int = 100
    ) -> list[Schedule]:
        """Schedules by name after the name ``after``; only ``tenant``'s when given."""
        ...

    async def delete_schedule(self, name: str) -> bool:
        """Remove the schedule; whether there was one. Dispatches it fired stay."""
        ...

    async def due_schedules(self, limit: int = 100) -> tuple[datetime, list[Schedule]]:
        """The store's clock now and the schedules not paused whose ``next_fire_at`` is at
        or before it, earliest first, at most ``limit``. A read: nothing is locked."""
        ...


@runtime_checkable
class RateLimitStore(Protocol):
    """Rate-limit buckets shared by every process on the store (issue 39, ``wakeful.limits``):
    one bucket per key, each method one atomic step on it, judged by the store's clock
    (PostgreSQL: the server's). Every backend applies the arithmetic of ``wakeful.limits``.
    Memory and file stores keep their buckets in the process (the file store has one process):
    a restart starts them full and unblocked."""

    async def take_limit(
        self,
        limit: RateLimit,
        requests: int,
        tokens: int,
        settle: int = 0,
        waiter: LimitWaiter | None = None,
    ) -> float:
        """Take ``requests`` and ``tokens`` from ``limit.key``'s bucket (created full on first
        use; ``limit``'s rates replace the stored ones) and return ``0.0``; or, while the key
        is blocked or the bucket is short, take nothing and return the seconds until the take
        could succeed. A need larger than the bucket is granted when the bucket is full and
        leaves it negative.

        ``settle``: first, in the same atomic step, pay that many tokens more as
        ``reconcile_limit`` would (earlier calls' usage minus their estimates, which the
        caller folds into its next take instead of a statement of their own); it stands
        whether or not the take is granted. ``waiter``: the run the take is for; a refused
        take records it as waiting for the key (until it asks again: ``limit_buckets``
        lists it), a granted one removes that record."""
        ...

    async def reconcile_limit(self, key: str, tokens: int) -> None:
        """Pay ``tokens`` more from the key's token bucket (negative: give back, never above
        a full bucket): the real usage minus the estimate taken. An unknown key is a no-op."""
        ...

    async def block_limit(self, key: str, seconds: float) -> None:
        """Block the key until ``seconds`` from now on the store's clock (a later block
        already set stays) and drain its bucket: every ``take_limit`` waits until then, and
        the bucket refills from empty after. Creates the key's bucket if needed."""
        ...

    async def limit_buckets(self) -> list[LimitBucket]:
        """Every key's bucket, by key, as it reads now, with the runs waiting for it."""
        ...


@runtime_checkable
class ConcurrencyStore(Protocol):
    """Concurrency keys (issue 39, ``wakeful.concurrency``): every store admits at most a
    key's limit of its dispatches at once (``Dispatch.concurrency_key``)."""

    async def concurrency_keys(self) -> list[KeyUse]:
        """Every key with admitted or waiting dispatches, by key: its limit, how many are
        admitted (``pending`` or ``leased``) and how many wait (``waiting_key``)."""
        ...


@runtime_checkable
class Store(ThreadStore, DispatchQueue, Outbox, ScheduleStore, Protocol):
    """A whole store, as ``open_store`` returns it."""

    @property
    def stream_checkpoints(self) -> StreamCheckpointStore: ...

    async def __aenter__(self) -> Store: ...

    async def __aexit__(self, *exc: object) -> None: ...


__all__ = [
    "DispatchQueue",
    "Outbox",
    "RateLimitStore",
    "ScheduleStore",
    "Store",
    "StreamCheckpointStore",
    "ThreadStore",
]
