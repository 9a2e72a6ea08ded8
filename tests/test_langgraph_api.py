"""The LangGraph API at ``/langgraph``, driven by the official ``langgraph-sdk`` async
client against a real uvicorn server on loopback over a SQLite store: assistants, threads,
runs (stream with values and updates, wait, an interrupt resumed with a command), state and
history as stored by the fenced ``WakefulSaver``; tenants; 501 for what is not supported."""

from __future__ import annotations

import asyncio
import operator
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from itertools import cycle
from pathlib import Path
from typing import Annotated, Any, TypedDict

import httpx
import pytest
import pytest_asyncio
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import interrupt
from langgraph_sdk import get_client
from langgraph_sdk.errors import NotFoundError

from tests.langgraph_api_app import steps_graph
from tests.postgres_support import Databases
from tests.server_support import echo_graph, serving
from wakeful import open_store
from wakeful.errors import InvalidInput
from wakeful.fleet.registry import Registry
from wakeful.langgraph import WakefulSaver
from wakeful.server import create_app
from wakeful.server.langgraph_api import close_langgraph

pytest_plugins = ["tests.postgres_fixtures"]

ROOT = Path(__file__).resolve().parent.parent

TOKENS = {"token-acme-1234": "acme", "token-globex-99": "globex"}


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def approval_graph() -> Any:
    def ask(state: State) -> dict[str, Any]:
        return {"log": [f"answer:{interrupt('ship it?')}"]}

    builder = StateGraph(State)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    return builder.compile()


def chat_graph() -> Any:
    """A node that streams a scripted chat model's reply (no paid API) and writes a custom
    event."""
    model = GenericFakeChatModel(messages=cycle([AIMessage(content="hello from wakeful")]))

    async def call(state: MessagesState) -> dict[str, Any]:
        get_stream_writer()({"progress": "calling"})
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("call", call)
    builder.add_edge(START, "call")
    builder.add_edge("call", END)
    return builder.compile()


@pytest_asyncio.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[str, Any]]:
    async with serve(f"sqlite:///{tmp_path / 'lg.db'}") as served:
        yield served


@asynccontextmanager
async def serve(store_url: str) -> AsyncIterator[tuple[str, Any]]:
    """``create_app`` with two LangGraph graphs over the store at ``store_url``, served by
    uvicorn on loopback: yields the ``/langgraph`` base URL and the store."""
    store = await open_store(store_url)
    registry = Registry().add("steps", steps_graph()).add("approval", approval_graph())
    registry.add("chat", chat_graph())
    app = create_app(store, registry, TOKENS)
    OPENED.clear()
    try:
        async with serving(app) as url:
            yield f"{url}/langgraph", store
    finally:
        for sdk in OPENED:
            await sdk.aclose()
        await close_langgraph(app)
        await store.close()


OPENED: list[Any] = []


def client(url: str, token: str = "token-acme-1234") -> Any:
    """An SDK client (closed when the test's server stops)."""
    sdk = get_client(url=url, headers={"Authorization": f"Bearer {token}"})
    OPENED.append(sdk)
    return sdk


@pytest.mark.asyncio
async def test_sdk_assistants_threads_stream_wait_state_history(
    served: tuple[str, Any],
) -> None:
    await _assistants_threads_stream_wait_state_history(*served)


@pytest.mark.asyncio
@pytest.mark.postgres
async def test_sdk_on_postgres(pg_databases: Databases) -> None:
    async with serve(await pg_databases.clone()) as served:
        await _assistants_threads_stream_wait_state_history(*served)


async def _assistants_threads_stream_wait_state_history(url: str, store: Any) -> None:
    sdk = client(url)
    assistants = await sdk.assistants.search()
    assert sorted(a["graph_id"] for a in assistants) == ["approval", "chat", "steps"]
    steps = next(a for a in assistants if a["graph_id"] == "steps")
    assert (await sdk.assistants.get(steps["assistant_id"]))["graph_id"] == "steps"

    thread = await sdk.threads.create(metadata={"owner": "test"})
    parts = [
        (part.event, part.data)
        async for part in sdk.runs.stream(
            thread["thread_id"],
            steps["assistant_id"],
            input={"log": ["in"]},
            stream_mode=["values", "updates"],
        )
    ]
    assert parts[0][0] == "metadata" and parts[0][1]["run_id"]
    assert parts[1:] == [
        ("values", {"log": ["in"]}),
        ("updates", {"one": {"log": ["one"]}}),
        ("values", {"log": ["in", "one"]}),
        ("updates", {"two": {"log": ["two"]}}),
        ("values", {"log": ["in", "one", "two"]}),
    ]

    state = await sdk.threads.get_state(thread["thread_id"])
    assert state["values"] == {"log": ["in", "one", "two"]} and state["next"] == []
    history = await sdk.threads.get_history(thread["thread_id"], limit=10)
    assert [h["values"].get("log") for h in history] == [
        ["in", "one", "two"],
        ["in", "one"],
        ["in"],
        [],
    ]
    assert history[0]["checkpoint"]["checkpoint_id"] == state["checkpoint"]["checkpoint_id"]
    assert history[0]["parent_checkpoint"] == history[1]["checkpoint"]

    # The checkpoints are the store's: another saver over the same store reads them.
    graph = steps_graph().copy(update={"checkpointer": WakefulSaver(store, fencing="off")})
    stored = await graph.aget_state({"configurable": {"thread_id": thread["thread_id"]}})
    assert stored.values == {"log": ["in", "one", "two"]}

    other = await sdk.threads.create()
    waited = await sdk.runs.wait(other["thread_id"], "steps", input={"log": []})
    assert waited == {"log": ["one", "two"]}
    got = await sdk.threads.get(other["thread_id"])
    assert got["status"] == "idle" and got["values"] == {"log": ["one", "two"]}


@pytest.mark.asyncio
async def test_sdk_interrupt_then_resume_command(served: tuple[str, Any]) -> None:
    url, _ = served
    sdk = client(url)
    thread = await sdk.threads.create()
    first = await sdk.runs.wait(thread["thread_id"], "approval", input={"log": []})
    assert first["__interrupt__"][0]["value"] == "ship it?"
    state = await sdk.threads.get_state(thread["thread_id"])
    assert state["next"] == ["ask"]
    assert (await sdk.threads.get(thread["thread_id"]))["status"] == "interrupted"
    resumed = await sdk.runs.wait(thread["thread_id"], "approval", command={"resume": "yes"})
    assert resumed == {"log": ["answer:yes"]}


@pytest.mark.asyncio
async def test_tenants_and_tokens(served: tuple[str, Any]) -> None:
    url, _ = served
    thread = await client(url).threads.create()
    with pytest.raises(NotFoundError):
        await client(url, "token-globex-99").threads.get(thread["thread_id"])
    with pytest.raises(httpx.HTTPStatusError) as refused:  # wait raises httpx's own error
        await client(url, "token-globex-99").runs.wait(thread["thread_id"], "steps", input={})
    assert refused.value.response.status_code == 404
    async with httpx.AsyncClient() as raw:
        missing = await raw.post(f"{url}/assistants/search", json={})
        wrong = await raw.post(
            f"{url}/threads", json={}, headers={"Authorization": "Bearer not-a-token-at-all"}
        )
    assert missing.status_code == 401 and wrong.status_code == 401
    assert (await client(url).threads.get(thread["thread_id"]))["status"] == "idle"


@pytest.mark.asyncio
async def test_unsupported_answers_501_naming_it(served: tuple[str, Any]) -> None:
    url, _ = served
    headers = {"Authorization": "Bearer token-acme-1234"}
    thread = await client(url).threads.create()
    tid = thread["thread_id"]
    async with httpx.AsyncClient(headers=headers) as raw:
        crons = await raw.post(
            f"{url}/runs/crons",
            json={"assistant_id": "steps", "schedule": "* * * * *", "webhook": "http://x/"},
        )
        messages = await raw.post(
            f"{url}/threads/{tid}/runs/wait",
            json={"assistant_id": "steps", "input": {}, "stream_mode": "messages-tuple"},
        )
        strategy = await raw.post(
            f"{url}/threads/{tid}/runs/wait",
            json={"assistant_id": "steps", "input": {}, "multitask_strategy": "interrupt"},
        )
        store_items = await raw.put(f"{url}/store/items", json={})
        travel = await raw.post(
            f"{url}/threads/{tid}/runs/wait",
            json={
                "assistant_id": "steps",
                "input": {},
                "config": {"configurable": {"checkpoint_id": "x"}},
            },
        )
        events = await raw.post(
            f"{url}/threads/{tid}/runs/stream",
            json={"assistant_id": "steps", "input": {}, "stream_mode": ["values", "events"]},
        )
    assert crons.status_code == 501 and "'webhook'" in crons.json()["detail"]
    assert strategy.status_code == 501 and "multitask_strategy" in strategy.json()["detail"]
    assert travel.status_code == 501 and "checkpoint_id" in travel.json()["detail"]
    assert events.status_code == 501 and "'events'" in events.json()["detail"]
    assert store_items.status_code == 501 and "/store/items" in store_items.json()["detail"]
    # wait ignores stream_mode (it returns the last values), as LangGraph's server does
    assert messages.status_code == 200
    # nothing ran for the refused strategy: one run (the waited one) is in the history
    state = (await client(url).threads.get_state(tid))["values"]
    assert state == {"log": ["one", "two"]}


@pytest.mark.asyncio
async def test_second_run_of_a_busy_thread_is_refused(served: tuple[str, Any]) -> None:
    url, _ = served
    sdk = client(url)
    thread = await sdk.threads.create()
    tid = thread["thread_id"]
    stream = sdk.runs.stream(tid, "steps", input={"log": []}, stream_mode="values")
    first = await anext(stream)
    assert first.event == "metadata"
    async with httpx.AsyncClient(headers={"Authorization": "Bearer token-acme-1234"}) as raw:
        refused = await raw.post(
            f"{url}/threads/{tid}/runs/wait", json={"assistant_id": "steps", "input": {}}
        )
    rest = [part async for part in stream]
    assert refused.status_code == 409
    assert rest[-1].data == {"log": ["one", "two"]}


def test_registry_keeps_langgraph_graphs_apart_from_targets() -> None:
    graph = steps_graph()
    registry = Registry().add("steps", graph)
    assert registry.langgraphs == {"steps": graph}
    assert registry.names() == []  # not a worker target (decision 0050)
    with pytest.raises(InvalidInput):
        registry.add("steps", echo_graph())
    with pytest.raises(InvalidInput):
        Registry().add("echo", echo_graph()).add("echo", graph)
    with pytest.raises(InvalidInput):
        registry.add("bad name!", graph)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.asyncio
async def test_wakeful_serve_mounts_the_api(tmp_path: Path) -> None:
    """A real ``wakeful serve`` process with tokens from ``WAKEFUL_TOKENS``."""
    port = _port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "WAKEFUL_TOKENS": "token-acme-1234=acme",
    }
    args = ["serve", "--store", f"sqlite:///{tmp_path / 's.db'}", "--port", str(port)]
    args += ["--app", "tests.langgraph_api_app:registry"]
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "wakeful"),
        *args,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient() as raw:
            while True:
                try:
                    if (await raw.get(f"{url}/readyz", timeout=1)).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.returncode is None and time.monotonic() < deadline, "not ready"
                await asyncio.sleep(0.05)
        sdk = get_client(
            url=f"{url}/langgraph", headers={"Authorization": "Bearer token-acme-1234"}
        )
        try:
            assert [a["graph_id"] for a in await sdk.assistants.search()] == ["steps"]
            thread = await sdk.threads.create()
            updates = [
                part.data
                async for part in sdk.runs.stream(
                    thread["thread_id"], "steps", input={"log": []}, stream_mode="updates"
                )
            ]
            assert updates[1:] == [{"one": {"log": ["one"]}}, {"two": {"log": ["two"]}}]
            state = await sdk.threads.get_state(thread["thread_id"])
            assert state["values"] == {"log": ["one", "two"]}
        finally:
            await sdk.aclose()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0


@pytest.mark.asyncio
async def test_a_restarted_server_knows_threads_that_ran_and_whose_they_are(
    tmp_path: Path,
) -> None:
    store_url = f"sqlite:///{tmp_path / 'restart.db'}"
    async with serve(store_url) as (url, _):
        thread = await client(url).threads.create()
        tid = thread["thread_id"]
        first = await client(url).runs.wait(tid, "approval", input={"log": ["before"]})
        assert first["__interrupt__"][0]["value"] == "ship it?"
    async with serve(store_url) as (url, _):  # a new server process's records: none
        other = client(url, "token-globex-99")
        with pytest.raises(NotFoundError):
            await other.threads.get_state(tid)
        with pytest.raises(httpx.HTTPStatusError) as refused:
            await other.runs.wait(tid, "approval", input={}, if_not_exists="create")
        assert refused.value.response.status_code == 404
        state = await client(url).threads.get_state(tid)
        assert state["values"] == {"log": ["before"]} and state["next"] == ["ask"]
        resumed = await client(url).runs.wait(tid, "approval", command={"resume": "yes"})
        assert resumed == {"log": ["before", "answer:yes"]}


@pytest.mark.asyncio
async def test_sdk_streams_messages_tuple_and_custom(served: tuple[str, Any]) -> None:
    url, _ = served
    sdk = client(url)
    thread = await sdk.threads.create()
    parts = [
        (part.event, part.data)
        async for part in sdk.runs.stream(
            thread["thread_id"],
            "chat",
            input={"messages": [{"role": "user", "content": "hi"}]},
            stream_mode=["messages-tuple", "custom"],
        )
    ]
    assert ("custom", {"progress": "calling"}) in parts
    chunks = [data for event, data in parts if event == "messages"]
    assert len(chunks) > 1  # token by token, not one message
    assert "".join(message["content"] for message, _ in chunks) == "hello from wakeful"
    assert {meta["langgraph_node"] for _, meta in chunks} == {"call"}
    state = await sdk.threads.get_state(thread["thread_id"])
    assert state["values"]["messages"][-1]["content"] == "hello from wakeful"


@pytest.mark.asyncio
async def test_sdk_streams_debug_events(served: tuple[str, Any]) -> None:
    url, _ = served
    sdk = client(url)
    thread = await sdk.threads.create()
    parts = [
        (part.event, part.data)
        async for part in sdk.runs.stream(
            thread["thread_id"], "steps", input={"log": []}, stream_mode="debug"
        )
    ]
    debug = [data for event, data in parts if event == "debug"]
    kinds = [d["type"] for d in debug]
    assert {"checkpoint", "task", "task_result"} <= set(kinds), kinds
    ran = [d["payload"]["name"] for d in debug if d["type"] == "task_result"]
    assert ran == ["one", "two"]
    assert debug[-1]["payload"]["values"] == {"log": ["one", "two"]}


@pytest.mark.asyncio
async def test_sdk_threads_search_and_delete(served: tuple[str, Any]) -> None:
    url, store = served
    sdk = client(url)
    kept = await sdk.threads.create(metadata={"team": "red"})
    gone = await sdk.threads.create(metadata={"team": "blue"})
    await client(url, "token-globex-99").threads.create(metadata={"team": "red"})
    await sdk.runs.wait(gone["thread_id"], "steps", input={"log": []})
    found = await sdk.threads.search(metadata={"team": "red"})
    assert [t["thread_id"] for t in found] == [kept["thread_id"]]  # not globex's
    assert len(await sdk.threads.search()) == 2

    await sdk.threads.delete(gone["thread_id"])
    with pytest.raises(NotFoundError):
        await sdk.threads.get(gone["thread_id"])
    # the checkpoints are gone from the store too
    saver = WakefulSaver(store, fencing="off")
    assert await saver.aget_tuple({"configurable": {"thread_id": gone["thread_id"]}}) is None
    assert [t["thread_id"] for t in await sdk.threads.search()] == [kept["thread_id"]]
