"""A worker process for the fleet tests: ``python -m tests.fleet_child URL WORKER_ID DIR TTL``.

Registered targets (every node call is appended to DIR/effects.txt and fsynced):
- ``steps``: a -> b -> c. The first call of ``b`` ever (no DIR/b.started yet) writes that
  marker and then waits until DIR/release-b exists.
- ``crasher``: one node that records its call and kills its own process with SIGKILL.
On SIGTERM the worker stops gracefully and prints its stats as JSON."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, TypedDict

from wakeful import open_store
from wakeful.fleet import Registry, Worker
from wakeful.runtime import START, ClaimPolicy, Graph, append


class State(TypedDict):
    log: Annotated[list[str], append]


def record(directory: Path, line: str) -> None:
    with (directory / "effects.txt").open("a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def registry(directory: Path) -> Registry:
    def plain(name: str) -> Any:
        def node(state: dict[str, Any]) -> dict[str, Any]:
            record(directory, name)
            return {"log": [name]}

        return node

    async def b(state: dict[str, Any]) -> dict[str, Any]:
        record(directory, "b")
        marker = directory / "b.started"
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            while not (directory / "release-b").exists():  # noqa: ASYNC110 - set by another process
                await asyncio.sleep(0.01)
        return {"log": ["b"]}

    def crash(state: dict[str, Any]) -> dict[str, Any]:
        record(directory, "crash")
        os.kill(os.getpid(), signal.SIGKILL)
        return {}

    steps = Graph(State, name="steps").node("a", plain("a")).node("b", b).node("c", plain("c"))
    crasher = Graph(State, name="crasher").node("crash", crash).edge(START, "crash")
    return (
        Registry()
        .add("steps", steps.edge(START, "a").edge("a", "b").edge("b", "c").compile())
        .add("crasher", crasher.compile())
    )


async def main(url: str, worker_id: str, directory: Path, ttl: float) -> None:
    store = await open_store(url)
    worker = Worker(
        store,
        registry(directory),
        concurrency=2,
        claims=ClaimPolicy(ttl=ttl, renew_every=ttl / 4),
        worker_id=worker_id,
        poll_interval=0.05,
        retry_backoff=0.05,
        relay=False,
    )
    loop = asyncio.get_running_loop()
    stopping = loop.create_task(asyncio.Event().wait())
    loop.add_signal_handler(signal.SIGTERM, stopping.cancel)
    running = loop.create_task(worker.run())
    (directory / f"{worker_id}.up").write_text("up")
    with contextlib.suppress(asyncio.CancelledError):
        await stopping
    await worker.stop(grace=2)
    await running
    await store.close()
    print(json.dumps(asdict(worker.stats)), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), float(sys.argv[4])))
