"""The LangGraph API's thread routes (create, get, search, count, update, delete, copy) over
the durable thread records of ``wakeful.server.langgraph_records``, and the assistants'
extras (count, graph, schemas). ``add_thread_routes`` registers them on the API's app
before its catch-all 501 route. See docs/langgraph-api.md and decision 0053.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from wakeful.fleet.tokens import Caller
from wakeful.server.langgraph_records import Exists, ThreadEntry
from wakeful.server.langgraph_views import ThreadRecord, Unsupported, config_for, dumps, snapshot
from wakeful.server.problems import problem

if TYPE_CHECKING:
    from wakeful.server.langgraph_api import LangGraphAPI

Body = Callable[[Request], Awaitable[dict[str, Any]]]
STATUSES = ("idle", "busy", "interrupted", "error")
SEARCH_REFUSED = ("values", "select", "extract")
SORTS = ("created_at", "updated_at", "thread_id")


def _missing(kind: str, ident: str, path: str) -> Response:
    return problem(404, "not-found", f"{kind} {ident!r} does not exist", instance=path)


def _metadata(body: dict[str, Any], required: bool = False) -> dict[str, Any]:
    metadata = body.get("metadata")
    if metadata is None and not required:
        return {}
    if not isinstance(metadata, dict):
        raise ValueError("metadata must be an object")
    return metadata


def page_of(body: dict[str, Any]) -> tuple[int, int]:
    limit, offset = int(body.get("limit", 10)), int(body.get("offset", 0))
    if limit < 0 or offset < 0:
        raise ValueError("limit and offset must not be negative")
    return limit, offset


def record_of(entry: ThreadEntry, cached: ThreadRecord | None) -> ThreadRecord:
    """The in-memory record of a durable one: ``cached``'s run state (the run occupying the
    thread is this process's), the durable metadata and times."""
    record = cached or ThreadRecord(entry.thread_id, entry.tenant, dict(entry.metadata))
    record.tenant = entry.tenant
    record.metadata = dict(entry.metadata)
    record.created_at, record.updated_at = entry.created_at, entry.updated_at
    if record.assistant_id is None:
        record.assistant_id = entry.graph
    return record


def add_thread_routes(app: FastAPI, api: LangGraphAPI, body_of: Body) -> None:
    """Register the thread routes and the assistants' extras on ``app``."""

    def sees(caller: Caller, tenant: str | None) -> bool:
        return caller.operator or tenant == caller.tenant

    async def visible(caller: Caller, thread_id: str) -> ThreadRecord | None:
        """The thread's record with its durable metadata, if ``caller`` may see it."""
        try:
            uuid.UUID(thread_id)
        except ValueError:
            return None
        cached = api.threads.get(thread_id) or await api.recover(thread_id)
        if cached is None:
            return None
        entry = await api.records.get(thread_id)
        record = cached if entry is None else record_of(entry, cached)
        return record if sees(caller, record.tenant) else None

    def metadata_of(record: ThreadRecord) -> dict[str, Any]:
        """The thread's metadata as LangGraph's server shows it: once a graph ran on the
        thread, ``graph_id`` and ``assistant_id`` (what agent-chat-ui searches by), unless
        the caller's metadata sets them."""
        if record.assistant_id is None:
            return record.metadata
        graph = record.assistant_id
        return {"graph_id": graph, "assistant_id": api.assistant_id(graph), **record.metadata}

    async def view(record: ThreadRecord, *, values: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "thread_id": record.thread_id,
            "created_at": record.created_at,
            "updated_at": record.updated_at,
            "state_updated_at": record.updated_at,
            "metadata": metadata_of(record),
            "status": "busy" if await api.busy(record) else "idle",
            "config": {},
            "values": None,
        }
        if values and record.assistant_id in api.graphs:
            # a thread that ran: its values, interrupts and error, as LangGraph's server
            graph = api.graph(str(record.assistant_id))
            snap = await graph.aget_state(config_for(record.thread_id))
            out["values"] = snapshot(snap)["values"]
            out["interrupts"], out["error"] = {}, None
            if snap.next and out["status"] != "busy":
                out["status"] = "interrupted"
        return out

    @app.post("/threads")
    async def create_thread(request: Request) -> Any:
        body = await body_of(request)
        caller: Caller = request.state.caller
        for name in ("supersteps", "ttl"):
            if body.get(name) is not None:
                raise Unsupported(f"threads.create with {name}")
        if body.get("if_exists") not in (None, "raise", "do_nothing"):
            raise ValueError("if_exists must be 'raise' or 'do_nothing'")
        thread_id = str(body.get("thread_id") or uuid.uuid4())
        uuid.UUID(thread_id)  # ValueError -> 422: LangGraph thread ids are UUIDs
        metadata = _metadata(body)
        graph = metadata.get("graph_id") if metadata.get("graph_id") in api.graphs else None
        known = api.threads.get(thread_id) or await api.recover(thread_id)
        try:
            if known is not None:
                raise Exists(thread_id)
            entry = await api.records.create(thread_id, caller.tenant, metadata, graph)
        except Exists:
            if body.get("if_exists") == "do_nothing":
                existing = await visible(caller, thread_id)
                if existing is not None:
                    return await view(existing, values=False)
            return problem(
                409, "conflict", f"thread {thread_id!r} already exists", instance=request.url.path
            )
        record = record_of(entry, None)
        api.threads[thread_id] = record
        return await view(record, values=False)

    async def matching(caller: Caller, body: dict[str, Any]) -> list[ThreadRecord]:
        """The caller's threads with every given metadata key equal (and among ``ids`` when
        given), sorted by ``sort_by`` (``created_at`` by default) in ``sort_order`` (``desc``
        by default)."""
        for name in SEARCH_REFUSED:
            if body.get(name) is not None:
                raise Unsupported(f"threads search by {name!r}")
        wanted = _metadata(body)
        ids = body.get("ids")
        if ids is not None and not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
            raise ValueError("ids must be a list of thread ids")
        sort_by, order = body.get("sort_by") or "created_at", body.get("sort_order") or "desc"
        if sort_by not in SORTS or order not in ("asc", "desc"):
            raise ValueError(f"sort_by must be one of {list(SORTS)}, sort_order asc or desc")
        found = []
        async for entry in api.records.scan(caller.tenant, every_tenant=caller.operator):
            if ids is not None and entry.thread_id not in ids:
                continue
            record = record_of(entry, api.threads.get(entry.thread_id))
            api.threads[entry.thread_id] = record
            metadata = metadata_of(record)
            if all(metadata.get(k) == v for k, v in wanted.items()):
                found.append(record)
        found.sort(key=lambda r: (getattr(r, sort_by), r.thread_id), reverse=order == "desc")
        return found

    async def with_status(records: list[ThreadRecord], status: Any) -> list[dict[str, Any]]:
        if status is not None and status not in STATUSES:
            raise ValueError(f"status must be one of {list(STATUSES)}")
        views = [await view(r, values=True) for r in records]
        return [v for v in views if status in (None, v["status"])]

    @app.post("/threads/search")
    async def search_threads(request: Request) -> Any:
        body = await body_of(request)
        limit, offset = page_of(body)
        found = await matching(request.state.caller, body)
        if body.get("status") is None:  # read the state of the page only
            return await with_status(found[offset : offset + limit], None)
        return (await with_status(found, body["status"]))[offset : offset + limit]

    @app.post("/threads/count")
    async def count_threads(request: Request) -> Any:
        body = await body_of(request)
        found = await matching(request.state.caller, body)
        if body.get("status") is None:
            return len(found)
        return len(await with_status(found, body["status"]))

    @app.get("/threads/{thread_id}")
    async def get_thread(thread_id: str, request: Request) -> Any:
        record = await visible(request.state.caller, thread_id)
        if record is None:
            return _missing("thread", thread_id, request.url.path)
        return await view(record, values=True)

    @app.patch("/threads/{thread_id}")
    async def update_thread(thread_id: str, request: Request) -> Any:
        body = await body_of(request)
        if body.get("ttl") is not None:
            raise Unsupported("threads.update with ttl")
        metadata = _metadata(body, required=True)
        record = await visible(request.state.caller, thread_id)
        if record is None:
            return _missing("thread", thread_id, request.url.path)
        entry = await api.records.update(thread_id, metadata=metadata)
        if entry is None:  # a thread recovered from its checkpoints: give it a record now
            entry = await api.records.create(
                thread_id, record.tenant, {**record.metadata, **metadata}, record.assistant_id
            )
        record = record_of(entry, api.threads.get(thread_id))
        api.threads[thread_id] = record
        return await view(record, values=True)

    @app.delete("/threads/{thread_id}")
    async def delete_thread(thread_id: str, request: Request) -> Response:
        record = await visible(request.state.caller, thread_id)
        if record is None:
            return _missing("thread", thread_id, request.url.path)
        if record.running is not None:
            return problem(
                409,
                "thread-busy",
                f"thread {thread_id!r} is running run {record.running!r}; delete it after",
                instance=request.url.path,
            )
        await api.saver().adelete_thread(thread_id)
        await api.records.delete(thread_id)
        api.threads.pop(thread_id, None)
        return Response(status_code=204)

    @app.post("/threads/prune")
    async def prune_threads(request: Request) -> Any:
        """``delete``: the threads as ``DELETE`` deletes them; ``keep_latest``: the saver's
        ``prune`` (each keeps its latest checkpoint). Threads the caller cannot see, unknown
        ids and busy threads are skipped (not counted)."""
        body = await body_of(request)
        ids = body.get("thread_ids")
        strategy = body.get("strategy", "delete")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ValueError("thread_ids must be a list of thread ids")
        if strategy not in ("delete", "keep_latest"):
            raise ValueError("strategy must be 'delete' or 'keep_latest'")
        pruned = 0
        for thread_id in dict.fromkeys(ids):
            record = await visible(request.state.caller, thread_id)
            if record is None or record.running is not None:
                continue
            await api.saver().aprune([thread_id], strategy=strategy)
            if strategy == "delete":
                await api.records.delete(thread_id)
                api.threads.pop(thread_id, None)
            pruned += 1
        return {"pruned_count": pruned}

    @app.post("/threads/{thread_id}/copy")
    async def copy_thread(thread_id: str, request: Request) -> Any:
        """A new thread with the source's metadata, graph, tenant and every checkpoint and
        write (the saver's ``copy_thread``: one atomic commit)."""
        source = await visible(request.state.caller, thread_id)
        if source is None:
            return _missing("thread", thread_id, request.url.path)
        new_id = str(uuid.uuid4())
        await api.saver().acopy_thread(thread_id, new_id)
        entry = await api.records.create(
            new_id, source.tenant, dict(source.metadata), source.assistant_id
        )
        record = record_of(entry, None)
        api.threads[new_id] = record
        copied = await view(record, values=False)
        del copied["values"]  # LangGraph's server answers a copy without them
        return copied

    @app.get("/info")
    async def info() -> Any:
        """What LangGraph's clients read before they connect (agent-chat-ui checks it)."""
        from importlib.metadata import version

        return {
            "version": f"wakeful {version('wakeful')}",
            "langgraph_py_version": version("langgraph"),
            "flags": {"assistants": True, "crons": True, "langsmith": False},
            "metadata": {},
        }

    @app.post("/assistants/count")
    async def count_assistants(request: Request) -> Any:
        body = await body_of(request)
        if body.get("metadata"):
            raise Unsupported("assistants count by metadata")
        return sum(1 for n in api.graphs if body.get("graph_id") in (None, n))

    def graph_of(assistant_id: str) -> Any:
        name = api.graph_name(assistant_id)
        return None if name is None else api.graphs[name]

    @app.get("/assistants/{assistant_id}/graph")
    async def get_graph(assistant_id: str, request: Request) -> Any:
        graph = graph_of(assistant_id)
        if graph is None:
            return _missing("assistant", assistant_id, request.url.path)
        xray_raw = request.query_params.get("xray", "false")
        xray: bool | int = int(xray_raw) if xray_raw.isdigit() else xray_raw in ("true", "True")
        drawn: dict[str, Any] = json.loads(dumps((await graph.aget_graph(xray=xray)).to_json()))
        for node in drawn.get("nodes", ()):
            data = node.get("data")
            if isinstance(data, dict):  # a Python class path, as LangGraph's server omits it
                data.pop("id", None)
        return drawn

    @app.get("/assistants/{assistant_id}/schemas")
    async def get_schemas(assistant_id: str, request: Request) -> Any:
        graph = graph_of(assistant_id)
        if graph is None:
            return _missing("assistant", assistant_id, request.url.path)
        return {
            "graph_id": api.graph_name(assistant_id),
            "input_schema": _schema(graph.get_input_jsonschema),
            "output_schema": _schema(graph.get_output_jsonschema),
            "state_schema": _schema(lambda: _state_schema(graph)),
            "config_schema": _schema(graph.get_config_jsonschema),
            "context_schema": _schema(graph.get_context_jsonschema),
        }


def _schema(make: Callable[[], Any]) -> Any:
    """A JSON schema, or ``None`` when pydantic cannot draw one (a ``typing.TypedDict``
    state on Python < 3.12, an arbitrary class): the graph still runs."""
    try:
        return json.loads(dumps(make()))
    except Exception:
        return None


def _state_schema(graph: Any) -> Any:
    """The JSON schema of a ``StateGraph``'s state (``None`` for other graphs)."""
    state = getattr(getattr(graph, "builder", None), "state_schema", None)
    if state is None:
        return None
    from pydantic import TypeAdapter

    return TypeAdapter(state).json_schema()
