"""The LangGraph API (first slice), mounted by ``create_app`` at ``/langgraph``.

``langgraph_sdk.get_client(url="http://host:port/langgraph")`` works against it for:
assistants (search, get: one per LangGraph graph of the registry), threads (create, get,
search, delete, state, history), runs (create, get, wait, stream with ``stream_mode``
``values``, ``updates``, ``custom``, ``messages-tuple``). Every other endpoint answers 501
with a problem naming it. Graphs run in the server process with a fenced ``WakefulSaver``
over the server's store: a second run of a thread is refused (409), and a thread's
checkpoints are the store's. The bearer tokens of
the HTTP API are the auth: a thread of another tenant is reported missing (404).

Thread records (tenant, metadata) are durable in the store (``langgraph_records``, decision
0053); the thread routes, assistants extras and crons are in ``langgraph_threads`` and
``langgraph_crons``. With a ``LangGraphFleet``, runs are dispatches that workers run
(``wakeful.server.langgraph_runs``, decision 0052). See docs/langgraph-api.md and decision
0050.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from wakeful.fleet.tokens import Authenticator, Caller
from wakeful.server.langgraph_crons import add_cron_routes
from wakeful.server.langgraph_records import Exists, ThreadRecords
from wakeful.server.langgraph_runs import LangGraphFleet, add_fleet_runs
from wakeful.server.langgraph_threads import add_thread_routes, record_of
from wakeful.server.langgraph_views import (
    GRAPH_KEY,
    MAX_HISTORY,
    NAMESPACE,
    TENANT_KEY,
    UNSUPPORTED_RUN_FIELDS,
    RunRecord,
    ThreadRecord,
    Unsupported,
    config_for,
    dumps,
    frame,
    now,
    run_input,
    snapshot,
    stream_modes,
)
from wakeful.server.problems import problem
from wakeful.store.contract import DispatchQueue, Store


class LangGraphAPI:
    """The state behind the routes: graphs, a saver, thread and run records."""

    def __init__(self, store: Store, graphs: Mapping[str, Any], authenticator: Authenticator):
        self.store = store
        self.graphs = dict(graphs)
        self.authenticator = authenticator
        self.threads: dict[str, ThreadRecord] = {}
        """This process's records (a cache of ``records`` with the runs it is running)."""
        self.records = ThreadRecords(store)
        self.runs: dict[str, RunRecord] = {}
        self._saver: Any = None
        self.created_at = now()
        self.runs_on_workers = False
        """Whether runs are dispatches that workers run (``langgraph_runs``)."""

    async def close(self) -> None:
        """Release the saver's claims and stop its renewals (the server shuts down)."""
        saver, self._saver = self._saver, None
        if saver is not None:
            await saver.aclose()

    async def recover(self, thread_id: str) -> ThreadRecord | None:
        """The record of a thread this process does not know: its durable record
        (``records``, decision 0053), else (a thread that ran with no record) its tenant and
        graph from the metadata of its latest checkpoint (``execute`` puts them there)."""
        try:
            uuid.UUID(thread_id)
        except ValueError:
            return None
        entry = await self.records.get(thread_id)
        latest = await self.saver().aget_tuple({"configurable": {"thread_id": thread_id}})
        meta = latest.metadata if latest is not None else {}
        graph = meta.get(GRAPH_KEY)
        if not isinstance(graph, str) or graph not in self.graphs:
            graph = None
        if entry is not None:
            known = record_of(entry, None)
            known.assistant_id = known.assistant_id or graph
            return self.threads.setdefault(thread_id, known)
        if graph is None:
            return None
        tenant = meta.get(TENANT_KEY)
        record = ThreadRecord(thread_id, tenant if isinstance(tenant, str) else None, {})
        record.assistant_id = graph
        return self.threads.setdefault(thread_id, record)

    def saver(self) -> Any:
        if self._saver is None:
            from wakeful.langgraph.saver import WakefulSaver

            self._saver = WakefulSaver(self.store)
        return self._saver

    def assistant_id(self, name: str) -> str:
        return str(uuid.uuid5(NAMESPACE, name))

    def assistant(self, name: str) -> dict[str, Any]:
        return {
            "assistant_id": self.assistant_id(name),
            "graph_id": name,
            "name": name,
            "description": None,
            "config": {},
            "context": {},
            "metadata": {"created_by": "system"},
            "version": 1,
            "created_at": self.created_at,
            "updated_at": self.created_at,
        }

    def graph_name(self, assistant_id: str) -> str | None:
        """The graph an ``assistant_id`` names: its id or its graph's name."""
        for name in self.graphs:
            if assistant_id in (name, self.assistant_id(name)):
                return name
        return None

    def graph(self, name: str) -> Any:
        return self.graphs[name].copy(update={"checkpointer": self.saver()})

    async def busy(self, record: ThreadRecord) -> bool:
        """Whether a run occupies ``record``'s thread: one this process runs, or (runs on
        workers) a dispatch of the thread that is pending or leased."""
        if record.running is not None:
            return True
        if not self.runs_on_workers or not isinstance(self.store, DispatchQueue):
            return False
        from wakeful.langgraph.codec import store_thread_id

        thread = store_thread_id(record.thread_id)
        for status in ("leased", "pending"):
            if await self.store.list_dispatches(status=status, thread_id=thread, limit=1):
                return True
        return False

    async def graph_of(self, record: ThreadRecord) -> str | None:
        """The graph that runs ``record``'s thread: the record's, else (a run started by
        something other than this API: a schedule's tick, ``/v1``) the one its latest
        checkpoint names, which the record then learns."""
        if record.assistant_id is None:
            latest = await self.saver().aget_tuple(config_for(record.thread_id))
            named = latest.metadata.get(GRAPH_KEY) if latest is not None else None
            if isinstance(named, str) and named in self.graphs:
                record.assistant_id = named
                await self.records.learn_graph(record.thread_id, named)
        return record.assistant_id


def _caller(api: LangGraphAPI, request: Request) -> Caller | Response:
    header = request.headers.get("authorization")
    key = request.headers.get("x-api-key")
    if header is None and key:  # the SDKs' api_key (agent-chat-ui, Studio): the same token
        header = f"Bearer {key}"
    resolved = api.authenticator.resolve(header)
    if isinstance(resolved, Caller):
        return resolved
    return problem(
        401,
        "unauthenticated",
        "send Authorization: Bearer <token> (a token of the server's token table)",
        instance=request.url.path,
        headers={"WWW-Authenticate": "Bearer"},
    )


def _missing(kind: str, ident: str, path: str) -> Response:
    return problem(404, "not-found", f"{kind} {ident!r} does not exist", instance=path)


def create_langgraph_app(
    store: Store,
    graphs: Mapping[str, Any],
    tokens: Mapping[str, str] | None,
    fleet: LangGraphFleet | None = None,
) -> FastAPI:
    """The LangGraph API over ``store`` for ``graphs`` (name -> compiled graph). With
    ``fleet``, runs are dispatches that workers run (``wakeful.server.langgraph_runs``);
    without, the server runs them itself."""
    api = LangGraphAPI(store, graphs, Authenticator(tokens))
    app = FastAPI(title="wakeful LangGraph API", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.langgraph = api

    async def visible(caller: Caller, thread_id: str) -> ThreadRecord | None:
        record = api.threads.get(thread_id) or await api.recover(thread_id)
        if record is None or (not caller.operator and record.tenant != caller.tenant):
            return None
        return record

    async def body_of(request: Request) -> dict[str, Any]:
        raw = await request.body()
        payload = json.loads(raw) if raw else {}
        if not isinstance(payload, dict):
            raise ValueError("the request body must be a JSON object")
        return payload

    @app.middleware("http")
    async def authenticate(request: Request, call_next: Any) -> Response:
        caller = _caller(api, request)
        if isinstance(caller, Response):
            return caller
        request.state.caller = caller
        response: Response = await call_next(request)
        return response

    @app.exception_handler(Unsupported)
    async def unsupported(request: Request, exc: Unsupported) -> Response:
        return problem(
            501,
            "not-implemented",
            f"{request.method} {request.url.path}: {exc} is not supported by this server "
            "(see docs/langgraph-api.md)",
            instance=request.url.path,
        )

    @app.exception_handler(ValueError)
    async def invalid(request: Request, exc: ValueError) -> Response:
        return problem(422, "invalid-input", str(exc), instance=request.url.path)

    if fleet is not None:  # registered first: these routes shadow the in-process ones
        api.runs_on_workers = True
        add_fleet_runs(app, api, fleet, visible, body_of)

    @app.post("/assistants/search")
    async def search_assistants(request: Request) -> Any:
        body = await body_of(request)
        wanted = body.get("graph_id")
        found = [api.assistant(n) for n in sorted(api.graphs) if wanted in (None, n)]
        offset, limit = int(body.get("offset", 0)), int(body.get("limit", 10))
        return found[offset : offset + limit]

    @app.get("/assistants/{assistant_id}")
    async def get_assistant(assistant_id: str, request: Request) -> Any:
        name = api.graph_name(assistant_id)
        if name is None:
            return _missing("assistant", assistant_id, request.url.path)
        return api.assistant(name)

    add_thread_routes(app, api, body_of)
    add_cron_routes(app, api, body_of)

    @app.get("/threads/{thread_id}/state")
    async def get_state(thread_id: str, request: Request) -> Any:
        record = await visible(request.state.caller, thread_id)
        if record is None:
            return _missing("thread", thread_id, request.url.path)
        if request.query_params.get("subgraphs") in ("true", "True"):
            raise Unsupported("get_state with subgraphs")
        graph_name = await api.graph_of(record)
        if graph_name is None:
            return {
                "values": {},
                "next": [],
                "tasks": [],
                "checkpoint": None,
                "metadata": {},
                "created_at": None,
                "parent_checkpoint": None,
                "interrupts": [],
            }
        snap = await api.graph(graph_name).aget_state(config_for(thread_id))
        return snapshot(snap)

    @app.post("/threads/{thread_id}/history")
    async def get_history(thread_id: str, request: Request) -> Any:
        record = await visible(request.state.caller, thread_id)
        if record is None:
            return _missing("thread", thread_id, request.url.path)
        body = await body_of(request)
        if body.get("before") or body.get("checkpoint") or body.get("metadata"):
            raise Unsupported("history filtered by before, checkpoint or metadata")
        limit = int(body.get("limit", 10))
        if not 1 <= limit <= MAX_HISTORY:
            raise ValueError(f"limit must be between 1 and {MAX_HISTORY}")
        graph_name = await api.graph_of(record)
        if graph_name is None:
            return []
        graph = api.graph(graph_name)
        return [
            snapshot(snap)
            async for snap in graph.aget_state_history(config_for(thread_id), limit=limit)
        ]

    async def start(request: Request, thread_id: str, body: dict[str, Any]) -> RunRecord | Response:
        """Check a run request and record the run (it occupies its thread)."""
        record = await visible(request.state.caller, thread_id)
        if record is None:
            if body.get("if_not_exists") != "create" or thread_id in api.threads:
                return _missing("thread", thread_id, request.url.path)  # or another tenant's
            uuid.UUID(thread_id)
            try:
                await api.records.create(thread_id, request.state.caller.tenant, {})
            except Exists:  # another tenant's, or created meanwhile
                return _missing("thread", thread_id, request.url.path)
            record = api.threads[thread_id] = ThreadRecord(
                thread_id, request.state.caller.tenant, {}
            )
        for name in UNSUPPORTED_RUN_FIELDS:
            if body.get(name) is not None:
                raise Unsupported(f"the run field {name!r}")
        config_for(thread_id, body.get("config"))  # refuses what this slice cannot run
        if body.get("stream_subgraphs"):
            raise Unsupported("stream_subgraphs")
        if body.get("multitask_strategy") not in (None, "reject"):
            raise Unsupported(f"multitask_strategy {body['multitask_strategy']!r}")
        graph_name = api.graph_name(str(body.get("assistant_id", "")))
        if graph_name is None:
            return _missing("assistant", str(body.get("assistant_id")), request.url.path)
        if record.assistant_id not in (None, graph_name):
            raise ValueError(f"thread {thread_id!r} runs graph {record.assistant_id!r}")
        if record.running is not None:
            return problem(
                409,
                "thread-busy",
                f"thread {thread_id!r} is running run {record.running!r}; wait for it "
                "(multitask_strategy 'reject' is the only one this server supports)",
                instance=request.url.path,
            )
        run = RunRecord(str(uuid.uuid4()), thread_id, api.assistant_id(graph_name), {})
        run.metadata = dict(body.get("metadata") or {})
        first_run = record.assistant_id is None
        record.assistant_id = graph_name
        record.running = run.run_id
        api.runs[run.run_id] = run
        if first_run:  # the stored record learns its graph (search by graph_id, decision 0053)
            await api.records.learn_graph(thread_id, graph_name)
        return run

    async def execute(run: RunRecord, body: dict[str, Any]) -> AsyncIterator[tuple[str, Any]]:
        """Run the graph, yielding ``(mode, chunk)``; the run's status follows."""
        record = api.threads[run.thread_id]
        graph = api.graph(str(record.assistant_id))
        config = config_for(run.thread_id, body.get("config"))
        config.setdefault("metadata", {}).update(
            {TENANT_KEY: record.tenant, GRAPH_KEY: record.assistant_id}
        )
        modes = stream_modes(body)
        run.status = "running"
        try:
            async for mode, chunk in graph.astream(
                run_input(body), config, stream_mode=modes, context=body.get("context")
            ):
                yield mode, chunk
            snap = await graph.aget_state(config_for(run.thread_id))
            run.status = "interrupted" if snap.next else "success"
        except BaseException:
            run.status = "error"
            raise
        finally:
            run.updated_at = record.updated_at = now()
            if record.running == run.run_id:
                record.running = None

    @app.post("/threads/{thread_id}/runs/stream")
    async def stream_run(thread_id: str, request: Request) -> Any:
        body = await body_of(request)
        stream_modes(body)
        run_input(body)
        run = await start(request, thread_id, body)
        if isinstance(run, Response):
            return run

        async def frames() -> AsyncIterator[bytes]:
            meta = {"run_id": run.run_id, "thread_id": thread_id, "attempt": 1}
            yield frame("metadata", meta)
            try:
                async for mode, chunk in execute(run, body):
                    yield frame(mode, chunk)
            except Exception as exc:  # the client sees it as an error event
                yield frame("error", {"error": type(exc).__name__, "message": str(exc)})

        headers = {
            "Location": f"/threads/{thread_id}/runs/{run.run_id}",
            "Cache-Control": "no-store",
        }
        return StreamingResponse(frames(), media_type="text/event-stream", headers=headers)

    @app.post("/threads/{thread_id}/runs/wait")
    async def wait_run(thread_id: str, request: Request) -> Any:
        body = await body_of(request)
        run_input(body)
        body["stream_mode"] = ["values"]
        run = await start(request, thread_id, body)
        if isinstance(run, Response):
            return run
        last: Any = None
        try:
            async for _, chunk in execute(run, body):
                last = chunk
        except Exception as exc:
            last = {"__error__": {"error": type(exc).__name__, "message": str(exc)}}
        headers = {"Content-Location": f"/threads/{thread_id}/runs/{run.run_id}"}
        return JSONResponse(json.loads(dumps(last)), headers=headers)

    @app.post("/threads/{thread_id}/runs")
    async def create_run(thread_id: str, request: Request) -> Any:
        body = await body_of(request)
        run_input(body)
        body["stream_mode"] = ["values"]
        run = await start(request, thread_id, body)
        if isinstance(run, Response):
            return run

        async def drain() -> None:
            async for _ in execute(run, body):
                pass

        run.task = asyncio.create_task(drain())
        return run.view()

    @app.get("/threads/{thread_id}/runs/{run_id}")
    async def get_run(thread_id: str, run_id: str, request: Request) -> Any:
        run = api.runs.get(run_id)
        if await visible(request.state.caller, thread_id) is None or run is None:
            return _missing("run", run_id, request.url.path)
        if run.thread_id != thread_id:
            return _missing("run", run_id, request.url.path)
        return run.view()

    @app.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def not_implemented(rest: str, request: Request) -> Response:
        return problem(
            501,
            "not-implemented",
            f"{request.method} /langgraph/{rest} is not supported by this server yet "
            "(see docs/langgraph-api.md for what is)",
            instance=request.url.path,
            endpoint=f"{request.method} /{rest}",
        )

    return app


async def close_langgraph(app: Any) -> None:
    """Close the LangGraph API mounted in ``app`` (``create_app``), if any."""
    for route in getattr(app, "routes", ()):
        api = getattr(getattr(getattr(route, "app", None), "state", None), "langgraph", None)
        if getattr(route, "path", None) == "/langgraph" and isinstance(api, LangGraphAPI):
            await api.close()
