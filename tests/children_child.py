"""A worker process for the child-run acceptance test:
``python -m tests.children_child URL WORKER_ID DIR TTL``.

Targets:
- ``supervisor``: an agent with the ``delegate("researcher")`` tool. Its model is decided by
  the conversation, not by a turn counter (a process that takes the run over starts with a
  fresh model): no tool result yet, three calls asking ``a``, ``b`` and ``c``; else the
  reply ``results: <the tool results, sorted>``.
- ``researcher``: an agent whose model records ``start <request>``
  in DIR/effects.txt (fsynced), waits until DIR/release exists, and answers
  ``answer <request>``.
- ``desk``: an agent with the ``handoff("billing")`` tool whose model records ``desk turn``
  and hands over (answering itself only if it ever sees a tool result: it must not).
- ``billing``: an agent whose model records ``billing start``, waits until DIR/release
  exists, and answers ``refunded``.

Every 10 ms the worker writes DIR/<worker id>.gauge: the dispatches it runs now
(``Worker.busy``, the ids behind it, and its gauge ``wakeful_worker_running_dispatches``).
On SIGTERM it stops gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from wakeful import open_store
from wakeful.agent import Agent, delegate, handoff
from wakeful.fleet import Registry, Worker
from wakeful.providers.base import (
    ModelRequest,
    StreamEnd,
    StreamItem,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from wakeful.runtime import ClaimPolicy


def record(directory: Path, line: str) -> None:
    with (directory / "effects.txt").open("a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


class Supervisor:
    async def _turn(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        results = sorted(str(m.content) for m in request.messages if m.role == "tool")
        if not results:
            for i, topic in enumerate("abc"):
                arguments = json.dumps({"request": topic})
                yield ToolCallDelta(index=i, id=f"c{i}", name="ask_researcher", arguments=arguments)
            yield StreamEnd("tool_use", Usage(10, 10))
            return
        yield TextDelta("results: " + ", ".join(results))
        yield StreamEnd("end_turn", Usage(10, 10))

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        return self._turn(request)


class Researcher:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    async def _turn(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        asked = str(next(m.content for m in request.messages if m.role == "user"))
        record(self.directory, f"start {asked}")
        while not (self.directory / "release").exists():  # noqa: ASYNC110 - another process
            await asyncio.sleep(0.01)
        if not any(m.role == "assistant" for m in request.messages):
            yield TextDelta(f"answer {asked}")
        # else: a continuation of a reply cut off by a kill; its one delta was all of it
        yield StreamEnd("end_turn", Usage(10, 10))

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        return self._turn(request)


class Desk:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    async def _turn(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        record(self.directory, "desk turn")
        if any(m.role == "tool" for m in request.messages):
            yield TextDelta("the desk answered itself")
            yield StreamEnd("end_turn", Usage(10, 10))
            return
        arguments = json.dumps({"request": "Refund the order."})
        yield ToolCallDelta(index=0, id="h0", name="transfer_to_billing", arguments=arguments)
        yield StreamEnd("tool_use", Usage(10, 10))

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        return self._turn(request)


class Billing:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    async def _turn(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        record(self.directory, "billing start")
        while not (self.directory / "release").exists():  # noqa: ASYNC110 - another process
            await asyncio.sleep(0.01)
        if not any(m.role == "assistant" for m in request.messages):
            yield TextDelta("refunded")
        yield StreamEnd("end_turn", Usage(10, 10))

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        return self._turn(request)


def registry(directory: Path) -> Registry:
    supervisor = Agent("supervisor", Supervisor(), "Delegate.", [delegate("researcher")])
    researcher = Agent("researcher", Researcher(directory), "Answer.")
    desk = Agent("desk", Desk(directory), "Route.", [handoff("billing")])
    billing = Agent("billing", Billing(directory), "Bill.")
    return (
        Registry()
        .add("supervisor", supervisor)
        .add("researcher", researcher)
        .add("desk", desk)
        .add("billing", billing)
    )


async def gauge(worker: Worker, path: Path) -> None:
    partial = path.with_name(path.name + ".partial")
    while True:
        running = sorted(worker._running)  # the dispatches behind ``busy``
        gauge = worker.metrics.running.value()  # wakeful_worker_running_dispatches
        partial.write_text(json.dumps({"busy": worker.busy, "running": running, "gauge": gauge}))
        partial.replace(path)
        await asyncio.sleep(0.01)


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
    )
    loop = asyncio.get_running_loop()
    stopping = loop.create_task(asyncio.Event().wait())
    loop.add_signal_handler(signal.SIGTERM, stopping.cancel)
    running = loop.create_task(worker.run())
    sampling = loop.create_task(gauge(worker, directory / f"{worker_id}.gauge"))
    (directory / f"{worker_id}.up").write_text("up")
    with contextlib.suppress(asyncio.CancelledError):
        await stopping
    sampling.cancel()
    await worker.stop(grace=2)
    await running
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), float(sys.argv[4])))
