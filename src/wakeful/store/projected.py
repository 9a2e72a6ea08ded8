"""The whole store contract over an in-memory projection.

``ProjectedStore`` validates input, plans each mutation against the projection (all checks,
in contract order), applies the resulting record and hands it to ``_persist``. Planning and
applying happen without an ``await`` in between, so every mutation is atomic with respect to
every other task of the event loop. The memory store persists nothing; the file store
appends the record to its log and acknowledges only once it is durable.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta
from typing import Self

import msgspec

from wakeful.clock import Clock, SystemClock
from wakeful.errors import (
    DispatchConflict,
    InvalidCommit,
    InvalidInput,
    InvalidState,
    NotFound,
    OperationConflict,
    ReplayUnavailable,
    StaleClaim,
    StoreClosed,
    TenantMismatch,
    ThreadBusy,
    VersionConflict,
    WorkerSuperseded,
)
from wakeful.ids import check_count, check_id, check_optional_id, check_seconds
from wakeful.records import (
    Checkpoint,
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
    ThreadSnapshot,
    ThreadSummary,
    WorkerIdentity,
    WorkerInfo,
)
from wakeful.store.projection import (
    Cancelled,
    Claimed,
    Committed,
    Compacted,
    Deleted,
    Delivered,
    Enqueued,
    Leased,
    LeaseGrant,
    Mutation,
    Pruned,
    Purged,
    Quarantined,
    Released,
    Renewed,
    Requeued,
    State,
    ThreadState,
    Unstaged,
    WorkerBeat,
    WorkerRegistered,
    payload_hash,
    settled_record,
)
from wakeful.store.validate import (
    check_claim_and_commit,
    check_commit,
    check_dispatch,
    check_listing,
    check_outcome,
    check_policy,
    check_text,
    check_token,
    drop_refusal,
    same_request,
)

CANCEL_PRIORITY = 2**31 - 1
"""Cancellation dispatches outrank all other work."""

DISPATCH_KINDS = frozenset(("start", "resume", "cancel", "message"))


class ProjectedStore:
    """The contract over ``State``; subclasses decide how records are persisted."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock: Clock = clock or SystemClock()
        self._state = State()
        self._closed = False
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}

    # ------------------------------------------------------------ plumbing

    async def _persist(self, record: Mutation) -> None:
        """Make ``record`` durable. Called after it was applied; the memory store keeps
        nothing beyond the projection."""

    def _fault(self, point: str) -> None:
        """A named point where tests inject a crash; no-op unless a subclass arms it."""

    async def _record(self, record: Mutation) -> PruneReport | None:
        result = self._state.apply(record)
        await self._persist(record)
        return result

    def _now(self) -> datetime:
        return self._clock.now()

    def now(self) -> datetime:
        """The store's clock."""
        return self._clock.now()

    def current_claim(self, thread_id: str) -> Claim | None:
        """The thread's current claim record (possibly expired), from the projection."""
        return _current_claim(self._open(), thread_id)

    def _open(self) -> State:
        if self._closed:
            raise StoreClosed()
        return self._state

    def _notify(self, thread_id: str) -> None:
        for waiter in self._waiters.pop(thread_id, ()):
            if not waiter.done():
                waiter.set_result(None)

    async def close(self) -> None:
        self._closed = True
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        self._waiters.clear()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------ claims

    async def claim(
        self, thread_id: str, holder: str, ttl: float, tenant: str | None = None
    ) -> Claim:
        check_id("thread_id", thread_id)
        check_id("holder", holder)
        ttl = check_seconds("ttl", ttl)
        check_optional_id("tenant", tenant)
        state, now = self._open(), self._now()
        _check_tenant(state, thread_id, tenant)
        claim = _grant(state, thread_id, holder, ttl, now)
        await self._record(Claimed(claim, tenant))
        return claim

    async def renew(self, thread_id: str, token: int, ttl: float) -> Claim:
        check_id("thread_id", thread_id)
        check_token(token)
        ttl = check_seconds("ttl", ttl)
        state, now = self._open(), self._now()
        current = _current_claim(state, thread_id)
        if current is None or current.token != token:
            raise StaleClaim(thread_id, token, current.token if current else None)
        expires = now + timedelta(seconds=ttl)
        await self._record(Renewed(thread_id, token, expires))
        return msgspec.structs.replace(current, expires_at=expires)

    async def release(self, thread_id: str, token: int) -> None:
        check_id("thread_id", thread_id)
        check_token(token)
        current = _current_claim(self._open(), thread_id)
        if current is not None and current.token == token:
            await self._record(Released(thread_id, token))

    # ------------------------------------------------------------ commits

    async def commit(self, thread_id: str, commit: Commit) -> Receipt:
        commit = check_commit(thread_id, commit)
        state, now = self._open(), self._now()
        t = state.threads.get(thread_id)
        # 1. fencing, always first
        current = t.claim if t is not None else None
        # only a keyed operation is ever compared by its payload's hash
        digest = payload_hash(commit) if commit.operation_id is not None else ""
        if current is None or current.token != commit.token:
            replayed = _released_replay(state, thread_id, commit, digest)
            if replayed is not None:
                return replayed
            raise StaleClaim(thread_id, commit.token, current.token if current else None)
        assert t is not None
        prepared = self._prepare(state, t, commit, digest, now)
        if isinstance(prepared, Receipt):
            return prepared
        await self._record(prepared)
        if commit.events:
            self._notify(thread_id)
        return prepared.receipt

    async def claim_and_commit(
        self, thread_id: str, holder: str, ttl: float, commit: Commit
    ) -> tuple[Claim, Receipt]:
        ttl, commit = check_claim_and_commit(thread_id, holder, ttl, commit)
        state, now = self._open(), self._now()
        known = state.threads.get(thread_id)
        # the tenant first: a busy refusal would name another tenant's holder
        cp = commit.checkpoint
        if cp is not None and known is not None and known.foreign_checkpoint(cp.tenant):
            raise TenantMismatch(thread_id)
        claim = _grant(state, thread_id, holder, ttl, now)
        commit = msgspec.structs.replace(commit, token=claim.token)
        digest = payload_hash(commit) if commit.operation_id is not None else ""
        t = state.threads.get(thread_id) or ThreadState(thread_id)
        prepared = self._prepare(state, t, commit, digest, now, claimed=claim)
        if isinstance(prepared, Receipt):
            await self._record(Claimed(claim))
            return claim, prepared
        await self._record(prepared)
        if commit.events:
            self._notify(thread_id)
        return claim, prepared.receipt

    def _prepare(
        self,
        state: State,
        t: ThreadState,
        commit: Commit,
        digest: str,
        now: datetime,
        claimed: Claim | None = None,
    ) -> Committed | Receipt:
        """Steps 2-5 of ``commit`` for the claim holder: the recorded receipt of a retried
        operation, or the record to apply. Raises the refusal; changes nothing."""
        thread_id = t.thread_id
        # 2. a retried operation
        if commit.operation_id is not None and commit.operation_id in t.receipts:
            recorded_hash, receipt, _ = t.receipts[commit.operation_id]
            if recorded_hash != digest:
                raise OperationConflict(thread_id, commit.operation_id)
            return receipt
        # 3. the view the commit was prepared against
        if commit.expected_version is not None and commit.expected_version != t.version:
            raise VersionConflict(thread_id, commit.expected_version, t.version)
        latest = _latest_id(t)
        if commit.checkpoint is not None and commit.checkpoint.parent != latest:
            raise VersionConflict(thread_id, commit.checkpoint.parent, latest, "parent checkpoint")
        # 4. consistency with the thread
        _check_commit_against(t, commit)
        # 5. the dispatch it settles
        settled = None
        if commit.settle is not None:
            d = state.dispatches.get(commit.settle.dispatch_id)
            if d is None:
                raise NotFound("dispatch", commit.settle.dispatch_id)
            if d.thread_id != thread_id:
                raise InvalidCommit(
                    thread_id,
                    f"it settles dispatch {d.dispatch_id!r}, which belongs to thread "
                    f"{d.thread_id!r}",
                )
            epoch = claimed.token if claimed is not None else state.epochs.get(thread_id, 0)
            if d.status != "leased" or d.token != commit.token or epoch != commit.token:
                raise StaleClaim(thread_id, commit.token, epoch)
            settled = settled_record(d, commit.token, commit.settle.outcome, now)
        resulting = commit.checkpoint.id if commit.checkpoint is not None else latest
        first = t.next_seq
        receipt = Receipt(
            thread_id=thread_id,
            version=t.version + 1,
            checkpoint_id=resulting,
            events=tuple(range(first, first + len(commit.events))),
            operation_id=commit.operation_id,
        )
        return Committed(thread_id, commit, receipt, digest, now, claim=claimed, settled=settled)

    # ------------------------------------------------------------ reads

    async def read(self, thread_id: str) -> ThreadSnapshot | None:
        check_id("thread_id", thread_id)
        t = self._open().threads.get(thread_id)
        return None if t is None else _snapshot(t)

    async def messages(self, thread_id: str, after: int = 0, limit: int = 100) -> list[Message]:
        check_id("thread_id", thread_id)
        after = check_count("after", after, maximum=2**62)
        limit = check_count("limit", limit, minimum=1)
        t = self._open().threads.get(thread_id)
        return [] if t is None else t.messages[after : after + limit]

    async def events_after(
        self, thread_id: str, after_seq: int = 0, limit: int = 100
    ) -> list[Event]:
        check_id("thread_id", thread_id)
        after_seq = check_count("after_seq", after_seq, maximum=2**62)
        limit = check_count("limit", limit, minimum=1)
        t = self._open().threads.get(thread_id)
        if t is None:
            return []
        if after_seq < t.floor - 1:
            raise ReplayUnavailable(thread_id, after_seq, t.floor)
        start = after_seq + 1 - t.floor
        return t.events[start : start + limit]

    async def wait_events(
        self, thread_id: str, after_seq: int = 0, limit: int = 100, timeout: float = 30.0
    ) -> list[Event]:
        timeout = check_seconds("timeout", timeout, allow_zero=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            found = await self.events_after(thread_id, after_seq, limit)
            remaining = deadline - loop.time()
            if found or remaining <= 0 or self._closed:
                return found
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.setdefault(thread_id, set()).add(waiter)
            try:
                await asyncio.wait_for(waiter, remaining)
            except TimeoutError:
                return await self.events_after(thread_id, after_seq, limit)
            finally:
                waiters = self._waiters.get(thread_id)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del self._waiters[thread_id]

    async def list_threads(
        self, tenant: str | None = None, after: str | None = None, limit: int = 100
    ) -> list[ThreadSummary]:
        check_optional_id("tenant", tenant)
        check_optional_id("after", after)
        limit = check_count("limit", limit, minimum=1)
        rows = sorted(
            (
                t
                for t in self._open().threads.values()
                if t.version > 0
                and (tenant is None or t.tenant == tenant)
                and (after is None or t.thread_id > after)
            ),
            key=lambda t: t.thread_id,
        )[:limit]
        return [_summary(t) for t in rows]

    async def checkpoints(
        self, thread_id: str, before: str | None = None, limit: int = 100
    ) -> list[tuple[Checkpoint, datetime]]:
        check_id("thread_id", thread_id)
        check_optional_id("before", before)
        limit = check_count("limit", limit, minimum=1)
        t = self._open().threads.get(thread_id)
        if t is None:
            return []
        history = list(reversed(t.history))
        if before is not None:
            ids = [cp.id for cp, _ in history]
            history = history[ids.index(before) + 1 :] if before in ids else []
        return history[:limit]

    # ------------------------------------------------------------ maintenance

    async def compact_events(self, thread_id: str, before_seq: int) -> int:
        check_id("thread_id", thread_id)
        before_seq = check_count("before_seq", before_seq, maximum=2**62)
        t = self._open().threads.get(thread_id)
        if t is None:
            return 1
        floor = max(t.floor, min(before_seq, t.next_seq))
        if floor != t.floor:
            await self._record(Compacted(thread_id, floor))
        return floor

    async def delete_thread(self, thread_id: str) -> None:
        check_id("thread_id", thread_id)
        state = self._open()
        staged = any(e.source_thread == thread_id for e in state.outbox.values())
        if thread_id not in state.threads and not staged:
            return
        await self._record(Deleted(thread_id, state.epochs.get(thread_id, 0) + 1))
        self._notify(thread_id)

    async def prune(self, policy: RetentionPolicy) -> PruneReport:
        check_policy(policy)
        self._open()
        report = await self._record(Pruned(policy, self._now()))
        assert report is not None
        return report

    # ------------------------------------------------------------ queue

    async def enqueue(self, dispatch: Dispatch) -> Dispatch:
        d = check_dispatch(dispatch)
        if d.kind not in DISPATCH_KINDS:
            raise InvalidInput("kind", f"must be one of {sorted(DISPATCH_KINDS)}")
        state, now = self._open(), self._now()
        _check_tenant(state, d.thread_id, d.tenant)
        existing = state.dispatches.get(d.dispatch_id)
        if existing is None and d.dedupe_key is not None:
            by_key = state.dedupe.get(d.dedupe_key)
            existing = state.dispatches.get(by_key) if by_key is not None else None
        if existing is not None:
            if same_request(existing, d):
                return existing
            key = "dispatch_id" if existing.dispatch_id == d.dispatch_id else "dedupe_key"
            raise DispatchConflict(d.dispatch_id, existing.dispatch_id, key)
        stored = msgspec.structs.replace(
            d,
            available_at=d.available_at or now,
            status="pending",
            attempts=0,
            token=None,
            holder=None,
            lease_until=None,
            last_error=None,
            created_at=now,
            updated_at=now,
        )
        await self._record(Enqueued(stored))
        return stored

    async def claim_next(self, holder: str, ttl: float, limit: int = 1) -> list[Lease]:
        check_id("holder", holder)
        ttl = check_seconds("ttl", ttl)
        limit = check_count("limit", limit, minimum=1, maximum=1000)
        state, now = self._open(), self._now()
        expires = now + timedelta(seconds=ttl)
        grants: list[LeaseGrant] = []
        taken: set[str] = set()
        for _, _, did in state.claimable:  # already in claim order
            if len(grants) == limit:
                break
            d = state.dispatches[did]
            if d.thread_id in taken or not _available(state, d, now):
                continue
            taken.add(d.thread_id)
            token = state.epochs.get(d.thread_id, 0) + 1
            grants.append(
                LeaseGrant(
                    d.dispatch_id,
                    Claim(thread_id=d.thread_id, holder=holder, token=token, expires_at=expires),
                )
            )
        if not grants:
            return []
        await self._record(Leased(tuple(grants), now))
        leases = []
        for grant in grants:
            d = state.dispatches[grant.dispatch_id]
            leases.append(
                Lease(
                    dispatch=d,
                    claim=grant.claim,
                    exhausted=d.attempts > d.max_attempts,
                    snapshot=_snapshot(state.threads[d.thread_id]),
                )
            )
        return leases

    async def settle(self, dispatch_id: str, token: int, outcome: Outcome) -> Dispatch:
        check_id("dispatch_id", dispatch_id)
        check_token(token)
        check_outcome(outcome)
        state, now = self._open(), self._now()
        d = state.dispatches.get(dispatch_id)
        if d is None:
            raise NotFound("dispatch", dispatch_id)
        epoch = state.epochs.get(d.thread_id, 0)
        if d.status != "leased" or d.token != token or epoch != token:
            current = _current_claim(state, d.thread_id)
            raise StaleClaim(d.thread_id, token, current.token if current else None)
        await self._record(settled_record(d, token, outcome, now))
        return state.dispatches[dispatch_id]

    async def cancel(self, thread_id: str, reason: str) -> Dispatch:
        check_id("thread_id", thread_id)
        check_text("reason", reason)
        state, now = self._open(), self._now()
        for did in state.open_by_thread.get(thread_id, ()):
            d = state.dispatches[did]
            if d.kind == "cancel" and d.status == "pending":
                return d
        dispatch = cancel_intent(thread_id, reason, now)
        epoch = state.epochs.get(thread_id, 0) + 1
        await self._record(Cancelled(thread_id, reason, epoch, dispatch, now))
        return state.dispatches[dispatch.dispatch_id]

    async def get_dispatch(self, dispatch_id: str) -> Dispatch | None:
        check_id("dispatch_id", dispatch_id)
        return self._open().dispatches.get(dispatch_id)

    async def list_dispatches(
        self,
        status: DispatchStatus | None = None,
        thread_id: str | None = None,
        after: str | None = None,
        limit: int = 100,
    ) -> list[Dispatch]:
        limit = check_listing(status, thread_id, after, limit)
        state = self._open()
        floor = state.dispatch_order.get(after, 0) if after is not None else 0
        if after is not None and after not in state.dispatch_order:
            raise NotFound("dispatch cursor", after)
        rows = [
            d
            for d in state.dispatches.values()
            if state.dispatch_order[d.dispatch_id] > floor
            and (status is None or d.status == status)
            and (thread_id is None or d.thread_id == thread_id)
        ]
        rows.sort(key=lambda d: state.dispatch_order[d.dispatch_id])
        return rows[:limit]

    async def quarantine(self, dispatch_id: str) -> Dispatch:
        state, d = self._dispatch(dispatch_id)
        if d.status == "quarantined":
            return d
        now = self._now()
        live = d.status == "leased" and _lease_live(state, d, now)
        if d.status not in ("pending", "leased") or live or not d.exhausted:
            raise InvalidState(
                "dispatch",
                dispatch_id,
                f"{d.status} after {d.attempts} of {d.max_attempts} attempts"
                + (" with a live lease" if live else ""),
                "only exhausted work that no worker holds can be quarantined",
            )
        await self._record(Quarantined(dispatch_id, now))
        return state.dispatches[dispatch_id]

    async def requeue(self, dispatch_id: str) -> Dispatch:
        state, d = self._dispatch(dispatch_id)
        if d.status != "quarantined":
            raise InvalidState(
                "dispatch", dispatch_id, d.status, "only quarantined work is requeued"
            )
        await self._record(Requeued(dispatch_id, self._now()))
        return state.dispatches[dispatch_id]

    async def purge(self, dispatch_id: str) -> None:
        _, d = self._dispatch(dispatch_id)
        if d.status not in ("quarantined", "done"):
            raise InvalidState(
                "dispatch", dispatch_id, d.status, "only quarantined or done work can be purged"
            )
        await self._record(Purged(dispatch_id))

    def _dispatch(self, dispatch_id: str) -> tuple[State, Dispatch]:
        check_id("dispatch_id", dispatch_id)
        state = self._open()
        d = state.dispatches.get(dispatch_id)
        if d is None:
            raise NotFound("dispatch", dispatch_id)
        return state, d

    # ------------------------------------------------------------ workers

    async def register_worker(self, worker_id: str) -> WorkerIdentity:
        check_id("worker_id", worker_id)
        state, now = self._open(), self._now()
        previous = state.workers.get(worker_id)
        info = WorkerInfo(
            worker_id=worker_id,
            incarnation_id=uuid.uuid4().hex,
            generation=(previous.generation if previous else 0) + 1,
            registered_at=now,
            last_heartbeat=now,
        )
        await self._record(WorkerRegistered(info))
        return WorkerIdentity(
            worker_id=worker_id, incarnation_id=info.incarnation_id, generation=info.generation
        )

    async def heartbeat(self, identity: WorkerIdentity) -> None:
        check_id("worker_id", identity.worker_id)
        state = self._open()
        current = state.workers.get(identity.worker_id)
        if current is None:
            raise NotFound("worker", identity.worker_id)
        if (current.generation, current.incarnation_id) != (
            identity.generation,
            identity.incarnation_id,
        ):
            raise WorkerSuperseded(identity.worker_id, identity.generation, current.generation)
        await self._record(WorkerBeat(identity.worker_id, self._now()))

    async def list_workers(self) -> list[WorkerInfo]:
        return sorted(self._open().workers.values(), key=lambda w: w.worker_id)

    # ------------------------------------------------------------ inbox / outbox

    async def inbox(self, thread_id: str) -> list[InboxMessage]:
        check_id("thread_id", thread_id)
        t = self._open().threads.get(thread_id)
        return [] if t is None else sorted(t.inbox.values(), key=lambda m: m.revision)

    async def relay_outbox(self, limit: int = 100) -> int:
        limit = check_count("limit", limit, minimum=1)
        state = self._open()
        handled = 0
        for stage_seq in sorted(state.outbox)[:limit]:
            staged = state.outbox.get(stage_seq)
            if staged is None:
                continue
            entry, now = staged.entry, self._now()
            target = state.threads.get(entry.target_thread)
            message = None
            if target is None or entry.message_id not in target.delivered:
                message = InboxMessage(
                    message_id=entry.message_id,
                    correlation_id=entry.correlation_id,
                    payload=entry.payload,
                    revision=(target.inbox_revision if target else 0) + 1,
                    at=now,
                    source_thread=staged.source_thread,
                )
            dispatch_id = message_dispatch_id(entry.target_thread, entry.message_id)
            dispatch = None
            if dispatch_id not in state.dispatches:
                dispatch = Dispatch(
                    dispatch_id=dispatch_id,
                    thread_id=entry.target_thread,
                    kind="message",
                    payload={"message_id": entry.message_id},
                    dedupe_key=dispatch_id,
                    available_at=now,
                    created_at=now,
                    updated_at=now,
                )
            await self._record(Delivered(stage_seq, entry.target_thread, message, dispatch))
            self._fault("relay.after_append")
            await self._record(Unstaged(stage_seq))
            handled += 1
        return handled


# ---------------------------------------------------------------- helpers


def message_dispatch_id(target_thread: str, message_id: str) -> str:
    """The id of the ``message`` dispatch for one delivery: stable, in the id alphabet."""
    import hashlib

    digest = hashlib.sha256(f"{target_thread}\x00{message_id}".encode()).hexdigest()[:40]
    return f"msg-{digest}"


def _latest_id(t: ThreadState | None) -> str | None:
    if t is None:
        return None
    latest = t.latest
    return latest.id if latest is not None else None


def cancel_intent(thread_id: str, reason: str, now: datetime) -> Dispatch:
    """The ``cancel`` dispatch that ``cancel`` persists (every store builds it here)."""
    return Dispatch(
        dispatch_id=f"cancel-{uuid.uuid4().hex}",
        thread_id=thread_id,
        kind="cancel",
        payload={"reason": reason},
        priority=CANCEL_PRIORITY,
        available_at=now,
        created_at=now,
        updated_at=now,
    )


def _grant(state: State, thread_id: str, holder: str, ttl: float, now: datetime) -> Claim:
    """The claim ``claim`` would grant now (not yet recorded); ``ThreadBusy`` while a live
    claim exists."""
    t = state.threads.get(thread_id)
    if t is not None and t.claim is not None and t.claim.is_live(now):
        raise ThreadBusy(thread_id, t.claim.holder, _latest_id(t), t.claim.expires_at)
    return Claim(
        thread_id=thread_id,
        holder=holder,
        token=state.epochs.get(thread_id, 0) + 1,
        expires_at=now + timedelta(seconds=ttl),
    )


def _released_replay(state: State, thread_id: str, commit: Commit, digest: str) -> Receipt | None:
    """The receipt of a retried operation whose commit ended its own claim: no claim was
    granted after ``commit.token`` and the operation is recorded with the same payload."""
    t = state.threads.get(thread_id)
    if t is None or commit.operation_id is None or t.claim is not None:
        return None
    if state.epochs.get(thread_id, 0) != commit.token:
        return None
    recorded = t.receipts.get(commit.operation_id)
    if recorded is None or recorded[0] != digest:
        return None
    return recorded[1]


def _snapshot(t: ThreadState) -> ThreadSnapshot:
    return ThreadSnapshot(
        thread_id=t.thread_id,
        version=t.version,
        checkpoint=t.latest,
        writes=tuple(t.writes.values()),
        claim=t.claim,
        tenant=t.tenant,
        message_count=len(t.messages),
        last_seq=t.next_seq - 1,
        event_floor=t.floor,
    )


def _check_tenant(state: State, thread_id: str, tenant: str | None) -> None:
    """``TenantMismatch`` for a write naming ``tenant`` on a thread fixed to another."""
    t = state.threads.get(thread_id)
    if t is not None and t.foreign(tenant):
        raise TenantMismatch(thread_id)


def _current_claim(state: State, thread_id: str) -> Claim | None:
    t = state.threads.get(thread_id)
    return t.claim if t is not None else None


def _lease_live(state: State, d: Dispatch, now: datetime) -> bool:
    claim = _current_claim(state, d.thread_id)
    return claim is not None and claim.token == d.token and claim.is_live(now)


def _available(state: State, d: Dispatch, now: datetime) -> bool:
    claim = _current_claim(state, d.thread_id)
    if claim is not None and claim.is_live(now):
        return False
    if d.status == "pending":
        return d.available_at is None or d.available_at <= now
    return d.status == "leased"


def _check_commit_against(t: ThreadState, commit: Commit) -> None:
    tid = t.thread_id
    resulting = commit.checkpoint.id if commit.checkpoint is not None else _latest_id(t)
    if commit.checkpoint is not None:
        if commit.checkpoint.id in t.checkpoint_ids:
            raise InvalidCommit(tid, f"checkpoint id {commit.checkpoint.id!r} was used before")
        if t.foreign_checkpoint(commit.checkpoint.tenant):
            raise TenantMismatch(tid)
    for dropped in commit.drop_checkpoints:
        if dropped == resulting or dropped not in t.checkpoint_ids:
            raise InvalidCommit(tid, drop_refusal(dropped, resulting))
    existing_tasks = set() if commit.checkpoint is not None else set(t.writes)
    for write in commit.writes:
        if write.checkpoint_id != resulting:
            raise InvalidCommit(
                tid,
                f"write of task {write.task_id!r} names checkpoint {write.checkpoint_id!r} but "
                f"the latest after this commit is {resulting!r}",
            )
        if write.task_id in existing_tasks:
            raise InvalidCommit(tid, f"task {write.task_id!r} already has a write")
        existing_tasks.add(write.task_id)
    seen: set[str] = set()
    for message in commit.messages:
        if message.id in t.message_ids or message.id in seen:
            raise InvalidCommit(tid, f"message id {message.id!r} is already on the thread")
        seen.add(message.id)
    staged: set[str] = set()
    for entry in commit.outbox:
        if entry.message_id in staged:
            raise InvalidCommit(tid, f"outbox message id {entry.message_id!r} appears twice")
        staged.add(entry.message_id)
    consumed: set[str] = set()
    for message_id in commit.consume:
        if message_id not in t.inbox or message_id in consumed:
            raise InvalidCommit(tid, f"inbox message {message_id!r} is not waiting to be consumed")
        consumed.add(message_id)


def _summary(t: ThreadState) -> ThreadSummary:
    latest = t.latest
    assert t.updated_at is not None
    return ThreadSummary(
        thread_id=t.thread_id,
        tenant=t.tenant,
        version=t.version,
        checkpoint_id=latest.id if latest else None,
        status=latest.status if latest else None,
        message_count=len(t.messages),
        last_seq=t.next_seq - 1,
        updated_at=t.updated_at,
    )
