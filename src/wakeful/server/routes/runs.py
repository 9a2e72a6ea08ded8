"""Submitting work (start, resume, cancel, message) and listing a thread's runs.

Every write persists a dispatch and answers 202: a worker acts on it. The thread's tenant is
checked first; a thread of another tenant is 404.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Response

from wakeful.errors import DispatchConflict, InvalidInput, NotFound, NotSuspended, UnknownTicket
from wakeful.fleet import client
from wakeful.fleet.registry import Target
from wakeful.ids import new_id
from wakeful.records import Dispatch, RunSegment
from wakeful.runtime.history import checkpoint_at
from wakeful.runtime.sleeps import wake_at
from wakeful.server.access import (
    CallerDep,
    DispatchFilter,
    Owner,
    ServerState,
    StateDep,
    acting_tenant,
    json_field,
    keyed_dispatch_id,
    visible_thread,
    writable_thread,
)
from wakeful.server.routes.params import IdempotencyKey, ThreadId
from wakeful.server.routes.travel import refuse_running
from wakeful.server.schemas import (
    ID_PATTERN,
    MAX_ID,
    Accepted,
    CancelRun,
    ResumeRun,
    RunPage,
    RunView,
    SendMessage,
    SubmitRun,
    TargetPage,
    TargetView,
)
from wakeful.server.views import accepted, errors

router = APIRouter(prefix="/v1", tags=["runs"])

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _check_target(state: ServerState, field: str, target: str | None) -> Target | None:
    """The registered target (``None`` without a registry or a name); an unknown one is
    ``InvalidInput``."""
    if state.registry is None or target is None:
        return None
    try:
        return state.registry.get(target)
    except NotFound:
        known = ", ".join(state.registry.names()) or "none"
        raise InvalidInput(field, f"unknown target {target!r}; registered: {known}") from None


def _message_target(state: ServerState, body: SendMessage, owner: Owner | None) -> Target | None:
    """The target a message will run with, when the server can tell: the one named, else the
    one the thread records, else the registry's default."""
    named = _check_target(state, "target", body.target)
    if named is not None or state.registry is None:
        return named
    snap = owner.snapshot if owner is not None else None
    try:
        return state.registry.for_checkpoint(snap.checkpoint if snap is not None else None)
    except NotFound:
        return None  # the worker decides (and refuses it)


@router.get("/targets")
async def list_targets(state: StateDep, caller: CallerDep) -> TargetPage:
    """What may be submitted: each registered target, ``agent`` (its input is text, the
    user message) or ``graph`` (a JSON object of its state fields), with a JSON Schema of
    its input. Empty without a registry (any name is taken; the worker decides)."""
    registry = state.registry
    if registry is None:
        return TargetPage(targets=[], registry=False)
    return TargetPage(
        targets=[
            TargetView(
                name=t.name,
                kind="agent" if t.agent is not None else "graph",
                input_schema=t.input_schema(),
                default=t.name == registry.default,
            )
            for t in registry.targets()
        ],
        registry=True,
    )


def _location(response: Response, d: Dispatch) -> None:
    response.headers["Location"] = f"/v1/dispatches/{d.dispatch_id}"


async def _check_replay(
    state: ServerState,
    thread_id: str,
    owner: Owner | None,
    checkpoint_id: str,
    dispatch_id: str | None,
) -> None:
    """A replay names a checkpoint the thread has (404 otherwise) and is refused while the
    thread's last run is running (409), now rather than when a worker gets to it. A retry
    of a stored dispatch is judged by the store (same body, same dispatch)."""
    if owner is None or not owner.committed:
        raise NotFound("thread", thread_id)
    if dispatch_id is not None and await state.store.get_dispatch(dispatch_id) is not None:
        return
    await checkpoint_at(state.store, thread_id, checkpoint_id, tenant=owner.tenant)
    refuse_running(owner)


@router.post("/threads/{thread_id}/runs", status_code=202, responses=errors(404, 409, 413, 422))
async def submit_run(
    thread_id: ThreadId,
    body: SubmitRun,
    state: StateDep,
    caller: CallerDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> Accepted:
    """Start a run of ``target`` on the thread (new or the caller's). The run id is
    ``run-<dispatch_id>``; with an ``Idempotency-Key`` the dispatch id is the key (a
    tenant's: ``<tenant tag>.<key>``, see ``keyed_dispatch_id``)."""
    target = _check_target(state, "target", body.target)
    if target is not None:  # refused now rather than retried until exhausted
        target.check_input(body.input)
    owner = await writable_thread(state.store, caller, thread_id)
    dispatch_id = await keyed_dispatch_id(
        state.store, caller, idempotency_key, field="Idempotency-Key"
    )
    if body.from_checkpoint is not None:
        await _check_replay(state, thread_id, owner, body.from_checkpoint, dispatch_id)
    d = await client.submit(
        state.store,
        thread_id,
        body.target,
        body.input,
        dispatch_id=dispatch_id,
        priority=body.priority,
        max_attempts=body.max_attempts,
        tenant=acting_tenant(caller, owner),
        wake=state.wake,
        after=body.after,
        at=body.at,
        from_checkpoint=body.from_checkpoint,
        if_busy=body.if_busy,
        webhook=body.webhook,
        debounce=_debounce(body, target),
        concurrency=target.concurrency if target is not None else None,
    )
    if (d.priority, d.max_attempts) != (body.priority, body.max_attempts):
        raise DispatchConflict(d.dispatch_id, d.dispatch_id, "Idempotency-Key")
    state.metrics.submits.inc(kind="start")
    _location(response, d)
    return accepted(d, str(json_field(d.payload, "run_id") or f"run-{d.dispatch_id}"))


def _debounce(body: SubmitRun, target: Target | None) -> float | None:
    """The request's debounce window, else the registered target's for a plain submission."""
    if body.debounce is not None:
        return body.debounce
    plain = body.after is None and body.at is None and body.from_checkpoint is None
    return target.debounce if target is not None and plain else None


@router.post("/threads/{thread_id}/resume", status_code=202, responses=errors(404, 409, 413, 422))
async def resume_run(
    thread_id: ThreadId,
    body: ResumeRun,
    state: StateDep,
    caller: CallerDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> Accepted:
    """Answer open tickets of the suspended run (409 if it is not suspended, or for a
    ticket it does not have open)."""
    owner = await visible_thread(state.store, caller, thread_id)
    cp = owner.snapshot.checkpoint if owner.snapshot is not None else None
    dispatch_id = await keyed_dispatch_id(
        state.store, caller, idempotency_key, field="Idempotency-Key"
    )
    replay = dispatch_id is not None and await state.store.get_dispatch(dispatch_id) is not None
    if not replay:  # a replay is judged by the store: same body, same dispatch
        if cp is None or cp.status != "suspended":
            raise NotSuspended(thread_id, cp.status if cp is not None else None)
        open_ids = {t.get("id") for t in cp.metadata.get("tickets", []) if isinstance(t, dict)}
        unknown = sorted(set(body.answers) - open_ids)
        if unknown:
            raise UnknownTicket(thread_id, unknown)
    d = await client.resume(
        state.store,
        thread_id,
        body.answers,
        dispatch_id=dispatch_id,
        tenant=owner.tenant,
        wake=state.wake,
    )
    state.metrics.submits.inc(kind="resume")
    _location(response, d)
    return accepted(d, cp.run_id if cp is not None else None)


@router.post("/threads/{thread_id}/cancel", status_code=202, responses=errors(404, 409, 413, 422))
async def cancel_run(
    thread_id: ThreadId,
    state: StateDep,
    caller: CallerDep,
    response: Response,
    body: Annotated[CancelRun | None, Body()] = None,
) -> Accepted:
    """Persist the intent to cancel the thread's work: its running owner is fenced at its
    next commit or renewal and the next claimant records ``cancelled``. A cancel still
    pending for the thread is answered instead of a second one."""
    owner = await visible_thread(state.store, caller, thread_id)
    reason = body.reason if body is not None else "cancelled"
    d = await client.cancel(state.store, thread_id, reason, wake=state.wake)
    state.metrics.submits.inc(kind="cancel")
    _location(response, d)
    cp = owner.snapshot.checkpoint if owner.snapshot is not None else None
    return accepted(d, cp.run_id if cp is not None else None)


@router.post("/threads/{thread_id}/messages", status_code=202, responses=errors(404, 409, 413, 422))
async def send_message(
    thread_id: ThreadId,
    body: SendMessage,
    state: StateDep,
    caller: CallerDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> Accepted:
    """Deliver a message to the thread (new or the caller's): a run of the thread's graph
    (or ``target``) handles it, once per ``message_id``."""
    owner = await writable_thread(state.store, caller, thread_id)
    target = _message_target(state, body, owner)
    if target is not None:
        target.check_input(body.payload)
    message_id = body.message_id or idempotency_key or new_id("msg-")
    field = "message_id" if body.message_id else "Idempotency-Key"
    dispatch_id = await keyed_dispatch_id(
        state.store, caller, message_id, prefix="ext-", field=field
    )
    d = await _send(state, thread_id, body, message_id, dispatch_id, acting_tenant(caller, owner))
    state.metrics.submits.inc(kind="message")
    _location(response, d)
    return accepted(d, f"run-{d.dispatch_id}", message_id)


async def _send(
    state: ServerState,
    thread_id: str,
    body: SendMessage,
    message_id: str,
    dispatch_id: str | None,
    tenant: str | None,
) -> Dispatch:
    return await client.send_message(
        state.store,
        thread_id,
        body.payload,
        message_id=message_id,
        target=body.target,
        correlation_id=body.correlation_id,
        tenant=tenant,
        wake=state.wake,
        dispatch_id=dispatch_id,
        if_busy=body.if_busy,
    )


def _view(segment: RunSegment) -> RunView:
    return RunView(
        run_id=segment.run_id,
        status=segment.status,
        graph=segment.graph,
        checkpoint_id=segment.last_id,
        started_at=segment.started_at,
        updated_at=segment.updated_at,
        checkpoints=segment.checkpoints,
    )


async def _queued(
    state: ServerState, visible: DispatchFilter, thread_id: str, seen: set[str]
) -> list[RunView]:
    """Submitted runs no checkpoint records yet (newest first), those the caller may see."""
    queued: list[RunView] = []
    for status in ("scheduled", "pending", "leased"):
        for d in await state.store.list_dispatches(status=status, thread_id=thread_id, limit=100):
            if d.kind not in ("start", "message") or not await visible.visible(d):
                continue
            run_id = str(json_field(d.payload, "run_id") or f"run-{d.dispatch_id}")
            if run_id in seen:
                continue
            seen.add(run_id)
            queued.append(
                RunView(
                    run_id=run_id,
                    status="queued",
                    graph=None,
                    checkpoint_id=None,
                    started_at=None,
                    updated_at=d.created_at,
                    checkpoints=0,
                    dispatch_id=d.dispatch_id,
                )
            )
    queued.sort(key=lambda r: r.updated_at or EPOCH, reverse=True)
    return queued


@router.get("/threads/{thread_id}/runs", responses=errors(404))
async def list_runs(
    thread_id: ThreadId,
    state: StateDep,
    caller: CallerDep,
    before: Annotated[
        str | None,
        Query(
            pattern=ID_PATTERN,
            max_length=MAX_ID,
            description="A checkpoint id from ``next_before``: runs older than it.",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100, description="Runs per page.")] = 20,
) -> RunPage:
    """The thread's runs, newest first, derived from its checkpoint history (grouped by run
    id, each with its latest status), preceded on the first page by submitted runs that have
    not started yet (status ``queued``)."""
    owner = await visible_thread(state.store, caller, thread_id)
    # one more than a page tells whether older runs exist; the store reads a few index
    # entries per run, whatever the length of the history
    runs = await state.store.runs(thread_id, before=before, limit=limit + 1)
    more = len(runs) > limit
    runs = runs[:limit]
    views: list[Any] = []
    if before is None:
        visible = DispatchFilter(state.store, caller)
        views.extend(await _queued(state, visible, thread_id, {r.run_id for r in runs}))
    # only the thread's latest run can be asleep: it shows ``sleeping`` with its wake time
    latest = owner.snapshot.checkpoint if owner.snapshot is not None else None
    waking = wake_at(latest)
    for r in runs:
        view = _view(r)
        if waking is not None and latest is not None and r.last_id == latest.id:
            view.status, view.wake_at = "sleeping", waking
        views.append(view)
    return RunPage(runs=views, next_before=runs[-1].first_id if more else None)
