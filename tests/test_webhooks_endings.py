"""Which endings stage a webhook, and that it is staged by the ending commit itself (issue
43): a run's completion, failure, cancellation by a cancel's claimant, the exhausted
budget's ``indeterminate`` and a suspension on a question each stage exactly one entry; a
durable sleep stages none; an ending refused by the store (a stale claim) stages nothing.
The workers here run no relay: what is staged stays in the outbox, where the test looks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any, TypedDict

import pytest
import pytest_asyncio

from tests.runtime_support import eventually
from wakeful import ManualClock
from wakeful.errors import CheckpointWriteFailed
from wakeful.fleet import LocalWake, Registry, Worker, cancel, submit
from wakeful.records import InboxMessage
from wakeful.runtime import START, ClaimPolicy, Graph, NodeContext, Runtime, append
from wakeful.runtime.webhooks import WEBHOOK_THREAD_PREFIX
from wakeful.store.memory import MemoryStore

pytestmark = pytest.mark.asyncio
URL = "https://hooks.example.com/wakeful"


class State(TypedDict):
    log: Annotated[list[str], append]


class Env:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.store = MemoryStore(self.clock)
        self.wake = LocalWake()
        self.gate = asyncio.Event()
        self.entered = 0
        self.registry = Registry()
        self.workers: list[tuple[Worker, asyncio.Task[None]]] = []

        async def slow(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
            self.entered += 1
            await self.gate.wait()
            return {"log": ["slow"]}

        async def napper(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
            await ctx.sleep(60)
            return {"log": ["woke"]}

        def asks(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
            return {"log": [str(ctx.interrupt("ship it?"))]}

        for name, fn in (("slow", slow), ("napper", napper), ("asks", asks)):
            graph = Graph(State, name=name).node("n", fn).edge(START, "n").compile()
            self.registry.add(name, graph, webhook=URL)

    def worker(self) -> Worker:
        worker = Worker(
            self.store,
            self.registry,
            claims=ClaimPolicy(ttl=30, renew_every=10),
            wake=self.wake,
            clock=self.clock,
            poll_interval=0.02,
            retry_backoff=0.0,
            relay=False,
        )
        self.workers.append((worker, asyncio.create_task(worker.run())))
        return worker

    async def staged(self) -> list[InboxMessage]:
        """Relay what the outbox holds; the webhook entries delivered so far."""
        await self.store.relay_outbox()
        found = []
        for summary in await self.store.list_dispatches():
            if summary.thread_id.startswith(WEBHOOK_THREAD_PREFIX):
                found += await self.store.inbox(summary.thread_id)
        return found

    async def status(self, thread_id: str) -> str | None:
        snap = await self.store.read(thread_id)
        return snap.checkpoint.status if snap and snap.checkpoint else None


@pytest_asyncio.fixture
async def env() -> AsyncIterator[Env]:
    made = Env()
    try:
        yield made
    finally:
        made.gate.set()
        for worker, task in made.workers:
            await worker.stop(grace=2)
            await asyncio.wait_for(task, 10)


def statuses(entries: list[InboxMessage]) -> list[str]:
    return sorted(e.payload["body"]["data"]["status"] for e in entries)


async def test_an_exhausted_budget_stages_an_indeterminate_webhook(env: Env) -> None:
    await submit(env.store, "t1", "slow", dispatch_id="d1", max_attempts=1)
    env.worker()
    await env.wake.notify()
    await eventually(lambda: env.entered == 1)
    env.clock.advance(31)  # that worker is gone as far as the store can tell
    env.worker()
    await env.wake.notify()
    await eventually(lambda: _is(env, "t1", "indeterminate"))
    (entry,) = await env.staged()
    assert entry.payload["url"] == URL
    assert entry.payload["body"]["type"] == "run.indeterminate"
    assert entry.payload["body"]["data"]["run_id"] == "run-d1"


async def test_a_cancel_stages_a_cancelled_webhook_and_a_sleep_none(env: Env) -> None:
    env.worker()
    await submit(env.store, "t1", "slow", wake=env.wake)
    await submit(env.store, "t2", "napper", wake=env.wake)
    await submit(env.store, "t3", "asks", wake=env.wake)
    await eventually(lambda: env.entered == 1)
    await cancel(env.store, "t1", wake=env.wake)
    await eventually(lambda: _is(env, "t1", "cancelled"))
    await eventually(lambda: _is(env, "t2", "suspended"))
    await eventually(lambda: _is(env, "t3", "suspended"))
    assert statuses(await env.staged()) == ["cancelled", "suspended"], "asleep: no webhook"
    env.clock.advance(61)  # the sleeper wakes and completes
    await env.wake.notify()
    await eventually(lambda: _is(env, "t2", "completed"))
    assert statuses(await env.staged()) == ["cancelled", "completed", "suspended"]


async def test_an_ending_the_store_refuses_stages_nothing(env: Env) -> None:
    runtime = Runtime(env.store, ClaimPolicy(ttl=30, renew_every=10), env.clock)
    graph = env.registry.get("slow").graph
    handle = await runtime.start("t1", graph, {}, metadata={"webhook": URL})
    await eventually(lambda: env.entered == 1)
    env.clock.advance(31)
    await env.store.claim("t1", "someone-else", 30)  # takes the thread over
    env.gate.set()
    with pytest.raises(CheckpointWriteFailed):
        await handle.result()
    assert await env.staged() == [], "the refused ending staged nothing"
    done = await runtime.start("t2", graph, {}, metadata={"webhook": URL})
    assert (await done.result()).status == "completed"
    (entry,) = await env.staged()
    assert entry.payload["body"]["data"]["thread_id"] == "t2"


async def _is(env: Env, thread_id: str, status: str) -> bool:
    return await env.status(thread_id) == status
