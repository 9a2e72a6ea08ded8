"""A versioned worker process for the rolling-deploy test:
``python -m tests.deploy_child URL WORKER_ID DIR VERSION PIN_GRACE``.

Target ``job``: ``prepare`` -> ``approve`` (suspends for an answer) -> ``charge`` (a
never-replayed side effect: marked started before it acts, so an attempt after a crash
records ``charge-unknown`` instead of charging again) -> ``cool`` (a durable sleep of 0.5 s:
the run commits, leaves its worker and is woken by a worker of its version) -> ``ship``
(slow: 0.3 s). Every node
call is appended to DIR/effects.txt as ``node thread version`` and fsynced. The graph is the
same in every version (the structure did not change, so the default policy continues a run
whose version left). On SIGTERM the worker stops gracefully (grace 1 s)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

from wakeful import open_store
from wakeful.fleet import Registry, Worker
from wakeful.runtime import START, ClaimPolicy, Graph, NodeContext, append


class State(TypedDict):
    log: Annotated[list[str], append]


def registry(directory: Path, version: str) -> Registry:
    def record(name: str, thread: str) -> None:
        with (directory / "effects.txt").open("a", encoding="utf-8") as f:
            f.write(f"{name} {thread} {version}\n")
            f.flush()
            os.fsync(f.fileno())

    def prepare(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        record("prepare", ctx.thread_id)
        return {"log": ["prepared"]}

    def approve(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        ctx.interrupt("ship it?")
        return {"log": ["approved"]}

    async def charge(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        if ctx.has_mark("started"):
            record("charge-unknown", ctx.thread_id)
            return {"log": ["charge unknown"]}
        await ctx.mark("started")
        record("charge", ctx.thread_id)
        return {"log": ["charged"]}

    async def cool(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        await ctx.sleep(0.5)  # returns at once when the run wakes (the node runs again)
        record("woke", ctx.thread_id)
        return {"log": ["cooled"]}

    async def ship(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        await asyncio.sleep(0.3)
        record("ship", ctx.thread_id)
        return {"log": [f"shipped on {version}"]}

    g = Graph(State, name="job")
    g.node("prepare", prepare).node("approve", approve).node("charge", charge)
    g.node("cool", cool).node("ship", ship)
    g.edge(START, "prepare").edge("prepare", "approve").edge("approve", "charge")
    g.edge("charge", "cool").edge("cool", "ship")
    return Registry().add("job", g.compile())


async def main(url: str, worker_id: str, directory: Path, version: str, grace: float) -> None:
    store = await open_store(url)
    worker = Worker(
        store,
        registry(directory, version),
        concurrency=8,
        claims=ClaimPolicy(ttl=1.0, renew_every=0.25),
        worker_id=worker_id,
        poll_interval=0.05,
        retry_backoff=0.05,
        relay=False,
        version=version,
        pin_grace=grace,
    )
    loop = asyncio.get_running_loop()
    stopping = loop.create_task(asyncio.Event().wait())
    loop.add_signal_handler(signal.SIGTERM, stopping.cancel)
    running = loop.create_task(worker.run())
    await worker.started()
    (directory / f"{worker_id}.up").write_text("up")
    with contextlib.suppress(asyncio.CancelledError):
        await stopping
    await worker.stop(grace=1.0)
    await running
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4], float(sys.argv[5])))
