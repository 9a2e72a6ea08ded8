"""Reading threads: the list (the caller's tenant only, filtered), one thread, its messages and
its checkpoint history."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from wakeful.fleet.joins import spawned_children
from wakeful.records import ThreadSummary
from wakeful.runtime.children import ChildRun
from wakeful.runtime.sleeps import wake_at
from wakeful.server.access import CallerDep, ServerState, StateDep, json_field, visible_thread
from wakeful.server.composition_views import ChildPage, ChildView
from wakeful.server.problems import Forbidden
from wakeful.server.routes.params import MAX_SEQ, IdCursor, Limit, ThreadId
from wakeful.server.schemas import (
    ID_PATTERN,
    MAX_ID,
    CheckpointPage,
    CheckpointView,
    MessagePage,
    MessageView,
    RunStatus,
    ThreadPage,
    ThreadSummaryView,
    ThreadView,
)
from wakeful.server.views import errors, thread_view
from wakeful.store.listing import is_internal_thread

router = APIRouter(prefix="/v1", tags=["threads"])

SCAN_BATCH = 500
SCAN_LIMIT = 5000
"""Threads looked at per filtered listing request (``status``, ``target``); when reached,
the page may be short and ``next_after`` continues the scan. ``prefix`` alone reads only the
index range of the prefix."""


class _Filter:
    """The optional filters of the thread list. ``target`` needs each candidate's latest
    checkpoint (the summary does not carry the graph), so it is checked last."""

    def __init__(
        self,
        state: ServerState,
        prefix: str | None,
        status: str | None,
        target: str | None,
        internal: bool = False,
    ) -> None:
        self.state = state
        self.prefix = prefix
        self.status = status
        self.target = target
        self.internal = internal

    @property
    def scanning(self) -> bool:
        return self.status is not None or self.target is not None

    def past_prefix(self, row: ThreadSummary) -> bool:
        """The store lists ids in byte order, so the prefix's ids are one contiguous range."""
        return self.prefix is not None and not row.thread_id.startswith(self.prefix)

    async def keeps(self, row: ThreadSummary) -> bool:
        if not self.internal and is_internal_thread(row.thread_id):
            return False  # the fleet's own bookkeeping (webhook deliveries)
        if self.status is not None and row.status != self.status:
            return False
        if self.target is None:
            return True
        snap = await self.state.store.read(row.thread_id)
        cp = snap.checkpoint if snap is not None else None
        return cp is not None and json_field(cp.metadata, "graph") == self.target


@router.get("/threads", responses=errors(403))
async def list_threads(
    state: StateDep,
    caller: CallerDep,
    after: IdCursor = None,
    limit: Limit = 100,
    tenant: Annotated[
        str | None,
        Query(
            pattern=ID_PATTERN,
            max_length=MAX_ID,
            description="Operators: only this tenant's threads. A tenant token may only name "
            "its own tenant (else 403).",
        ),
    ] = None,
    prefix: Annotated[
        str | None,
        Query(
            pattern=ID_PATTERN,
            max_length=MAX_ID,
            description="Only threads whose id starts with this (an index range).",
        ),
    ] = None,
    status: Annotated[
        RunStatus | None, Query(description="Only threads whose latest run has this status.")
    ] = None,
    target: Annotated[
        str | None,
        Query(
            pattern=ID_PATTERN,
            max_length=MAX_ID,
            description="Only threads whose latest checkpoint is of this graph (target).",
        ),
    ] = None,
    internal: Annotated[
        bool,
        Query(
            description="Also the fleet's own threads (webhook deliveries, "
            "`wakeful.webhook.*`), left out by default.",
        ),
    ] = False,
) -> ThreadPage:
    """Threads with at least one commit, ordered by id, paged by cursor (``after`` is the
    last id of the previous page). A tenant token sees only its tenant's threads.

    ``status`` and ``target`` filter while scanning at most 5000 threads per request: a
    page can then be short (even empty) with a ``next_after`` that continues the scan;
    ``next_after`` is null only at the end. The fleet's own threads (webhook deliveries)
    are skipped the same way unless ``internal`` is true."""
    if caller.operator:
        scope = tenant
    elif tenant is not None and tenant != caller.tenant:
        raise Forbidden("a tenant token may list only its own tenant's threads")
    else:
        scope = caller.tenant
    chosen = _Filter(state, prefix, status, target, internal)
    cursor = after
    kept: list[ThreadSummary] = []
    if prefix is not None and (after is None or after < prefix):
        cursor = prefix  # the listing is exclusive: the id equal to the prefix is read alone
        exact = await _summary(state, scope, prefix)
        if exact is not None and await chosen.keeps(exact):
            kept.append(exact)
    batch = SCAN_BATCH if chosen.scanning else limit
    scanned, ended = 0, False
    while len(kept) < limit and scanned < SCAN_LIMIT:
        rows = await state.store.list_threads(tenant=scope, after=cursor, limit=batch)
        for row in rows:
            if chosen.past_prefix(row):
                ended = True
                break
            scanned += 1
            cursor = row.thread_id
            if await chosen.keeps(row):
                kept.append(row)
                if len(kept) == limit:
                    break
        if ended or len(rows) < batch:
            ended = ended or len(kept) < limit
            break
    if kept and len(kept) == limit:
        cursor = kept[-1].thread_id
    return ThreadPage(
        threads=[ThreadSummaryView.model_validate(r, from_attributes=True) for r in kept],
        next_after=None if ended or cursor is None else cursor,
    )


async def _summary(state: ServerState, scope: str | None, thread_id: str) -> ThreadSummary | None:
    """The listing row of one thread, as ``list_threads`` would give it."""
    snap = await state.store.read(thread_id)
    cp = snap.checkpoint if snap is not None else None
    if snap is None or cp is None or snap.version == 0:
        return None
    if scope is not None and snap.tenant != scope:
        return None
    return ThreadSummary(
        thread_id=thread_id,
        tenant=snap.tenant,
        version=snap.version,
        checkpoint_id=cp.id,
        status=cp.status,
        message_count=snap.message_count,
        last_seq=snap.last_seq,
        updated_at=cp.created_at,
    )


@router.get("/threads/{thread_id}", responses=errors(404))
async def get_thread(thread_id: ThreadId, state: StateDep, caller: CallerDep) -> ThreadView:
    """The thread's status, version, latest run, claim (holder and expiry), checkpoint
    state, message count, latest event seq and the open tickets of a suspended run."""
    owner = await visible_thread(state.store, caller, thread_id)
    return thread_view(owner)


@router.get("/threads/{thread_id}/messages", responses=errors(404))
async def list_messages(
    thread_id: ThreadId,
    state: StateDep,
    caller: CallerDep,
    after: Annotated[
        int, Query(ge=0, le=MAX_SEQ, description="How many messages to skip (a count).")
    ] = 0,
    limit: Limit = 100,
) -> MessagePage:
    """The conversation in order; ``after`` counts the messages already read."""
    await visible_thread(state.store, caller, thread_id)
    rows = await state.store.messages(thread_id, after=after, limit=limit)
    return MessagePage(
        messages=[MessageView.model_validate(m, from_attributes=True) for m in rows],
        next_after=after + len(rows),
    )


@router.get("/threads/{thread_id}/checkpoints", responses=errors(404))
async def list_checkpoints(
    thread_id: ThreadId,
    state: StateDep,
    caller: CallerDep,
    before: Annotated[
        str | None,
        Query(
            pattern=ID_PATTERN,
            max_length=MAX_ID,
            description="A checkpoint id (``next_before``): the checkpoints older than it.",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100, description="Checkpoints per page.")] = 20,
    state_included: Annotated[
        bool,
        Query(alias="state", description="Include each checkpoint's state (false: ids only)."),
    ] = True,
) -> CheckpointPage:
    """The thread's checkpoint history, newest first, each with the state it recorded (the
    console shows the state at any checkpoint and diffs two). Retention may have removed
    old checkpoints."""
    await visible_thread(state.store, caller, thread_id)
    rows = await state.store.checkpoints(thread_id, before=before, limit=limit)
    views = [
        CheckpointView(
            id=cp.id,
            parent=cp.parent,
            run_id=cp.run_id,
            status=cp.status,
            created_at=cp.created_at,
            committed_at=at,
            state=cp.state if state_included else None,
            frontier=list(cp.frontier),
            metadata=dict(cp.metadata),
        )
        for cp, at in rows
    ]
    return CheckpointPage(
        checkpoints=views, next_before=rows[-1][0].id if len(rows) == limit else None
    )


MAX_CHILDREN = 1000
SCANNED_EVENTS = 5000
"""Events a children listing reads at most (the thread's latest): a bounded cost per call."""


@router.get("/threads/{thread_id}/children", responses=errors(404))
async def list_children(
    thread_id: ThreadId,
    state: StateDep,
    caller: CallerDep,
    run_id: Annotated[
        str | None,
        Query(pattern=ID_PATTERN, max_length=MAX_ID, description="Only this run's children."),
    ] = None,
) -> ChildPage:
    """The child runs the thread's runs spawned (``ctx.spawn``, an agent's ``delegate``
    tool), in spawn order, each with its current status: those recorded among the thread's
    latest 5000 events, the first 1000 of them. A child's own thread names its parent
    (``parent``)."""
    owner = await visible_thread(state.store, caller, thread_id)
    snap = owner.snapshot
    after = 0 if snap is None else max(snap.event_floor - 1, snap.last_seq - SCANNED_EVENTS)
    views = []
    for event in await spawned_children(state.store, thread_id, run_id, MAX_CHILDREN, after):
        child = ChildRun.of(event.data)
        snap = await state.store.read(child.thread_id)
        cp = snap.checkpoint if snap is not None else None
        ours = cp is not None and cp.run_id == child.run_id
        views.append(
            ChildView(
                thread_id=child.thread_id,
                run_id=child.run_id,
                target=child.target,
                detached=child.detached,
                parent_run_id=event.run_id,
                spawned_at=event.at,
                status=("sleeping" if wake_at(cp) else cp.status) if ours and cp else None,
            )
        )
    return ChildPage(children=views)
