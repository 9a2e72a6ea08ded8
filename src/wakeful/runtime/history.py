"""Time travel's reads and ``fork``: a thread's checkpoint history with its branches, one
checkpoint with the messages as of it, and a new thread copied from a checkpoint.

Everything here needs only a store (no graph): the HTTP API, the command line and the client
are thin layers over these functions (docs/time-travel.md). Replaying, editing state and
regenerating need a graph and are ``Runtime.replay`` / ``Runtime.update_state`` (``travel``).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import msgspec

from wakeful.errors import (
    InvalidState,
    NotFound,
    TenantMismatch,
    VersionConflict,
)
from wakeful.ids import check_count, check_id, check_optional_id
from wakeful.records import (
    Branch,
    Checkpoint,
    CheckpointEntry,
    Commit,
    EventDraft,
    Message,
    RunStatus,
    ThreadSnapshot,
)
from wakeful.store.contract import ThreadStore

MAX_HISTORY_PAGE = 1000
FORK_TTL = 30.0
"""Seconds the claim ``fork`` takes on the new thread lives (the fork is one write)."""


class HistoryEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One checkpoint of a thread's history, as ``history`` lists it.

    ``step``: the superstep it ended (``metadata["step"]``); ``nodes``: the nodes whose tasks
    produced it (empty for a run's first checkpoint); ``source``: ``input`` (a run's first),
    ``loop`` (a superstep), ``replay`` (a run started from an earlier checkpoint),
    ``update`` (``Runtime.update_state``) or ``fork`` (``fork``'s first checkpoint);
    ``branch``: the branch it was committed on (0: the original line); ``current``: it is
    on the head's line (the head, or an ancestor of it), else on an abandoned branch;
    ``head``: it is the thread's latest checkpoint; ``messages``: the message count as of it
    (``None`` when it was committed without one, by an older wakeful or a LangGraph saver);
    ``subgraphs``: what ran inside the subgraph nodes that produced it, by node path
    (``{"research": {"graph": "research", "steps": [["plan"], ["search"]]}}``; a subgraph
    inside it has its own entry, ``research/deep``)."""

    checkpoint_id: str
    parent: str | None
    run_id: str
    status: RunStatus
    step: int | None
    nodes: list[str]
    source: str | None
    branch: int
    current: bool
    head: bool
    created_at: datetime
    messages: int | None
    subgraphs: dict[str, Any] = {}


class CheckpointView(msgspec.Struct, frozen=True, kw_only=True):
    """One checkpoint in full (state, frontier, metadata) with its ``HistoryEntry``; its
    messages page through ``messages_at``."""

    entry: HistoryEntry
    checkpoint: Checkpoint


async def _snapshot(store: ThreadStore, thread_id: str, tenant: str | None) -> ThreadSnapshot:
    """The thread, checked against ``tenant`` (when given) before anything of it is
    shown; ``NotFound`` for a thread with no commit."""
    snap = await store.read(thread_id)
    if snap is not None and tenant is not None and snap.tenant_bound and snap.tenant != tenant:
        raise TenantMismatch(thread_id)
    if snap is None or snap.checkpoint is None:
        raise NotFound("thread", thread_id)
    return snap


class _Lineage:
    """Which checkpoints are on the head's line: the head branch's, and each ancestor
    branch's up to (and with) the fork point its child continued from."""

    def __init__(self, store: ThreadStore, thread_id: str, branches: list[Branch]) -> None:
        self.store = store
        self.thread_id = thread_id
        head = len(branches)
        self.cutoffs: dict[int, str | None] = {head: None}  # branch -> fork point kept
        child = head
        while child != 0:
            record = branches[child - 1]
            self.cutoffs[record.parent] = record.fork_point
            child = record.parent
        self._orders: dict[int, int] = {}

    async def current(self, entry: CheckpointEntry) -> bool:
        if entry.branch not in self.cutoffs:
            return False
        fork = self.cutoffs[entry.branch]
        if fork is None:
            return True
        if entry.branch not in self._orders:
            found = await self.store.get_checkpoint(self.thread_id, fork)
            self._orders[entry.branch] = found.order if found is not None else -1
        return entry.order <= self._orders[entry.branch]


def _summary(
    entry: CheckpointEntry, current: bool, snap: ThreadSnapshot, count: int | None
) -> HistoryEntry:
    cp = entry.checkpoint
    meta = cp.metadata
    step = meta.get("step")
    nodes = meta.get("nodes")
    source = meta.get("source")
    return HistoryEntry(
        checkpoint_id=cp.id,
        parent=cp.parent,
        run_id=cp.run_id,
        status=cp.status,
        step=step if isinstance(step, int) else None,
        nodes=[str(n) for n in nodes] if isinstance(nodes, list) else [],
        source=source if isinstance(source, str) else None,
        branch=entry.branch,
        current=current,
        head=snap.checkpoint is not None and snap.checkpoint.id == cp.id,
        created_at=entry.committed_at,
        messages=count,
        subgraphs=dict(meta.get("subgraphs") or {}),
    )


def recorded_count(entry: CheckpointEntry, snap: ThreadSnapshot) -> int | None:
    """The message count as of ``entry``: as its checkpoint recorded it, or the thread's
    when it is the head; ``None`` when unknown."""
    recorded = entry.checkpoint.metadata.get("messages")
    if isinstance(recorded, int) and not isinstance(recorded, bool):
        return recorded
    if snap.checkpoint is not None and snap.checkpoint.id == entry.checkpoint.id:
        return snap.message_count
    return None


async def message_count_at(
    store: ThreadStore, thread_id: str, entry: CheckpointEntry, snap: ThreadSnapshot
) -> int:
    """``recorded_count``, or 0 when the checkpoint's branch has no messages at all;
    ``InvalidState`` when the count cannot be known."""
    count = recorded_count(entry, snap)
    if count is not None:
        return count
    if not await store.branch_messages(thread_id, entry.branch, 0, 1):
        return 0
    raise InvalidState(
        "checkpoint",
        entry.checkpoint.id,
        "without a message count",
        "it was committed without metadata['messages'] (by an older wakeful or a LangGraph "
        "saver), so the messages as of it are unknown; use a later checkpoint",
    )


async def history(
    store: ThreadStore,
    thread_id: str,
    *,
    before: str | None = None,
    limit: int = 50,
    tenant: str | None = None,
) -> list[HistoryEntry]:
    """The thread's checkpoints newest first, at most ``limit``, below checkpoint id
    ``before`` when given (the cursor: pass the last id of the page before). Each names its
    run, step, producing nodes, status, parent, branch and whether it is on the head's line.
    ``tenant``: refuse (``TenantMismatch``) a thread of another tenant. ``NotFound`` for a
    thread without checkpoints; ``[]`` for an unknown ``before``. A page costs one index
    range, plus one probe per abandoned-line branch on it, whatever the history's length."""
    check_id("thread_id", thread_id)
    check_optional_id("before", before)
    limit = check_count("limit", limit, minimum=1, maximum=MAX_HISTORY_PAGE)
    snap = await _snapshot(store, thread_id, tenant)
    entries = await store.history(thread_id, before, limit)
    if not entries:
        return []
    lineage = _Lineage(store, thread_id, await store.branches(thread_id))
    return [_summary(e, await lineage.current(e), snap, recorded_count(e, snap)) for e in entries]


async def thread_branches(
    store: ThreadStore, thread_id: str, *, tenant: str | None = None
) -> list[Branch]:
    """The thread's branches, branch 1 first (the last is the head's): where each came from
    (its fork point and parent branch) and what it left (the old head). ``[]`` until the
    thread branched. ``tenant`` as for ``history``."""
    check_id("thread_id", thread_id)
    await _snapshot(store, thread_id, tenant)
    return await store.branches(thread_id)


async def _entry(
    store: ThreadStore, thread_id: str, checkpoint_id: str | None, snap: ThreadSnapshot
) -> CheckpointEntry:
    """The checkpoint ``checkpoint_id`` (default: the head); ``NotFound`` if not there."""
    assert snap.checkpoint is not None
    wanted = snap.checkpoint.id if checkpoint_id is None else checkpoint_id
    found = await store.get_checkpoint(thread_id, wanted)
    if found is None:
        raise NotFound("checkpoint", wanted)
    return found


async def checkpoint_at(
    store: ThreadStore, thread_id: str, checkpoint_id: str, *, tenant: str | None = None
) -> CheckpointView:
    """One checkpoint in full with its history entry. ``NotFound`` for a checkpoint the
    thread does not have (never committed, dropped or pruned)."""
    check_id("thread_id", thread_id)
    check_id("checkpoint_id", checkpoint_id)
    snap = await _snapshot(store, thread_id, tenant)
    found = await _entry(store, thread_id, checkpoint_id, snap)
    lineage = _Lineage(store, thread_id, await store.branches(thread_id))
    summary = _summary(found, await lineage.current(found), snap, recorded_count(found, snap))
    return CheckpointView(entry=summary, checkpoint=found.checkpoint)


async def messages_at(
    store: ThreadStore,
    thread_id: str,
    checkpoint_id: str,
    *,
    after: int = 0,
    limit: int = 100,
    tenant: str | None = None,
) -> list[Message]:
    """The thread's messages as of checkpoint ``checkpoint_id`` (on whichever branch it
    is), paged like ``ThreadStore.messages``. ``InvalidState`` for a checkpoint whose
    message count is unknown (see ``HistoryEntry.messages``)."""
    check_id("thread_id", thread_id)
    check_id("checkpoint_id", checkpoint_id)
    after = check_count("after", after, maximum=2**62)
    limit = check_count("limit", limit, minimum=1)
    snap = await _snapshot(store, thread_id, tenant)
    found = await _entry(store, thread_id, checkpoint_id, snap)
    count = await message_count_at(store, thread_id, found, snap)
    if after >= count:
        return []
    return await store.branch_messages(thread_id, found.branch, after, min(limit, count - after))


def _shared_counts(branches: list[Branch]) -> dict[int, int | None]:
    """For each branch on the head's line, how many of its messages the head's view still
    shares (``None``: all, the head's own): a branch keeps only ``messages`` of its parent's
    view, so a checkpoint before a fork point may count messages the head no longer has."""
    child = len(branches)
    caps: dict[int, int | None] = {child: None}
    cap: int | None = None
    while child != 0:
        record = branches[child - 1]
        cap = record.messages if cap is None else min(cap, record.messages)
        caps[record.parent] = cap
        child = record.parent
    return caps


async def committed_at(
    store: ThreadStore, thread_id: str, count: int, *, tenant: str | None = None
) -> str:
    """The checkpoint on the head's line whose commit brought the thread's messages to
    ``count`` or more (the one that committed message ``count - 1``): walked back from the
    head, as far as that message. ``InvalidState`` when the line does not record message
    counts that far back."""
    caps = _shared_counts(await store.branches(thread_id))
    found: str | None = None
    before: str | None = None
    while True:
        page = await history(store, thread_id, before=before, limit=100, tenant=tenant)
        for entry in page:
            if not entry.current:
                continue
            if entry.messages is None:
                break
            cap = caps.get(entry.branch)
            if (entry.messages if cap is None else min(entry.messages, cap)) < count:
                if found is not None:
                    return found
                break
            found = entry.checkpoint_id
        else:
            if len(page) == 100:
                before = page[-1].checkpoint_id
                continue
            if found is not None:
                return found
        raise InvalidState(
            "thread",
            thread_id,
            "without message counts",
            f"no checkpoint of its line records committing message {count}",
        )


async def message_position(
    store: ThreadStore, thread_id: str, message_id: str
) -> tuple[int, Message]:
    """Where ``message_id`` is in the thread's current messages (the head's view), and the
    message; ``NotFound`` if it is not there."""
    after = 0
    while True:
        page = await store.messages(thread_id, after, 500)
        for i, message in enumerate(page):
            if message.id == message_id:
                return after + i, message
        if len(page) < 500:
            raise NotFound("message", message_id)
        after += len(page)


async def last_user_count(store: ThreadStore, thread_id: str) -> int:
    """How many of the thread's current messages there are up to and with its last user
    message (read back from the end); ``NotFound`` when it has none."""
    snap = await store.read(thread_id)
    end = snap.message_count if snap is not None else 0
    while end > 0:
        start = max(end - 100, 0)
        page = await store.messages(thread_id, start, end - start)
        for i in range(len(page) - 1, -1, -1):
            if page[i].role == "user":
                return start + i + 1
        end = start
    raise NotFound("user message", thread_id)


async def _messages_up_to(
    store: ThreadStore, thread_id: str, branch: int, count: int
) -> list[Message]:
    found: list[Message] = []
    while len(found) < count:
        page = await store.branch_messages(
            thread_id, branch, len(found), min(count - len(found), 1000)
        )
        if not page:
            break
        found += page
    return found


async def fork(
    store: ThreadStore,
    thread_id: str,
    new_thread_id: str,
    *,
    checkpoint_id: str | None = None,
    tenant: str | None = None,
    holder: str | None = None,
) -> Checkpoint:
    """A new thread ``new_thread_id`` whose state and messages equal ``thread_id``'s as of
    ``checkpoint_id`` (default: its head), in one fenced write: its first checkpoint is a
    copy of that checkpoint (state, status, frontier; ``metadata["forked_from"]`` names the
    source), its messages a copy of the source's as of it, and its history starts with a
    ``thread.forked`` event naming the source and the checkpoint. The tenant is kept. The
    source is only read, never changed; the two share nothing (every value is a copy).

    A checkpoint in the middle of a run is copied as ``suspended`` (nothing runs on the new
    thread until asked): ``Runtime.replay`` from it (or ``resume`` with no answers)
    continues the run there. Refused with
    ``InvalidState`` when ``new_thread_id`` already has commits, ``ThreadBusy`` while it is
    claimed, ``TenantMismatch`` when it or the source belongs to another tenant."""
    check_id("new_thread_id", new_thread_id)
    check_optional_id("checkpoint_id", checkpoint_id)
    check_optional_id("tenant", tenant)
    if new_thread_id == thread_id:
        raise InvalidState("thread", new_thread_id, "the source", "a fork needs a new thread id")
    snap = await _snapshot(store, thread_id, tenant)
    found = await _entry(store, thread_id, checkpoint_id, snap)
    count = await message_count_at(store, thread_id, found, snap)
    messages = await _messages_up_to(store, thread_id, found.branch, count)
    source = found.checkpoint
    metadata: dict[str, Any] = {
        **source.metadata,
        "source": "fork",
        "messages": len(messages),
        "forked_from": {"thread_id": thread_id, "checkpoint_id": source.id},
    }
    metadata.pop("resumed_by", None)  # a resume dispatch of the source is not this thread's
    copy = msgspec.structs.replace(
        source,
        id=f"fork-{uuid.uuid4().hex}",
        parent=None,
        status="suspended" if source.status == "running" else source.status,
        tenant=snap.tenant if snap.tenant_bound else tenant,
        metadata=metadata,
    )
    event = EventDraft(
        type="thread.forked",
        data={"source_thread": thread_id, "checkpoint_id": source.id},
        run_id=source.run_id,
        checkpoint_id=copy.id,
    )
    commit = Commit(
        token=0,
        checkpoint=copy,
        messages=tuple(messages),
        events=(event,),
        expected_version=0,
        release=True,
        operation_id=copy.id,
    )
    who = holder or f"fork-{uuid.uuid4().hex[:12]}"
    try:
        await store.claim_and_commit(new_thread_id, who, FORK_TTL, commit)
    except VersionConflict:
        raise InvalidState(
            "thread", new_thread_id, "already in use", "a fork needs a thread id with no history"
        ) from None
    return copy


__all__ = [
    "CheckpointView",
    "HistoryEntry",
    "checkpoint_at",
    "committed_at",
    "fork",
    "history",
    "last_user_count",
    "message_count_at",
    "message_position",
    "messages_at",
    "recorded_count",
    "thread_branches",
]
