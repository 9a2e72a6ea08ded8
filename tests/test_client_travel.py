"""Time travel through the Python client (issue 37) against a real server and a worker in
the same process: replay from a checkpoint, edit state, fork, edit a message and
regenerate, and the history that shows the branches; the sync client has the same methods."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tests.server_support import ALPHA, BETA, Api, running_api
from tests.test_server_travel import router_graph
from wakeful import InvalidInput, InvalidState, NotFound
from wakeful.agent import Agent
from wakeful.client import Client, SyncClient
from wakeful.fleet import LocalWake, Registry, Worker
from wakeful.providers.scripted import Scripted


@asynccontextmanager
async def fleet() -> AsyncIterator[Api]:
    from wakeful.store.memory import MemoryStore

    store = MemoryStore()
    wake = LocalWake()
    model = Scripted.replies("one", "two", "two, edited", "two, again")
    registry = Registry(default="router").add("router", router_graph())
    registry.add("helper", Agent("helper", model))
    worker = Worker(store, registry, wake=wake, poll_interval=0.05)
    running = asyncio.create_task(worker.run())
    try:
        async with running_api(store, registry=registry, wake=wake) as api:
            yield api
    finally:
        await worker.stop(2)
        await running


async def _run(client: Client, thread_id: str, target: str, input: Any = None, **kw: Any) -> Any:
    accepted = await client.runs.create(thread_id, target, input, **kw)
    return await client.runs.wait(thread_id, accepted["run_id"])


@pytest.mark.asyncio
async def test_replay_edit_state_and_fork_through_the_client() -> None:
    async with fleet() as api, Client(api.url, ALPHA) as client:
        done = await _run(client, "t1", "router", {"trail": [], "x": -1})
        assert done["state"]["trail"] == ["decide", "neg"]
        page = await client.threads.history("t1")
        assert [e["nodes"] for e in page["entries"]] == [["neg"], ["decide"], []]
        after_decide = page["entries"][1]["checkpoint_id"]

        edited = await client.threads.update_state(
            "t1", {"x": 5}, as_node="decide", checkpoint_id=after_decide
        )
        assert edited["entry"]["status"] == "suspended"
        assert [t["node"] for t in edited["frontier"]] == ["pos"]
        cp = edited["entry"]["checkpoint_id"]
        done = await _run(client, "t1", "router", from_checkpoint=cp)
        assert done["state"]["trail"] == ["decide", "pos"] and done["status"] == "completed"

        page = await client.threads.history("t1")
        assert [e["nodes"] for e in page["entries"] if not e["current"]] == [["neg"]]
        assert [b["fork_point"] for b in page["branches"]] == [after_decide]
        old = await client.threads.checkpoint("t1", page["entries"][-2]["checkpoint_id"])
        assert old["state"]["trail"] == ["decide"]

        copy = await client.threads.fork("t1", "t2", checkpoint_id=after_decide)
        assert copy["thread_id"] == "t2" and copy["state"]["trail"] == ["decide"]
        with pytest.raises(InvalidState):
            await client.threads.fork("t1", "t2")
        with pytest.raises(InvalidInput) as bad:
            await client.threads.update_state("t1", {"x": 1}, as_node="nobody")
        assert bad.value.field == "as_node"
        async with Client(api.url, BETA) as beta:
            with pytest.raises(NotFound):
                await beta.threads.history("t1")

        def sync_reads() -> tuple[Any, Any]:
            with SyncClient(api.url, ALPHA) as sync:
                return sync.threads.history("t1", limit=1), sync.threads.fork("t1", "t3")

        first, forked = await asyncio.to_thread(sync_reads)
        assert first["entries"][0]["head"] is True and first["next_before"]
        assert forked["state"]["trail"] == ["decide", "pos"]


@pytest.mark.asyncio
async def test_edit_a_message_and_regenerate_through_the_client() -> None:
    async with fleet() as api, Client(api.url, ALPHA) as client:
        for text in ("first", "second"):
            await _run(client, "chat", "helper", text)
        said = (await client.threads.messages("chat"))["messages"]
        second = said[2]
        accepted = await client.messages.edit("chat", second["id"], "second, edited")
        await client.runs.wait("chat", accepted["run_id"])
        said = (await client.threads.messages("chat"))["messages"]
        assert [(m["role"], m["content"]) for m in said] == [
            ("user", "first"),
            ("assistant", "one"),
            ("user", "second, edited"),
            ("assistant", "two, edited"),
        ]
        accepted = await client.runs.regenerate("chat")
        await client.runs.wait("chat", accepted["run_id"])
        said = (await client.threads.messages("chat"))["messages"]
        assert [m["content"] for m in said] == ["first", "one", "second, edited", "two, again"]
        page = await client.threads.history("chat", limit=100)
        assert len(page["branches"]) == 2
        with pytest.raises(InvalidInput):
            await client.messages.edit("chat", said[1]["id"], "an answer is not editable")
