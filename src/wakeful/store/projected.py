"""The whole store contract over an in-memory projection.

``ProjectedStore`` validates input, plans each mutation against the projection (all checks,
in contract order), applies the resulting record and hands it to ``_persist``. Planning and
applying happen without an ``await`` in between, so every mutation is atomic with respect to
every other task of the event loop. The memory store persists nothing; the file store
appends the record to its log and acknowledges only once it is durable.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import msgspec

from wakeful.errors import (
    InvalidCommit,
    NotFound,
    OperationConflict,
    ReplayUnavailable,
    StaleClaim,
    TenantMismatch,
    ThreadBusy,
    VersionConflict,
)
from wakeful.ids import check_count, check_id, check_optional_id, check_seconds
from wakeful.records import (
    Branch,
    Checkpoint,
    CheckpointEntry,
    Claim,
    Commit,
    Event,
    Message,
    PruneReport,
    Receipt,
    RetentionPolicy,
    RunSegment,
    ThreadSnapshot,
    ThreadSummary,
)
from wakeful.store.branching import branch_of, page_ranges, view_length, view_segments
from wakeful.store.kinds import CANCEL_PRIORITY, DISPATCH_KINDS
from wakeful.store.projected_core import (
    check_thread_tenant,
    claim_of,
    latest_checkpoint_id,
    snapshot_of,
)
from wakeful.store.projected_queue import ProjectedQueue, cancel_intent, message_dispatch_id
from wakeful.store.projected_schedules import ProjectedSchedules
from wakeful.store.projection import (
    Claimed,
    Committed,
    Compacted,
    Deleted,
    Pruned,
    Released,
    Renewed,
    State,
    ThreadState,
    settled_record,
)
from wakeful.store.segments import run_segments
from wakeful.store.validate import (
    check_policy,
    check_token,
    drop_refusal,
    encode_claim_and_commit,
    encode_commit,
    payload_hash,
)


class ProjectedStore(ProjectedQueue, ProjectedSchedules):
    """The whole contract over ``State``; subclasses decide how records are persisted."""

    async def claim(
        self, thread_id: str, holder: str, ttl: float, tenant: str | None = None
    ) -> Claim:
        check_id("thread_id", thread_id)
        check_id("holder", holder)
        ttl = check_seconds("ttl", ttl)
        check_optional_id("tenant", tenant)
        state, now = self._open(), self._now()
        check_thread_tenant(state, thread_id, tenant)
        claim = _grant(state, thread_id, holder, ttl, now)
        await self._record(Claimed(claim, tenant))
        return claim

    async def renew(self, thread_id: str, token: int, ttl: float) -> Claim:
        check_id("thread_id", thread_id)
        check_token(token)
        ttl = check_seconds("ttl", ttl)
        state, now = self._open(), self._now()
        current = claim_of(state, thread_id)
        if current is None or current.token != token:
            raise StaleClaim(thread_id, token, current.token if current else None)
        expires = now + timedelta(seconds=ttl)
        await self._record(Renewed(thread_id, token, expires))
        return msgspec.structs.replace(current, expires_at=expires)

    async def release(self, thread_id: str, token: int) -> None:
        check_id("thread_id", thread_id)
        check_token(token)
        current = claim_of(self._open(), thread_id)
        if current is not None and current.token == token:
            await self._record(Released(thread_id, token))

    # ------------------------------------------------------------ commits

    async def commit(self, thread_id: str, commit: Commit) -> Receipt:
        encoded = encode_commit(thread_id, commit)
        commit = encoded.commit
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
            raise StaleClaim(
                thread_id,
                commit.token,
                current.token if current else None,
                _applied(t, commit.operation_id, digest),
            )
        assert t is not None
        prepared = self._prepare(state, t, commit, digest, now)
        if isinstance(prepared, Receipt):
            return prepared
        await self._record_commit(prepared, encoded.body)
        if commit.events:
            self._notify(thread_id)
        return prepared.receipt

    async def claim_and_commit(
        self, thread_id: str, holder: str, ttl: float, commit: Commit
    ) -> tuple[Claim, Receipt]:
        ttl, encoded = encode_claim_and_commit(thread_id, holder, ttl, commit)
        commit = encoded.commit
        state, now = self._open(), self._now()
        known = state.threads.get(thread_id)
        # the tenant first: a busy refusal would name another tenant's holder
        cp = commit.checkpoint
        if cp is not None and known is not None and known.foreign_checkpoint(cp.tenant):
            raise TenantMismatch(thread_id)
        claim = _grant(state, thread_id, holder, ttl, now)
        encoded = encoded.with_token(claim.token)
        commit = encoded.commit
        digest = payload_hash(commit) if commit.operation_id is not None else ""
        t = state.threads.get(thread_id) or ThreadState(thread_id)
        prepared = self._prepare(state, t, commit, digest, now, claimed=claim)
        if isinstance(prepared, Receipt):
            await self._record(Claimed(claim))
            return claim, prepared
        await self._record_commit(prepared, encoded.body)
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
        latest = latest_checkpoint_id(t)
        if commit.branch_from is not None:
            _check_branch(t, commit.branch_from, commit.branch_messages)
        elif commit.checkpoint is not None and commit.checkpoint.parent != latest:
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
        return None if t is None else snapshot_of(t)

    async def operation(self, thread_id: str, operation_id: str) -> Receipt | None:
        check_id("thread_id", thread_id)
        check_id("operation_id", operation_id)
        t = self._open().threads.get(thread_id)
        recorded = None if t is None else t.receipts.get(operation_id)
        return None if recorded is None else recorded[1]

    async def messages(self, thread_id: str, after: int = 0, limit: int = 100) -> list[Message]:
        check_id("thread_id", thread_id)
        after = check_count("after", after, maximum=2**62)
        limit = check_count("limit", limit, minimum=1)
        t = self._open().threads.get(thread_id)
        if t is None:
            return []
        if not t.branches:
            return t.messages[after : after + limit]
        return _view_page(t, len(t.branches), after, limit)

    async def branch_messages(
        self, thread_id: str, branch: int, after: int = 0, limit: int = 100
    ) -> list[Message]:
        check_id("thread_id", thread_id)
        branch = check_count("branch", branch, maximum=2**62)
        after = check_count("after", after, maximum=2**62)
        limit = check_count("limit", limit, minimum=1)
        t = self._open().threads.get(thread_id)
        return [] if t is None else _view_page(t, branch, after, limit)

    async def branches(self, thread_id: str) -> list[Branch]:
        check_id("thread_id", thread_id)
        t = self._open().threads.get(thread_id)
        return [] if t is None else list(t.branches)

    async def history(
        self, thread_id: str, before: str | None = None, limit: int = 50
    ) -> list[CheckpointEntry]:
        check_id("thread_id", thread_id)
        check_optional_id("before", before)
        limit = check_count("limit", limit, minimum=1)
        t = self._open().threads.get(thread_id)
        if t is None:
            return []
        end = _history_end(t, before)
        return [_entry(t, i) for i in range(end - 1, max(end - limit, 0) - 1, -1)]

    async def get_checkpoint(self, thread_id: str, checkpoint_id: str) -> CheckpointEntry | None:
        check_id("thread_id", thread_id)
        check_id("checkpoint_id", checkpoint_id)
        t = self._open().threads.get(thread_id)
        at = None if t is None else t.index_of(checkpoint_id)
        return None if t is None or at is None else _entry(t, at)

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
        end = _history_end(t, before)
        return t.history[max(end - limit, 0) : end][::-1]

    async def runs(
        self, thread_id: str, before: str | None = None, limit: int = 20
    ) -> list[RunSegment]:
        check_id("thread_id", thread_id)
        check_optional_id("before", before)
        limit = check_count("limit", limit, minimum=1)
        t = self._open().threads.get(thread_id)
        if t is None:
            return []
        end = _history_end(t, before)
        return run_segments(t.history[:end], limit)

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


# ---------------------------------------------------------------- helpers


def _grant(state: State, thread_id: str, holder: str, ttl: float, now: datetime) -> Claim:
    """The claim ``claim`` would grant now (not yet recorded); ``ThreadBusy`` while a live
    claim exists."""
    t = state.threads.get(thread_id)
    if t is not None and t.claim is not None and t.claim.is_live(now):
        raise ThreadBusy(thread_id, t.claim.holder, latest_checkpoint_id(t), t.claim.expires_at)
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


def _applied(t: ThreadState | None, operation_id: str | None, digest: str) -> Receipt | None:
    """The receipt of ``operation_id`` if the thread recorded it with this payload: what a
    ``StaleClaim`` for a retry of an applied commit carries (``applied_receipt``)."""
    if t is None or operation_id is None:
        return None
    recorded = t.receipts.get(operation_id)
    return recorded[1] if recorded is not None and recorded[0] == digest else None


def _history_end(t: ThreadState, before: str | None) -> int:
    """Where a page of history below ``before`` ends in ``t.history`` (0 for an unknown
    ``before``: an empty page)."""
    if before is None:
        return len(t.history)
    at = t.index_of(before)
    return 0 if at is None else at


def _entry(t: ThreadState, at: int) -> CheckpointEntry:
    cp, committed_at = t.history[at]
    order = t.orders[at]
    return CheckpointEntry(
        checkpoint=cp,
        committed_at=committed_at,
        branch=branch_of(t.branch_orders, order),
        order=order,
    )


def _view_page(t: ThreadState, branch: int, after: int, limit: int) -> list[Message]:
    found: list[Message] = []
    for first, count in page_ranges(view_segments(t.branches, branch), after, limit):
        assert count is not None
        found += t.messages[first : first + count]
    return found


def _check_branch(t: ThreadState, fork_point: str, messages: int) -> None:
    """Step 3 of a branching commit: the fork point is in the history and the branch keeps
    no more messages than the fork point's branch view has."""
    if fork_point not in t.cp_order:
        raise InvalidCommit(
            t.thread_id,
            f"branch_from names checkpoint {fork_point!r}, which is not in the thread's "
            "history (never committed, dropped or pruned)",
        )
    shown = view_length(view_segments(t.branches, t.branch_at(fork_point)), len(t.messages))
    if messages > shown:
        raise InvalidCommit(
            t.thread_id,
            f"branch_messages {messages} is more than the {shown} messages of the fork "
            f"point's branch",
        )


def _check_commit_against(t: ThreadState, commit: Commit) -> None:
    tid = t.thread_id
    resulting = commit.checkpoint.id if commit.checkpoint is not None else latest_checkpoint_id(t)
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
        message_count=t.message_count,
        last_seq=t.next_seq - 1,
        updated_at=t.updated_at,
    )


__all__ = [
    "CANCEL_PRIORITY",
    "DISPATCH_KINDS",
    "ProjectedStore",
    "cancel_intent",
    "message_dispatch_id",
]
