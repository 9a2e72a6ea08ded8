"""The LangGraph API's crons as wakeful schedules (``wakeful.fleet.schedules``).

``crons.create_for_thread`` is a schedule on that thread; ``crons.create`` is a schedule
whose every tick runs on a new thread (``thread_template`` ``{name}-{tick}``). The schedule
is named ``langgraph:cron:{cron_id}``, targets the assistant's graph, carries the run's
``input`` and the caller's tenant; ``enabled=False`` creates it paused; ``timezone`` is the
schedule's. Firing is wakeful's (``fire_due``, exactly once per tick across the fleet).
What a schedule cannot carry (``config``, ``context``, ``metadata``, ``webhook``,
``interrupt_before``/``after``, ``end_time``, stream options, ``on_run_completed="delete"``)
answers 501 naming the field, as do cron updates. See docs/langgraph-api.md.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from wakeful.fleet.schedules import delete_schedule, schedule
from wakeful.fleet.tokens import Caller
from wakeful.records import Schedule
from wakeful.server.langgraph_threads import Body, page_of
from wakeful.server.langgraph_views import Unsupported
from wakeful.server.problems import problem

if TYPE_CHECKING:
    from wakeful.server.langgraph_api import LangGraphAPI

PREFIX = "langgraph:cron:"
REFUSED = (
    "config",
    "context",
    "metadata",
    "webhook",
    "interrupt_before",
    "interrupt_after",
    "end_time",
    "stream_subgraphs",
    "stream_resumable",
    "checkpoint_during",
)
STRATEGIES = {"reject": "skip", "enqueue": "enqueue"}
"""A cron's ``multitask_strategy`` as the schedule's ``overlap`` while a tick's run is
unfinished (``interrupt`` and ``rollback`` answer 501)."""


def _iso(value: Any) -> str | None:
    return None if value is None else value.isoformat()


def add_cron_routes(app: FastAPI, api: LangGraphAPI, body_of: Body) -> None:
    """Register the cron routes on ``app``."""

    def view(s: Schedule) -> dict[str, Any]:
        cron_id = s.name[len(PREFIX) :]
        assistant_id = api.assistant_id(s.target)
        return {
            "cron_id": cron_id,
            "assistant_id": assistant_id,
            "thread_id": s.thread,
            "on_run_completed": None if s.thread is not None else "keep",
            "end_time": None,
            "schedule": s.cron,
            "timezone": s.timezone,
            "created_at": _iso(s.created_at),
            "updated_at": _iso(s.updated_at),
            "payload": {
                "schedule": s.cron,
                "input": s.input,
                "assistant_id": assistant_id,
                "config": {"configurable": {"cron_id": cron_id}},
            },
            "user_id": s.tenant or "",
            "next_run_date": _iso(s.next_fire_at),
            "metadata": {},
            "enabled": not s.paused,
        }

    async def create(request: Request, thread_id: str | None) -> Any:
        body = await body_of(request)
        caller: Caller = request.state.caller
        for name in REFUSED:
            if body.get(name) not in (None, {}, []):
                raise Unsupported(f"crons with {name!r}")
        if body.get("on_run_completed") not in (None, "keep"):
            raise Unsupported("crons with on_run_completed 'delete' (a tick's thread is kept)")
        strategy = body.get("multitask_strategy") or "reject"
        if strategy not in STRATEGIES:
            raise Unsupported(f"crons with multitask_strategy {strategy!r}")
        if body.get("stream_mode") not in (None, "values", ["values"]):
            raise Unsupported("crons with stream_mode")
        graph = api.graph_name(str(body.get("assistant_id", "")))
        if graph is None:
            return problem(
                404,
                "not-found",
                f"assistant {body.get('assistant_id')!r} does not exist",
                instance=request.url.path,
            )
        cron = body.get("schedule")
        if not isinstance(cron, str):
            raise ValueError("schedule must be a cron expression")
        if thread_id is not None:
            record = api.threads.get(thread_id) or await api.recover(thread_id)
            if record is None or not (caller.operator or record.tenant == caller.tenant):
                return problem(
                    404,
                    "not-found",
                    f"thread {thread_id!r} does not exist",
                    instance=request.url.path,
                )
        name = PREFIX + str(uuid.uuid4())
        stored = await schedule(
            api.store,
            name,
            cron,
            target=graph,
            input=body.get("input"),
            thread=thread_id,
            thread_template=None if thread_id is not None else "{name}-{tick}",
            timezone=str(body.get("timezone") or "UTC"),
            overlap=STRATEGIES[strategy],  # type: ignore[arg-type]
            tenant=caller.tenant,
            paused=body.get("enabled") is False,
        )
        return view(stored)

    @app.post("/runs/crons")
    async def create_cron(request: Request) -> Any:
        return await create(request, None)

    @app.post("/threads/{thread_id}/runs/crons")
    async def create_thread_cron(thread_id: str, request: Request) -> Any:
        return await create(request, thread_id)

    async def mine(caller: Caller, body: dict[str, Any]) -> list[Schedule]:
        for name in ("metadata", "sort_by", "sort_order", "select"):
            if body.get(name):
                raise Unsupported(f"crons search by {name!r}")
        wanted = body.get("assistant_id")
        graph = None if wanted is None else api.graph_name(str(wanted))
        found: list[Schedule] = []
        after = PREFIX
        while True:
            page = await api.store.list_schedules(
                tenant=None if caller.operator else caller.tenant, after=after, limit=500
            )
            for s in page:
                if not s.name.startswith(PREFIX):
                    return found
                if not caller.operator and s.tenant != caller.tenant:
                    continue
                if wanted is not None and s.target != graph:
                    continue
                if body.get("thread_id") not in (None, s.thread):
                    continue
                if body.get("enabled") not in (None, not s.paused):
                    continue
                found.append(s)
            if len(page) < 500:
                return found
            after = page[-1].name

    @app.post("/runs/crons/search")
    async def search_crons(request: Request) -> Any:
        body = await body_of(request)
        limit, offset = page_of(body)
        found = await mine(request.state.caller, body)
        return [view(s) for s in found[offset : offset + limit]]

    @app.post("/runs/crons/count")
    async def count_crons(request: Request) -> Any:
        return len(await mine(request.state.caller, await body_of(request)))

    @app.delete("/runs/crons/{cron_id}")
    async def delete_cron(cron_id: str, request: Request) -> Response:
        caller: Caller = request.state.caller
        name = PREFIX + cron_id
        found = await api.store.get_schedule(name) if _uuid(cron_id) else None
        if found is None or not (caller.operator or found.tenant == caller.tenant):
            return problem(
                404, "not-found", f"cron {cron_id!r} does not exist", instance=request.url.path
            )
        await delete_schedule(api.store, name)
        return Response(status_code=204)


def _uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
