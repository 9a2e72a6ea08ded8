"""Workers, dispatches and the operator routes (quarantine, inspection, requeue, purge).

Dispatches are visible to the tenant owning their thread; operators see them all. The
quarantine routes need the operator role: a valid token without it gets 403 (the routes are
documented publicly, so refusing them reveals nothing; tenant data stays 404).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from wakeful.errors import NotFound
from wakeful.fleet.client import tenant_of
from wakeful.server.access import (
    CallerDep,
    DispatchFilter,
    OperatorDep,
    StateDep,
    thread_owner,
    visible_thread,
)
from wakeful.server.routes.params import DispatchId, IdCursor, Limit
from wakeful.server.schemas import (
    ID_PATTERN,
    MAX_ID,
    DispatchPage,
    DispatchStatus,
    DispatchView,
    Inspection,
    WorkerList,
    WorkerView,
)
from wakeful.server.views import dispatch_view, errors, thread_view

router = APIRouter(prefix="/v1", tags=["dispatches"])
operators = APIRouter(prefix="/v1", tags=["operators"])


@router.get("/workers")
async def list_workers(state: StateDep, caller: CallerDep) -> WorkerList:
    """Registered workers with their generation and last heartbeat (any authenticated
    caller: workers are fleet-wide, not tenant data)."""
    rows = await state.store.list_workers()
    return WorkerList(workers=[WorkerView.model_validate(w, from_attributes=True) for w in rows])


@router.get("/dispatches", responses=errors(404))
async def list_dispatches(
    state: StateDep,
    caller: CallerDep,
    status: Annotated[DispatchStatus | None, Query(description="Only this status.")] = None,
    thread_id: Annotated[
        str | None,
        Query(pattern=ID_PATTERN, max_length=MAX_ID, description="Only this thread's."),
    ] = None,
    after: IdCursor = None,
    limit: Limit = 100,
) -> DispatchPage:
    """Dispatches in enqueue order, filtered; a tenant sees those of its threads. A page may
    hold fewer than ``limit`` dispatches while ``next_after`` continues the listing."""
    visible = DispatchFilter(state.store, caller)
    if thread_id is not None:
        await visible_thread(state.store, caller, thread_id)
    if after is not None and not caller.operator:
        await visible.get(after)  # a cursor of another tenant is not found
    # A tenant's page comes from the store already scoped (an index range of the tenant's
    # dispatches): what other tenants hold costs it nothing.
    batch = await state.store.list_dispatches(
        status=status,
        thread_id=thread_id,
        after=after,
        limit=limit,
        tenant=None if caller.operator else caller.tenant,
    )
    rows = [
        dispatch_view(d)
        for d in batch
        # work queued before dispatches carried a tenant names it in its payload only
        if caller.operator or tenant_of(d) in (None, caller.tenant)
    ]
    return DispatchPage(
        dispatches=rows, next_after=batch[-1].dispatch_id if len(batch) == limit else None
    )


@router.get("/dispatches/{dispatch_id}", responses=errors(404))
async def get_dispatch(dispatch_id: DispatchId, state: StateDep, caller: CallerDep) -> DispatchView:
    """One dispatch: its delivery state, attempts, lease and last error (404 for a dispatch
    on another tenant's thread)."""
    d = await DispatchFilter(state.store, caller).get(dispatch_id)
    return dispatch_view(d)


@operators.post("/dispatches/{dispatch_id}/quarantine", responses=errors(403, 404, 409))
async def quarantine(dispatch_id: DispatchId, state: StateDep, caller: OperatorDep) -> DispatchView:
    """Park exhausted work (every attempt used, no live lease) so it is not terminalised
    automatically; anything else is 409."""
    parked = await state.store.quarantine(dispatch_id)
    state.metrics.quarantines.inc()
    return dispatch_view(parked)


@operators.get("/quarantine", responses=errors(403, 404))
async def list_quarantine(
    state: StateDep, caller: OperatorDep, after: IdCursor = None, limit: Limit = 100
) -> DispatchPage:
    """Quarantined dispatches of every tenant, in enqueue order."""
    rows = await state.store.list_dispatches(status="quarantined", after=after, limit=limit)
    return DispatchPage(
        dispatches=[dispatch_view(d) for d in rows],
        next_after=rows[-1].dispatch_id if len(rows) == limit else None,
    )


async def _quarantined(state: StateDep, dispatch_id: str) -> DispatchView:
    d = await state.store.get_dispatch(dispatch_id)
    if d is None or d.status != "quarantined":
        raise NotFound("quarantined dispatch", dispatch_id)
    return dispatch_view(d)


@operators.get("/quarantine/{dispatch_id}", responses=errors(403, 404))
async def inspect(dispatch_id: DispatchId, state: StateDep, caller: OperatorDep) -> Inspection:
    """The quarantined dispatch and the thread it would act on."""
    view = await _quarantined(state, dispatch_id)
    owner = await thread_owner(state.store, view.thread_id)
    return Inspection(dispatch=view, thread=thread_view(owner) if owner is not None else None)


@operators.post("/quarantine/{dispatch_id}/requeue", responses=errors(403, 404, 409))
async def requeue(dispatch_id: DispatchId, state: StateDep, caller: OperatorDep) -> DispatchView:
    """Make quarantined work pending again with a fresh retry budget."""
    await _quarantined(state, dispatch_id)
    d = await state.store.requeue(dispatch_id)
    if state.wake is not None:
        await state.wake.notify()
    return dispatch_view(d)


@operators.delete("/quarantine/{dispatch_id}", status_code=204, responses=errors(403, 404, 409))
async def purge(dispatch_id: DispatchId, state: StateDep, caller: OperatorDep) -> Response:
    """Delete quarantined work for good."""
    await _quarantined(state, dispatch_id)
    await state.store.purge(dispatch_id)
    return Response(status_code=204)
