"""The LangGraph API's runs on a fleet (issue 44, decision 0052): ``create_langgraph_app``
with a ``LangGraphFleet`` registers these routes instead of running graphs in the server.

A run is a dispatch: its id is the run id (a UUID), its payload
(``wakeful.langgraph.targets.langgraph_payload``) what the worker runs, its status the run's.
``multitask_strategy`` is the dispatch's ``if_busy`` (``reject``, ``enqueue``,
``interrupt``, ``rollback``); a run on a thread stopped at an ``interrupt()`` is a
``resume`` dispatch, which takes over the suspended run's slot. Streams relay the
``langgraph.chunk`` events workers publish on the live channel (event ids
``<attempt>.<seq>``), then, once the dispatch has settled, the thread's final ``values``
from the store unless the last relayed ``values`` chunk already was that state (event id
``end``): a client that lost its connection, or whose worker died, and joins again with
``Last-Event-ID`` gets the run's final values once.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from wakeful.errors import ThreadBusy
from wakeful.fleet.delays import not_before
from wakeful.fleet.live import LiveChannel
from wakeful.fleet.wake import Wake
from wakeful.langgraph.codec import store_thread_id
from wakeful.langgraph.targets import CHUNK, END, RUN_KEY, jsonable, langgraph_payload
from wakeful.records import Dispatch, DispatchKind, IfBusy
from wakeful.runtime.events import LiveEvent
from wakeful.server.langgraph_records import Exists
from wakeful.server.langgraph_views import (
    UNSUPPORTED_RUN_FIELDS,
    ThreadRecord,
    Unsupported,
    config_for,
    frame,
    stream_modes,
)
from wakeful.server.problems import problem

STRATEGIES = ("reject", "enqueue", "interrupt", "rollback")
"""``multitask_strategy`` values and wakeful's ``if_busy`` of the same name."""
PENDING = ("queued", "scheduled", "waiting_key", "pending")
ENDED = ("done", "awaiting", "quarantined")
MAX_LISTED = 1000
SETTLE_POLL = 0.005
"""Seconds between reads of a run's dispatch after its end event, until it has settled."""


@dataclass
class LangGraphFleet:
    """How the LangGraph API reaches the workers: ``live`` is the channel they publish
    chunks on (``None``: streams carry only the final values), ``wake`` is notified after
    a run is submitted, ``poll`` is how often a stream checks its dispatch between chunks."""

    live: LiveChannel | None = None
    wake: Wake | None = None
    poll: float = 0.25
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the server shuts down: requests waiting for a run stop waiting."""

    async def pause(
        self, queue: asyncio.Queue[LiveEvent] | None, seconds: float | None = None
    ) -> LiveEvent | None:
        """Wait up to ``seconds`` (default ``poll``) for a live event (``None``: none came)."""
        waiter: Any = queue.get() if queue is not None else self.closing.wait()
        try:
            got = await asyncio.wait_for(waiter, self.poll if seconds is None else seconds)
        except TimeoutError:
            return None
        return got if isinstance(got, LiveEvent) else None


Visible = Callable[[Any, str], Awaitable[ThreadRecord | None]]
Body = Callable[[Request], Awaitable[dict[str, Any]]]


def run_status(d: Dispatch, failed: bool) -> str:
    """The API's run status of dispatch ``d`` (``failed``: the graph raised)."""
    if d.status in PENDING:
        return "pending"
    if d.status == "leased":
        return "running"
    if d.status == "awaiting" or (d.last_error or "").startswith("cancelled"):
        return "interrupted"
    if d.status == "quarantined" or failed or d.attempts > d.max_attempts:
        return "error"  # (the last: every attempt was spent, the worker stopped the run)
    return "success"


def _missing(kind: str, ident: str, path: str) -> Response:
    return problem(404, "not-found", f"{kind} {ident!r} does not exist", instance=path)


def _last_event(value: str | None) -> tuple[int, int] | str | None:
    """``Last-Event-ID``: ``end`` (the final values were sent), ``<attempt>.<seq>``."""
    if not value:
        return None
    if value == "end":
        return "end"
    attempt, _, seq = value.partition(".")
    try:
        return int(attempt), int(seq)
    except ValueError:
        raise ValueError(f"Last-Event-ID {value!r} is not one this server sent") from None


def add_fleet_runs(
    app: FastAPI, api: Any, fleet: LangGraphFleet, visible: Visible, body_of: Body
) -> None:
    """Register the runs routes on ``app`` (before its in-process ones, which they shadow)."""
    store = api.store

    async def run_of(
        request: Request, thread_id: str, run_id: str
    ) -> tuple[ThreadRecord, Dispatch] | Response:
        record = await visible(request.state.caller, thread_id)
        d = await store.get_dispatch(run_id) if record is not None else None
        if record is None or d is None or not isinstance(d.payload, dict):
            return _missing("run", run_id, request.url.path)
        if d.payload.get("thread_id") != thread_id or not d.payload.get("langgraph"):
            return _missing("run", run_id, request.url.path)
        return record, d

    async def failed(d: Dispatch) -> bool:
        """Whether the run's last checkpoint records a task that raised."""
        if d.status != "done" or (d.last_error or "").startswith("cancelled"):
            return False
        payload: dict[str, Any] = d.payload
        graph = api.graph(str(payload["target"]))
        state = await graph.aget_state(config_for(str(payload["thread_id"])))
        ours = (state.metadata or {}).get(RUN_KEY) == d.dispatch_id
        return ours and any(task.error is not None for task in state.tasks)

    async def view(d: Dispatch) -> dict[str, Any]:
        payload: dict[str, Any] = d.payload
        stamp = d.created_at.isoformat() if d.created_at else None
        return {
            "run_id": d.dispatch_id,
            "thread_id": payload["thread_id"],
            "assistant_id": api.assistant_id(str(payload["target"])),
            "created_at": stamp,
            "updated_at": d.updated_at.isoformat() if d.updated_at else stamp,
            "status": run_status(d, await failed(d)),
            "metadata": payload.get("metadata") or {},
            "multitask_strategy": d.if_busy,
            "kwargs": {},
        }

    async def submit(request: Request, thread_id: str, body: dict[str, Any]) -> Dispatch | Response:
        """Check a run request and enqueue its dispatch."""
        caller = request.state.caller
        record = await visible(caller, thread_id)
        if record is None:
            if body.get("if_not_exists") != "create" or thread_id in api.threads:
                return _missing("thread", thread_id, request.url.path)
            uuid.UUID(thread_id)
            try:  # a stored record, as a thread made by threads.create has (decision 0053)
                await api.records.create(thread_id, caller.tenant, {})
            except Exists:  # another tenant's, or created meanwhile
                return _missing("thread", thread_id, request.url.path)
            record = api.threads[thread_id] = ThreadRecord(thread_id, caller.tenant, {})
        for name in UNSUPPORTED_RUN_FIELDS:
            if name != "after_seconds" and body.get(name) is not None:
                raise Unsupported(f"the run field {name!r}")
        if body.get("stream_subgraphs"):
            raise Unsupported("stream_subgraphs")
        strategy = body.get("multitask_strategy") or "reject"
        if strategy not in STRATEGIES:
            raise Unsupported(f"multitask_strategy {strategy!r}")
        command = body.get("command")
        if command is not None and (not isinstance(command, dict) or set(command) - {"resume"}):
            raise Unsupported("commands other than {'resume': ...} (goto, update)")
        config = config_for(thread_id, body.get("config"))
        graph_name = api.graph_name(str(body.get("assistant_id", "")))
        if graph_name is None:
            return _missing("assistant", str(body.get("assistant_id")), request.url.path)
        if record.assistant_id not in (None, graph_name):
            raise ValueError(f"thread {thread_id!r} runs graph {record.assistant_id!r}")
        if record.assistant_id is None:  # the stored record learns its graph (search by it)
            record.assistant_id = graph_name
            await api.records.learn_graph(thread_id, graph_name)
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise ValueError("metadata must be an object")
        run_id = str(uuid.uuid4())
        payload = langgraph_payload(
            target=graph_name,
            thread_id=thread_id,
            run_id=run_id,
            input=body.get("input"),
            command=command,
            stream_mode=stream_modes(body),
            config=config,
            context=body.get("context"),
            tenant=caller.tenant,
        )
        payload["metadata"] = metadata
        thread = store_thread_id(thread_id)
        waiting = await store.list_dispatches(status="awaiting", thread_id=thread, limit=1)
        # a run on a thread stopped at an interrupt() continues that run's slot
        kind: DispatchKind = "resume" if waiting else "start"
        available_at = None
        if body.get("after_seconds") is not None:  # a delayed run (issue 38): store's clock
            if kind == "resume":
                raise Unsupported("after_seconds on a run that resumes an interrupt")
            available_at = not_before(await store.store_now(), body["after_seconds"])
        d = Dispatch(
            dispatch_id=run_id,
            thread_id=thread,
            kind=kind,
            payload=payload,
            tenant=caller.tenant,
            available_at=available_at,
            if_busy=cast(IfBusy, strategy) if kind == "start" else "enqueue",  # resume: its slot
        )
        try:
            stored: Dispatch = await store.enqueue(d)
        except ThreadBusy as busy:
            return problem(
                409,
                "thread-busy",
                f"thread {thread_id!r} is busy with run {busy.dispatch_id!r} "
                "(multitask_strategy 'reject'; 'enqueue', 'interrupt' or 'rollback' wait)",
                instance=request.url.path,
            )
        record.assistant_id = graph_name
        if fleet.wake is not None:
            await fleet.wake.notify()
        return stored

    async def settled(run_id: str) -> Dispatch | None:
        d: Dispatch | None = await store.get_dispatch(run_id)
        return d if d is None or d.status in ENDED else None

    async def final_values(d: Dispatch, interrupts: bool = False) -> Any:
        """The thread's values; with ``interrupts``, those it stopped at as ``__interrupt__``
        (what ``runs.wait`` answers, as LangGraph's server does)."""
        payload: dict[str, Any] = d.payload
        graph = api.graph(str(payload["target"]))
        state = await graph.aget_state(config_for(str(payload["thread_id"])))
        values = jsonable(state.values)
        stopped: Any = getattr(state, "interrupts", None) if interrupts else None
        if stopped and isinstance(values, dict):
            values["__interrupt__"] = jsonable(list(stopped))
        return values

    async def follow(
        d: Dispatch,
        modes: list[str],
        last: tuple[int, int] | str | None,
        queue: asyncio.Queue[LiveEvent] | None,
        unsubscribe: Callable[[], Awaitable[None]] | None,
    ) -> AsyncIterator[bytes]:
        """The run's stream from ``last`` on: live chunks, then the final values."""
        run_id = d.dispatch_id
        relayed: Any = None
        error: str | None = None
        try:
            yield frame("metadata", {"run_id": run_id, "thread_id": d.payload["thread_id"]})
            if last == "end":
                return
            while not fleet.closing.is_set():
                event = await fleet.pause(queue)
                if event is None or event.run_id != run_id:
                    if event is None and await settled(run_id) is not None:
                        break
                    continue
                data = event.data if isinstance(event.data, dict) else {}
                if event.type == END:
                    error = data.get("error") if data.get("status") == "error" else None
                    break
                if event.type != CHUNK or data.get("mode") not in modes:
                    continue
                at = (int(data.get("attempt", 0)), int(data.get("seq", 0)))
                if isinstance(last, tuple) and at <= last:
                    continue
                last = at  # a chunk the channel delivers again is not sent again
                if data["mode"] == "values":
                    if data.get("chunk") == relayed:
                        continue  # a recovered attempt streams the state it resumed from
                    relayed = data.get("chunk")
                yield _framed(data["mode"], data.get("chunk"), f"{at[0]}.{at[1]}")
            # the worker settles right after its end event: a client that asks for the run
            # once the stream closes (the SDK does, to tell an end from a drop) sees it ended
            while (ended := await settled(run_id)) is None and not fleet.closing.is_set():
                await fleet.pause(None, SETTLE_POLL)
            values = await final_values(ended or d)
            if "values" in modes and values != relayed:
                yield _framed("values", values, "end")
            if error is not None:
                yield frame("error", {"error": "RunError", "message": error})
        finally:
            if unsubscribe is not None:
                await unsubscribe()

    async def subscribe(
        thread_id: str,
    ) -> tuple[asyncio.Queue[LiveEvent] | None, Callable[[], Awaitable[None]] | None]:
        if fleet.live is None:
            return None, None
        queue: asyncio.Queue[LiveEvent] = asyncio.Queue()
        unsubscribe = await fleet.live.subscribe(store_thread_id(thread_id), queue.put_nowait)
        return queue, unsubscribe

    def streaming(thread_id: str, run_id: str, body: AsyncIterator[bytes]) -> StreamingResponse:
        headers = {
            "Location": f"/threads/{thread_id}/runs/{run_id}/stream",
            "Content-Location": f"/threads/{thread_id}/runs/{run_id}",
            "Cache-Control": "no-store",
        }
        return StreamingResponse(body, media_type="text/event-stream", headers=headers)

    async def joined(d: Dispatch) -> Any:
        """Wait for the run's dispatch to settle; the thread's values (or its error)."""
        queue, unsubscribe = await subscribe(str(d.payload["thread_id"]))
        try:
            while (ended := await settled(d.dispatch_id)) is None:
                if fleet.closing.is_set():
                    return problem(503, "unavailable", "the server is shutting down")
                await fleet.pause(queue)  # the run's end event, or the poll interval
        finally:
            if unsubscribe is not None:
                await unsubscribe()
        if await failed(ended):
            return {"__error__": {"error": "RunError", "message": "the graph raised"}}
        return await final_values(ended, interrupts=True)

    @app.post("/threads/{thread_id}/runs/stream")
    async def stream_run(thread_id: str, request: Request) -> Any:
        body = await body_of(request)
        modes = stream_modes(body)
        queue, unsubscribe = await subscribe(thread_id)  # before the run can start
        d = await submit(request, thread_id, body)
        if isinstance(d, Response):
            if unsubscribe is not None:
                await unsubscribe()
            return d
        return streaming(thread_id, d.dispatch_id, follow(d, modes, None, queue, unsubscribe))

    @app.get("/threads/{thread_id}/runs/{run_id}/stream")
    async def join_stream(thread_id: str, request: Request, run_id: str) -> Any:
        found = await run_of(request, thread_id, run_id)
        if isinstance(found, Response):
            return found
        _, d = found
        last = _last_event(request.headers.get("last-event-id"))
        asked = [m for m in request.query_params.getlist("stream_mode") if m]
        run_modes = list(d.payload.get("stream_mode") or ["values"])
        modes = stream_modes({"stream_mode": asked}) if asked else run_modes
        queue, unsubscribe = await subscribe(thread_id)
        return streaming(thread_id, run_id, follow(d, modes, last, queue, unsubscribe))

    @app.post("/threads/{thread_id}/runs/wait")
    async def wait_run(thread_id: str, request: Request) -> Any:
        body = await body_of(request)
        body["stream_mode"] = ["values"]
        d = await submit(request, thread_id, body)
        if isinstance(d, Response):
            return d
        headers = {"Content-Location": f"/threads/{thread_id}/runs/{d.dispatch_id}"}
        return JSONResponse(await joined(d), headers=headers)

    @app.post("/threads/{thread_id}/runs")
    async def create_run(thread_id: str, request: Request) -> Any:
        body = await body_of(request)
        body.setdefault("stream_mode", ["values"])
        d = await submit(request, thread_id, body)
        if isinstance(d, Response):
            return d
        return await view(d)

    @app.get("/threads/{thread_id}/runs")
    async def list_runs(thread_id: str, request: Request) -> Any:
        if await visible(request.state.caller, thread_id) is None:
            return _missing("thread", thread_id, request.url.path)
        params = request.query_params
        limit, offset = int(params.get("limit", 10)), int(params.get("offset", 0))
        if params.get("select"):
            raise Unsupported("runs.list with select")
        rows = await store.list_dispatches(thread_id=store_thread_id(thread_id), limit=MAX_LISTED)
        runs = [
            await view(d)
            for d in reversed(rows)
            if isinstance(d.payload, dict) and d.payload.get("langgraph")
        ]
        wanted = params.get("status")
        runs = [r for r in runs if wanted in (None, r["status"])]
        return runs[offset : offset + limit]

    @app.get("/threads/{thread_id}/runs/{run_id}")
    async def get_run(thread_id: str, run_id: str, request: Request) -> Any:
        found = await run_of(request, thread_id, run_id)
        return found if isinstance(found, Response) else await view(found[1])

    @app.get("/threads/{thread_id}/runs/{run_id}/join")
    async def join_run(thread_id: str, run_id: str, request: Request) -> Any:
        found = await run_of(request, thread_id, run_id)
        return found if isinstance(found, Response) else await joined(found[1])

    @app.post("/threads/{thread_id}/runs/{run_id}/cancel")
    async def cancel_run(thread_id: str, run_id: str, request: Request) -> Any:
        found = await run_of(request, thread_id, run_id)
        if isinstance(found, Response):
            return found
        d = found[1]
        action = request.query_params.get("action", "interrupt")
        if action != "interrupt":
            raise Unsupported(f"runs.cancel with action {action!r} (use multitask_strategy)")
        if d.status in ENDED:
            return problem(409, "conflict", f"run {run_id!r} has ended", instance=request.url.path)
        intent = await store.cancel(d.thread_id, f"runs.cancel of run {run_id}")
        if fleet.wake is not None:
            await fleet.wake.notify()
        if request.query_params.get("wait") in ("1", "true", "True"):
            while (await store.get_dispatch(intent.dispatch_id) or intent).status != "done":
                if fleet.closing.is_set():
                    return problem(503, "unavailable", "the server is shutting down")
                await fleet.pause(None)
        return Response(status_code=202)


def _framed(event: str, data: Any, event_id: str) -> bytes:
    """An SSE frame with an id (``Last-Event-ID`` resumes after it)."""
    return b"id: " + event_id.encode() + b"\n" + frame(event, data)


__all__ = ["STRATEGIES", "LangGraphFleet", "add_fleet_runs", "run_status"]
