"""Time travel over HTTP: a thread's history with its branches, one checkpoint with the
messages as of it, editing the state, forking, and editing or regenerating a message.

Thin layers over ``wakeful.runtime.history`` (reads, ``fork``), ``Runtime.update_state``
and ``wakeful.fleet.client`` (``edit_message``, ``regenerate``), always with the thread's
own tenant: a thread of another tenant is 404, exactly like a missing one. Replaying from a
checkpoint is ``from_checkpoint`` on ``POST /v1/threads/{id}/runs`` (``routes/runs.py``).
See docs/time-travel.md.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from wakeful.errors import DispatchConflict, InvalidInput, InvalidState, NotFound, RunInProgress
from wakeful.fleet import client
from wakeful.fleet.registry import Target
from wakeful.records import Dispatch
from wakeful.runtime.history import (
    MAX_HISTORY_PAGE,
    checkpoint_at,
    fork,
    history,
    messages_at,
    thread_branches,
)
from wakeful.runtime.runtime import Runtime
from wakeful.server.access import (
    CallerDep,
    Owner,
    ServerState,
    StateDep,
    keyed_dispatch_id,
    visible_thread,
)
from wakeful.server.routes.params import MAX_SEQ, IdempotencyKey, ThreadId
from wakeful.server.schemas import (
    ID_PATTERN,
    MAX_ID,
    Accepted,
    BranchView,
    CheckpointDetail,
    EditMessage,
    ForkThread,
    HistoryEntryView,
    HistoryPage,
    MessageView,
    Regenerate,
    ThreadView,
    UpdateState,
)
from wakeful.server.views import accepted, errors, thread_view

router = APIRouter(prefix="/v1", tags=["time travel"])

CheckpointId = Annotated[
    str, Path(pattern=ID_PATTERN, max_length=MAX_ID, description="The checkpoint's id.")
]
MessageId = Annotated[
    str, Path(pattern=ID_PATTERN, max_length=MAX_ID, description="The message's id.")
]
MESSAGES_PAGE = 100


@router.get("/threads/{thread_id}/history", responses=errors(404))
async def get_history(
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
    limit: Annotated[
        int, Query(ge=1, le=MAX_HISTORY_PAGE, description="Checkpoints per page.")
    ] = 50,
) -> HistoryPage:
    """The thread's checkpoints newest first, each with its run, step, producing nodes,
    status, parent, branch, whether it is on the head's line (``current``) and whether it
    is the head, and the thread's branch records (where each branch forked and what head
    it left). A page costs one index range, whatever the history's length."""
    owner = await visible_thread(state.store, caller, thread_id)
    entries = await history(state.store, thread_id, before=before, limit=limit, tenant=owner.tenant)
    branches = await thread_branches(state.store, thread_id, tenant=owner.tenant)
    return HistoryPage(
        entries=[HistoryEntryView.model_validate(e, from_attributes=True) for e in entries],
        branches=[BranchView.model_validate(b, from_attributes=True) for b in branches],
        next_before=entries[-1].checkpoint_id if len(entries) == limit else None,
    )


async def _detail(
    state: ServerState, owner: Owner, checkpoint_id: str, after: int, limit: int
) -> CheckpointDetail:
    thread_id = owner.thread_id
    found = await checkpoint_at(state.store, thread_id, checkpoint_id, tenant=owner.tenant)
    try:
        rows = await messages_at(
            state.store, thread_id, checkpoint_id, after=after, limit=limit, tenant=owner.tenant
        )
        total = found.entry.messages
        more = total is None or after + len(rows) < total
        next_after: int | None = after + len(rows) if more and rows else None
    except InvalidState:  # committed without a message count: the messages are unknown
        rows, next_after = [], None
    cp = found.checkpoint
    return CheckpointDetail(
        entry=HistoryEntryView.model_validate(found.entry, from_attributes=True),
        state=cp.state,
        frontier=list(cp.frontier),
        metadata=dict(cp.metadata),
        messages=[MessageView.model_validate(m, from_attributes=True) for m in rows],
        next_after=next_after,
    )


@router.get("/threads/{thread_id}/checkpoints/{checkpoint_id}", responses=errors(404))
async def get_checkpoint(
    thread_id: ThreadId,
    checkpoint_id: CheckpointId,
    state: StateDep,
    caller: CallerDep,
    after: Annotated[
        int, Query(ge=0, le=MAX_SEQ, description="How many of its messages to skip (a count).")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=1000, description="Messages per page.")] = MESSAGES_PAGE,
) -> CheckpointDetail:
    """One checkpoint in full (state, frontier, metadata, its history entry) and the
    thread's messages as of it, on whichever branch it is (paged: ``after`` counts the
    messages already read). 404 for a checkpoint the thread does not have (never
    committed, or removed by retention)."""
    owner = await visible_thread(state.store, caller, thread_id)
    return await _detail(state, owner, checkpoint_id, after, limit)


def _target_for(state: ServerState, owner: Owner, named: str | None, *, agent: bool) -> Target:
    """The registered target to act with: the one named, else the one the thread's head
    records. Without a registry the server cannot resolve a graph (409)."""
    registry = state.registry
    if registry is None:
        raise InvalidState(
            "server",
            "this server",
            "without a registry",
            "it cannot resolve the thread's graph; start it with `wakeful serve --app "
            "module:registry`",
        )
    snap = owner.snapshot
    try:
        if named is not None:
            target = registry.get(named)
        else:
            target = registry.for_checkpoint(snap.checkpoint if snap is not None else None)
    except NotFound:
        if named is not None:
            known = ", ".join(registry.names()) or "none"
            raise InvalidInput("target", f"unknown target {named!r}; registered: {known}") from None
        graph = snap.checkpoint.metadata.get("graph") if snap and snap.checkpoint else None
        raise InvalidState(
            "thread",
            owner.thread_id,
            f"of graph {graph!r}",
            "no registered target runs that graph; name one with `target`",
        ) from None
    if agent and target.agent is None:
        raise InvalidInput("target", f"{target.name!r} is a graph; this needs an agent")
    return target


@router.post("/threads/{thread_id}/state", responses=errors(404, 409, 413, 422))
async def update_state(
    thread_id: ThreadId, body: UpdateState, state: StateDep, caller: CallerDep
) -> CheckpointDetail:
    """Commit one new checkpoint whose state is ``values`` applied through the graph's
    reducers to the head's state (or ``checkpoint_id``'s, which branches the thread), as if
    ``as_node`` had returned them (the next step routes from that node; without it the base
    checkpoint's frontier is kept). Answers the new checkpoint. The graph is the registered
    target of the thread's head (409 on a server without a registry, or when the graph
    changed since). 409 while a run holds the thread (``thread-busy``) or its last run is
    unfinished (``run-in-progress``). Not deduplicated by ``Idempotency-Key``: each request
    commits a checkpoint."""
    owner = await visible_thread(state.store, caller, thread_id)
    target = _target_for(state, owner, None, agent=False)
    runtime = Runtime(state.store, metrics=state.metrics)
    cp = await runtime.update_state(
        thread_id,
        target.graph,
        body.values,
        as_node=body.as_node,
        checkpoint_id=body.checkpoint_id,
        tenant=owner.tenant,
    )
    return await _detail(state, owner, cp.id, 0, MESSAGES_PAGE)


@router.post("/threads/{thread_id}/fork", status_code=201, responses=errors(404, 409, 413, 422))
async def fork_thread(
    thread_id: ThreadId, body: ForkThread, state: StateDep, caller: CallerDep, response: Response
) -> ThreadView:
    """Create ``new_thread_id`` whose state and messages equal this thread's as of
    ``checkpoint_id`` (default: the head), in one write; its history starts with a
    ``thread.forked`` event. The tenant is kept; this thread is only read. 409 when the new
    id already has history (or is claimed); 404 when it is another tenant's. Answers the
    new thread (``Location`` names it)."""
    owner = await visible_thread(state.store, caller, thread_id)
    # a new id of another tenant: the store refuses the write (TenantMismatch, a 404)
    await fork(
        state.store,
        thread_id,
        body.new_thread_id,
        checkpoint_id=body.checkpoint_id,
        tenant=owner.tenant,
    )
    response.headers["Location"] = f"/v1/threads/{body.new_thread_id}"
    return thread_view(await visible_thread(state.store, caller, body.new_thread_id))


def refuse_running(owner: Owner) -> None:
    """``RunInProgress`` while the thread's last run is running: going back is refused
    then (docs/time-travel.md), so say it now rather than when a worker gets to it."""
    snap = owner.snapshot
    head = snap.checkpoint if snap is not None else None
    if head is None:
        raise NotFound("thread", owner.thread_id)
    if head.status == "running":
        raise RunInProgress(owner.thread_id, head.run_id, head.status)


async def _travel_dispatch(
    state: ServerState, caller: CallerDep, thread_id: str, key: str | None
) -> tuple[Owner, str | None, Dispatch | None]:
    """The thread, the dispatch id of the key, and the dispatch already stored under it (a
    retry: the thread has moved since, so its state is not checked again)."""
    owner = await visible_thread(state.store, caller, thread_id)
    dispatch_id = await keyed_dispatch_id(state.store, caller, key, field="Idempotency-Key")
    existing = await state.store.get_dispatch(dispatch_id) if dispatch_id is not None else None
    if existing is None:
        refuse_running(owner)
    return owner, dispatch_id, existing


def _retried(existing: Dispatch, thread_id: str, target: str, input: object) -> Dispatch:
    """The stored dispatch a retried request with the same key stands for; 409 when the key
    was used for other work (another thread, target or text)."""
    payload = existing.payload if isinstance(existing.payload, dict) else {}
    same = (
        existing.thread_id == thread_id
        and existing.kind == "start"
        and payload.get("from_checkpoint") is not None
        and payload.get("target") == target
        and payload.get("input") == input
    )
    if not same:
        raise DispatchConflict(existing.dispatch_id, existing.dispatch_id, "Idempotency-Key")
    return existing


def _location(response: Response, d: Dispatch) -> Accepted:
    response.headers["Location"] = f"/v1/dispatches/{d.dispatch_id}"
    run_id = d.payload.get("run_id") if isinstance(d.payload, dict) else None
    return accepted(d, str(run_id) if run_id else f"run-{d.dispatch_id}")


@router.post(
    "/threads/{thread_id}/messages/{message_id}/edit",
    status_code=202,
    responses=errors(404, 409, 413, 422),
)
async def edit_message(
    thread_id: ThreadId,
    message_id: MessageId,
    body: EditMessage,
    state: StateDep,
    caller: CallerDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> Accepted:
    """Run the thread's agent (or ``target``) on from an edited user message: a run from
    the checkpoint that committed the message, keeping only the messages before it, with
    ``content`` as the new user message. The thread branches there when the run starts; the
    previous answer stays readable on the abandoned branch. 422 for a message that is not
    the user's; 404 for one the thread's current messages do not have."""
    owner, dispatch_id, existing = await _travel_dispatch(state, caller, thread_id, idempotency_key)
    target = _target_for(state, owner, body.target, agent=True)
    if existing is not None:
        return _location(response, _retried(existing, thread_id, target.name, body.content))
    d = await client.edit_message(
        state.store,
        thread_id,
        target.name,
        message_id,
        body.content,
        dispatch_id=dispatch_id,
        tenant=owner.tenant,
        wake=state.wake,
    )
    state.metrics.submits.inc(kind="start")
    return _location(response, d)


@router.post(
    "/threads/{thread_id}/regenerate", status_code=202, responses=errors(404, 409, 413, 422)
)
async def regenerate(
    thread_id: ThreadId,
    body: Regenerate,
    state: StateDep,
    caller: CallerDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> Accepted:
    """Answer the thread's last user message again: a run of the thread's agent (or
    ``target``) from the checkpoint that committed that message. The thread branches there
    when the run starts; the previous answer stays readable on the abandoned branch."""
    owner, dispatch_id, existing = await _travel_dispatch(state, caller, thread_id, idempotency_key)
    target = _target_for(state, owner, body.target, agent=True)
    if existing is not None:
        return _location(response, _retried(existing, thread_id, target.name, None))
    d = await client.regenerate(
        state.store,
        thread_id,
        target.name,
        dispatch_id=dispatch_id,
        tenant=owner.tenant,
        wake=state.wake,
    )
    state.metrics.submits.inc(kind="start")
    return _location(response, d)


__all__ = ["refuse_running", "router"]
