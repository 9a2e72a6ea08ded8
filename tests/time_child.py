"""A worker process for the time tests: ``python -m tests.time_child URL WORKER_ID DIR TTL``.

Registered targets (every line appended to DIR/effects.txt and fsynced, with this process's
pid and the wall-clock time):
- ``tick``: one node recording ``tick THREAD``.
- ``sleeper``: ``a`` -> ``nap`` -> ``c``; ``nap`` records ``nap`` then sleeps 2 s durably
  (``ctx.sleep``) and records ``woke`` once awake.
- ``tool_sleeper``: an agent whose model (``Planner``, scripted by the conversation so far)
  calls the tool ``nap`` and, once a tool result is in the conversation, answers ``Done.``;
  the model records ``model call`` or ``model reply``, the tool ``toolnap`` before its 2 s
  durable sleep (``ToolContext.sleep``) and ``after`` if code after the sleep ever ran.
The worker fires due schedule ticks (``Worker.relay``); on SIGTERM it stops gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

from wakeful import open_store
from wakeful.agent import Agent, ToolContext, tool
from wakeful.fleet import Registry, Worker
from wakeful.providers import ModelRequest, Scripted
from wakeful.providers.base import StreamItem
from wakeful.runtime import START, ClaimPolicy, Graph, NodeContext, append


class State(TypedDict):
    log: Annotated[list[str], append]


def record(directory: Path, *words: str) -> None:
    with (directory / "effects.txt").open("a", encoding="utf-8") as f:
        f.write(" ".join((*words, str(os.getpid()), repr(time.time()))) + "\n")
        f.flush()
        os.fsync(f.fileno())


def registry(directory: Path) -> Registry:
    async def tick(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        record(directory, "tick", ctx.thread_id)
        return {"log": ["tick"]}

    async def a(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        record(directory, "a", ctx.thread_id)
        return {"log": ["a"]}

    async def nap(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        record(directory, "nap", ctx.thread_id)
        await ctx.sleep(2)
        record(directory, "woke", ctx.thread_id)
        return {"log": ["woke"]}

    async def c(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        record(directory, "c", ctx.thread_id)
        return {"log": ["c"]}

    @tool(name="nap")
    async def nap_tool(seconds: float, ctx: ToolContext) -> str:
        """Sleep a while."""
        record(directory, "toolnap", ctx.thread_id)
        await ctx.sleep(seconds)
        record(directory, "after", ctx.thread_id)  # type: ignore[unreachable]
        return "never"

    ticking = Graph(State, name="tick").node("tick", tick).edge(START, "tick")
    sleeper = Graph(State, name="sleeper").node("a", a).node("nap", nap).node("c", c)
    sleeper.edge(START, "a").edge("a", "nap").edge("nap", "c")
    agent = Agent("tool_sleeper", Planner(directory), tools=[nap_tool])
    return (
        Registry()
        .add("tick", ticking.compile())
        .add("sleeper", sleeper.compile())
        .add("tool_sleeper", agent)
    )


class Planner:
    """A scripted model that plays its turn from the conversation (so a worker that takes
    the run over mid-way answers as the first would have): a tool call, then ``Done.``."""

    model = "planner"

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        answered = any(m.role == "tool" for m in request.messages)
        record(self.directory, "model", "reply" if answered else "call")
        steps = (
            Scripted.reply("Done.") if answered else Scripted.calls(("c1", "nap", {"seconds": 2}))
        )
        return Scripted.of(steps).stream(request)


async def main(url: str, worker_id: str, directory: Path, ttl: float) -> None:
    store = await open_store(url)
    worker = Worker(
        store,
        registry(directory),
        concurrency=4,
        claims=ClaimPolicy(ttl=ttl, renew_every=ttl / 4),
        worker_id=worker_id,
        poll_interval=0.05,
        retry_backoff=0.05,
    )
    loop = asyncio.get_running_loop()
    stopping = loop.create_task(asyncio.Event().wait())
    loop.add_signal_handler(signal.SIGTERM, stopping.cancel)
    running = loop.create_task(worker.run())
    (directory / f"{worker_id}.{os.getpid()}.up").write_text("up")
    with contextlib.suppress(asyncio.CancelledError):
        await stopping
    await worker.stop(grace=2)
    await running
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), float(sys.argv[4])))
