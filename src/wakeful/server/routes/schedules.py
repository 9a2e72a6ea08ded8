"""Schedules (issue 38): create or replace, read, list, pause, resume, trigger, delete.

Tenant-scoped like the rest of ``/v1``: a tenant's schedule names are its own (stored with
its tag, ``tenant_scope``), so another tenant's schedule is 404 and never 409; operators
(and development mode) name schedules as stored. A schedule's fixed ``thread`` must be one
the caller may submit to. Workers fire the ticks (``wakeful.fleet.firing``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from wakeful.errors import InvalidInput, NotFound
from wakeful.fleet import schedules
from wakeful.records import Schedule
from wakeful.server.access import (
    CallerDep,
    StateDep,
    json_field,
    tenant_scope,
    writable_thread,
)
from wakeful.server.auth import Caller
from wakeful.server.routes.params import IdCursor, Limit
from wakeful.server.routes.runs import _check_target
from wakeful.server.schedule_views import (
    PutSchedule,
    SchedulePage,
    ScheduleView,
    schedule_view,
)
from wakeful.server.schemas import ID_PATTERN, MAX_KEY, Accepted
from wakeful.server.views import accepted, errors

router = APIRouter(prefix="/v1", tags=["schedules"])

ScheduleName = Annotated[
    str, Path(pattern=ID_PATTERN, max_length=MAX_KEY, description="The schedule's name.")
]


def _stored(caller: Caller, name: str) -> str:
    """The name the store keeps ``name`` under for this caller."""
    return name if caller.tenant is None else f"{tenant_scope(caller.tenant)}.{name}"


def _shown(caller: Caller, stored: str) -> str:
    if caller.tenant is None:
        return stored
    return stored.split(".", 1)[1]


async def _owned(state: StateDep, caller: Caller, name: str) -> Schedule:
    s = await state.store.get_schedule(_stored(caller, name))
    if s is None or (caller.tenant is not None and s.tenant != caller.tenant):
        raise NotFound("schedule", name)
    return s


@router.get("/schedules")
async def list_schedules(
    state: StateDep, caller: CallerDep, after: IdCursor = None, limit: Limit = 100
) -> SchedulePage:
    """The caller's schedules by name (an operator's: every tenant's, as stored)."""
    cursor = None if after is None else _stored(caller, after)
    rows = await state.store.list_schedules(tenant=caller.tenant, after=cursor, limit=limit)
    views = [schedule_view(s, _shown(caller, s.name)) for s in rows]
    return SchedulePage(schedules=views, next_after=views[-1].name if len(rows) == limit else None)


@router.put("/schedules/{name}", responses=errors(404, 409, 413))
async def put_schedule(
    name: ScheduleName, body: PutSchedule, state: StateDep, caller: CallerDep
) -> ScheduleView:
    """Create or replace the schedule: its first tick is the first after now (the store's
    clock); what it fired before stays. 422 for a cron, time zone or template that cannot
    work, or an unknown target."""
    _check_target(state, "target", body.target)
    if body.thread is not None:
        await writable_thread(state.store, caller, body.thread)
    stored_name = _stored(caller, name)
    if len(stored_name) > MAX_KEY:
        raise InvalidInput("name", f"is too long once scoped to the tenant ({len(name)})")
    existing = await state.store.get_schedule(stored_name)
    if existing is not None and caller.tenant is not None and existing.tenant != caller.tenant:
        raise NotFound("schedule", name)
    s = await schedules.schedule(
        state.store,
        stored_name,
        body.cron,
        target=body.target,
        every=body.every,
        input=body.input,
        thread=body.thread,
        thread_template=body.thread_template,
        timezone=body.timezone,
        overlap=body.overlap,
        catch_up=body.catch_up,
        max_catch_up=body.max_catch_up,
        tenant=caller.tenant or (existing.tenant if existing is not None else None),
        paused=body.paused,
    )
    return schedule_view(s, name)


@router.get("/schedules/{name}", responses=errors(404))
async def get_schedule(name: ScheduleName, state: StateDep, caller: CallerDep) -> ScheduleView:
    """One schedule with its next tick and what it fired last."""
    return schedule_view(await _owned(state, caller, name), name)


@router.delete("/schedules/{name}", status_code=204, responses=errors(404))
async def delete_schedule(name: ScheduleName, state: StateDep, caller: CallerDep) -> Response:
    """Remove the schedule; the runs it fired stay."""
    s = await _owned(state, caller, name)
    await state.store.delete_schedule(s.name)
    return Response(status_code=204)


@router.post("/schedules/{name}/pause", responses=errors(404, 409))
async def pause_schedule(name: ScheduleName, state: StateDep, caller: CallerDep) -> ScheduleView:
    """Stop firing until resumed; ticks meanwhile are not caught up."""
    s = await _owned(state, caller, name)
    return schedule_view(await schedules.pause_schedule(state.store, s.name), name)


@router.post("/schedules/{name}/resume", responses=errors(404, 409))
async def resume_schedule(name: ScheduleName, state: StateDep, caller: CallerDep) -> ScheduleView:
    """Fire again from the first tick after now."""
    s = await _owned(state, caller, name)
    return schedule_view(await schedules.resume_schedule(state.store, s.name), name)


@router.post("/schedules/{name}/trigger", status_code=202, responses=errors(404, 409))
async def trigger_schedule(
    name: ScheduleName, state: StateDep, caller: CallerDep, response: Response
) -> Accepted:
    """Fire the schedule once now, outside its ticks."""
    s = await _owned(state, caller, name)
    d = await schedules.trigger_schedule(state.store, s.name, wake=state.wake)
    response.headers["Location"] = f"/v1/dispatches/{d.dispatch_id}"
    return accepted(d, str(json_field(d.payload, "run_id") or f"run-{d.dispatch_id}"))
