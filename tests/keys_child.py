"""A worker process for the concurrency-key fleet test: ``python -m tests.keys_child URL
WORKER_ID DIR``. It serves the graph ``slow``, whose one node appends ``start`` and ``end``
lines (time, pid, run id) to DIR/runs.log around a short sleep, with room for three runs
at once (concurrency 3) and a short claim (ttl 1.5 s, renewed every 0.3 s). DIR/WORKER_ID.up
says it runs; on SIGTERM it stops gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, TypedDict

from wakeful import open_store
from wakeful.fleet import Registry, Worker
from wakeful.runtime import START, ClaimPolicy, Graph, NodeContext


class State(TypedDict, total=False):
    i: int
    done: bool


def _log(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one short write: whole lines, never interleaved
        os.fsync(fd)
    finally:
        os.close(fd)


def slow(directory: Path) -> Any:
    log = directory / "runs.log"

    async def work(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        _log(log, f"start {time.time():.6f} {os.getpid()} {ctx.run_id}\n")
        await asyncio.sleep(0.25)
        _log(log, f"end {time.time():.6f} {os.getpid()} {ctx.run_id}\n")
        return {"done": True}

    return Graph(State, name="slow").node("work", work).edge(START, "work").compile()


async def main(url: str, worker_id: str, directory: Path) -> None:
    store = await open_store(url)
    worker = Worker(
        store,
        Registry().add("slow", slow(directory)),
        concurrency=3,
        claims=ClaimPolicy(ttl=1.5, renew_every=0.3),
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
    await worker.stop(grace=1)
    await running
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
