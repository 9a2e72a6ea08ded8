"""Helpers for the HTTP API tests: the API on a real uvicorn (127.0.0.1, ephemeral port, in
the test's event loop), clients per token, threads seeded through the store API, and a
Server-Sent Events reader."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, TypedDict

import httpx
import uvicorn
from fastapi import FastAPI

from wakeful.fleet.registry import Registry
from wakeful.records import Checkpoint, Commit, Dispatch, EventDraft, Message, Retry
from wakeful.runtime import START, Graph, NodeContext, append
from wakeful.runtime.graph import CompiledGraph
from wakeful.server.access import tenant_scope
from wakeful.server.app import create_app
from wakeful.server.runner import Server
from wakeful.store.contract import Store

DEADLINE = 20.0

ALPHA = "alpha-token-0001"
BETA = "beta-token-00001"
OPERATOR = "operator-token-01"
TOKENS = {ALPHA: "alpha", BETA: "beta", OPERATOR: "*"}


def keyed(tenant: str, key: str) -> str:
    """The dispatch id a tenant's ``Idempotency-Key`` is stored as (docs/http-api.md,
    Idempotency)."""
    return f"{tenant_scope(tenant)}.{key}"


class Notes(TypedDict):
    log: Annotated[list[str], append]


def echo_graph() -> CompiledGraph:
    async def note(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        return {"log": ["echo"]}

    return Graph(Notes, name="echo").node("note", note).edge(START, "note").compile()


def approval_graph() -> CompiledGraph:
    """Asks one question (a ticket), then records the answer."""

    async def ask(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        answer = ctx.interrupt("ship it?")
        return {"log": [f"answer:{answer}"]}

    return Graph(Notes, name="approval").node("ask", ask).edge(START, "ask").compile()


def registry() -> Registry:
    return Registry(default="echo").add("echo", echo_graph()).add("approval", approval_graph())


@asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[str]:
    """Serve ``app`` until the block ends; yields its base URL."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_config=None, log_level="warning", lifespan="off"
    )
    server = Server(config)
    serving_task = asyncio.create_task(server.serve())
    ready = asyncio.create_task(server.ready.wait())
    try:
        await asyncio.wait(
            {serving_task, ready}, timeout=DEADLINE, return_when=asyncio.FIRST_COMPLETED
        )
        if not server.started:
            raise AssertionError("uvicorn did not start in time")
        yield f"http://127.0.0.1:{server.port}"
    finally:
        ready.cancel()
        server.should_exit = True
        await asyncio.wait_for(serving_task, DEADLINE)


@dataclass
class Api:
    url: str
    store: Store
    app: FastAPI
    clients: list[httpx.AsyncClient] = field(default_factory=list)

    def client(self, token: str | None = ALPHA) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        made = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=DEADLINE)
        self.clients.append(made)
        return made


@asynccontextmanager
async def running_api(
    store: Store, tokens: Mapping[str, str] | None = TOKENS, **options: Any
) -> AsyncIterator[Api]:
    """The API over ``store`` on a live server, with clients closed at the end."""
    app = create_app(store, tokens=tokens, **options)
    async with serving(app) as url:
        api = Api(url, store, app)
        try:
            yield api
        finally:
            for client in api.clients:
                await client.aclose()


async def seed_thread(
    store: Store,
    thread_id: str,
    *,
    tenant: str | None = None,
    run_id: str = "run-1",
    status: Any = "completed",
    events: int = 0,
    messages: int = 0,
    tickets: tuple[str, ...] = (),
    state: Any = None,
    graph: str = "g",
) -> None:
    """Commit one checkpoint of ``run_id`` of ``graph`` (with events and messages) under a
    claim."""
    claim = await store.claim(thread_id, "seeder", 30)
    snap = await store.read(thread_id)
    latest = snap.checkpoint if snap is not None else None
    ordinal = (snap.version if snap is not None else 0) + 1
    checkpoint = Checkpoint(
        id=f"{run_id}-c{ordinal}",
        parent=latest.id if latest is not None else None,
        run_id=run_id,
        status=status,
        state=state if state is not None else {"ordinal": ordinal},
        created_at=datetime.now(UTC),
        tenant=tenant,
        metadata={
            "graph": graph,
            "tickets": [
                {"id": t, "task_id": "task", "node": "ask", "question": f"q {t}?"} for t in tickets
            ],
        },
    )
    first_message = snap.message_count if snap is not None else 0
    await store.commit(
        thread_id,
        Commit(
            token=claim.token,
            checkpoint=checkpoint,
            events=tuple(
                EventDraft(type="step", data={"i": i}, run_id=run_id) for i in range(events)
            ),
            messages=tuple(
                Message(id=f"m{first_message + i}", role="user", content=f"hello {i}")
                for i in range(messages)
            ),
        ),
    )
    await store.release(thread_id, claim.token)


async def add_events(store: Store, thread_id: str, count: int, kind: str = "step") -> list[int]:
    """Commit ``count`` events (no checkpoint); returns their seqs."""
    claim = await store.claim(thread_id, "seeder", 30)
    receipt = await store.commit(
        thread_id,
        Commit(
            token=claim.token,
            events=tuple(EventDraft(type=kind, data={"n": i}) for i in range(count)),
        ),
    )
    await store.release(thread_id, claim.token)
    return list(receipt.events)


async def exhausted_dispatch(store: Store, dispatch_id: str, thread_id: str) -> Dispatch:
    """A dispatch whose budget is really spent: claimed past ``max_attempts`` (the last
    lease comes back ``exhausted``), then settled for a retry, so no lease is live."""
    await store.enqueue(
        Dispatch(
            dispatch_id=dispatch_id,
            thread_id=thread_id,
            kind="start",
            payload={"target": "g", "input": None, "run_id": f"run-{dispatch_id}", "tenant": None},
            max_attempts=1,
        )
    )
    for attempt in (1, 2):
        [lease] = await store.claim_next(f"worker-{attempt}", 30)
        assert lease.exhausted == (attempt == 2)
        await store.settle(dispatch_id, lease.claim.token, Retry(0.0, "boom"))
    d = await store.get_dispatch(dispatch_id)
    assert d is not None and d.exhausted and d.status == "pending"
    return d


@dataclass
class Frame:
    id: int | None = None
    event: str | None = None
    data: str = ""
    comment: str | None = None


class SSEReader:
    """Reads Server-Sent Events frames from a streamed httpx response."""

    def __init__(self, response: httpx.Response) -> None:
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/event-stream")
        self._lines = response.aiter_lines()

    async def frame(self) -> Frame:
        frame = Frame()
        data: list[str] = []
        async with asyncio.timeout(DEADLINE):
            async for line in self._lines:
                if line == "":
                    if frame.id is not None or frame.event is not None or data:
                        frame.data = "\n".join(data)
                        return frame
                    if frame.comment is not None:
                        return frame
                    continue
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "":
                    frame.comment = value
                elif name == "id":
                    frame.id = int(value)
                elif name == "event":
                    frame.event = value
                elif name == "data":
                    data.append(value)
        raise AssertionError("the stream ended")

    async def events(self, count: int) -> list[Frame]:
        """The next ``count`` event frames (keep-alive comments are skipped)."""
        got: list[Frame] = []
        while len(got) < count:
            frame = await self.frame()
            if frame.comment is None:
                got.append(frame)
        return got

    async def ended(self) -> bool:
        """Whether the stream ends (after keep-alives) within the deadline."""
        async with asyncio.timeout(DEADLINE):
            async for line in self._lines:
                if line.startswith(("id:", "data:")):
                    return False
        return True


STREAM = {"Accept": "text/event-stream"}
