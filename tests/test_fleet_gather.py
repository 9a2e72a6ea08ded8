"""Claim gathering (``wakeful.fleet.gather``, issue 22 third round): under a backlog a worker
holds a freed slot until half of its slots are free (or the window passes) so that one
claim call leases several; without a backlog it claims at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.runtime_support import eventually
from tests.test_fleet_worker import POLICY, State
from wakeful import ManualClock
from wakeful.fleet import LocalWake, Registry, Worker, submit
from wakeful.fleet.gather import CLAIM_BATCH, ClaimGather
from wakeful.runtime import START, Graph, NodeContext
from wakeful.store.memory import MemoryStore

pytestmark = pytest.mark.asyncio


class Nudges:
    """A waiter that returns only when nudged (or its timeout passes)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[None] = asyncio.Queue()
        self.waits = 0

    async def wait(self, timeout: float) -> bool:
        self.waits += 1
        try:
            await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            return False
        return True


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_backlog_holds_a_freed_slot_until_half_are_free() -> None:
    gather = ClaimGather(30.0, 10, asyncio.Event())
    free = [1]
    waiter = Nudges()
    assert await gather.hold(lambda: free[0], waiter) == 1, "no backlog yet: at once"
    gather.claimed(4, 4)  # the call leased all it asked for: the queue has more
    held = asyncio.create_task(gather.hold(lambda: free[0], waiter))
    for now_free in (2, 3, 4):
        await _settle()
        assert not held.done() and waiter.waits == now_free - 1
        free[0] = now_free
        waiter.queue.put_nowait(None)
    free[0] = 5
    waiter.queue.put_nowait(None)
    assert await asyncio.wait_for(held, 5) == 5
    # a call that leased fewer than asked ends the backlog
    gather.claimed(5, 2)
    free[0] = 1
    assert await asyncio.wait_for(gather.hold(lambda: free[0], waiter), 5) == 1


async def test_the_hold_ends_at_the_window_at_a_stop_and_never_with_one_slot() -> None:
    stopping = asyncio.Event()
    waiter = Nudges()
    gather = ClaimGather(0.05, 10, stopping, backlog=True)
    assert await asyncio.wait_for(gather.hold(lambda: 1, waiter), 5) == 1  # the window passed
    gather = ClaimGather(30.0, 10, stopping, backlog=True)
    held = asyncio.create_task(gather.hold(lambda: 2, waiter))
    await _settle()
    assert not held.done()
    stopping.set()
    waiter.queue.put_nowait(None)
    assert await asyncio.wait_for(held, 5) == 0, "nothing to claim for once stopping"
    # one slot, no slot free, or the window off: nothing to gather
    assert await ClaimGather(30.0, 1, asyncio.Event(), backlog=True).hold(lambda: 1, waiter) == 1
    assert await ClaimGather(30.0, 8, asyncio.Event(), backlog=True).hold(lambda: 0, waiter) == 0
    assert await ClaimGather(0.0, 8, asyncio.Event(), backlog=True).hold(lambda: 1, waiter) == 1
    assert await ClaimGather(0.0, 2000, asyncio.Event()).hold(lambda: 2000, waiter) == CLAIM_BATCH
    with pytest.raises(ValueError, match="claim_gather"):
        ClaimGather(-1.0, 8, asyncio.Event())


class Gated:
    """A worker of 4 slots over a memory store of 12 dispatches, each run held at a gate of
    its own; ``limits``: the limit of every claim call that leased something."""

    def __init__(self, **options: Any) -> None:
        clock = ManualClock()
        self.store = MemoryStore(clock)
        self.gates = {f"t{i}": asyncio.Event() for i in range(12)}
        self.limits: list[int] = []

        async def step(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
            await self.gates[ctx.thread_id].wait()
            return {"log": [ctx.thread_id]}

        registry = Registry(default="g")
        registry.add("g", Graph(State, name="g").node("s", step).edge(START, "s").compile())
        claim_next = self.store.claim_next

        async def counting(
            holder: str, ttl: float, limit: int = 1, thread_id: str | None = None, **kw: Any
        ) -> Any:
            leases = await claim_next(holder, ttl, limit, thread_id, **kw)
            if leases:
                self.limits.append(limit)
            return leases

        self.store.claim_next = counting  # type: ignore[method-assign]
        self.worker = Worker(
            self.store, registry, concurrency=4, claims=POLICY, wake=LocalWake(),
            clock=clock, **options,
        )  # fmt: skip

    async def start(self) -> asyncio.Task[None]:
        for i in range(12):
            await submit(self.store, f"t{i}", "g", {"log": []}, dispatch_id=f"d{i}")
        return asyncio.create_task(self.worker.run())

    async def close(self, task: asyncio.Task[None]) -> None:
        """Open every gate, stop the worker and wait for its loop (if still running)."""
        for gate in self.gates.values():
            gate.set()
        if not task.done():
            await self.worker.stop(grace=5)
            await asyncio.wait_for(task, 10)


async def test_a_worker_with_a_backlog_claims_freed_slots_together() -> None:
    env = Gated(claim_gather=30.0, poll_interval=0.05)
    worker, gates, limits = env.worker, env.gates, env.limits
    task = await env.start()
    try:
        await eventually(lambda: limits == [4] and worker.busy == 4)
        gates["t0"].set()  # one slot frees: held (backlog, fewer than half free)
        await eventually(lambda: worker.busy == 3)
        gates["t1"].set()  # two free: half, one call for both
        await eventually(lambda: limits == [4, 2] and worker.busy == 4)
        for i in range(2, 12):
            gates[f"t{i}"].set()
        await eventually(lambda: worker.stats.done == 12)
        assert sum(limits) >= 12 and all(limit >= 2 for limit in limits[1:]), limits
    finally:
        await env.close(task)


async def test_without_a_gather_window_each_freed_slot_is_claimed_for_at_once() -> None:
    env = Gated(claim_gather=0.0, poll_interval=60.0)
    worker, gates, limits = env.worker, env.gates, env.limits
    task = await env.start()
    try:
        await eventually(lambda: limits == [4] and worker.busy == 4)
        gates["t0"].set()  # a backlog and one slot free: no hold without a window
        await eventually(lambda: limits == [4, 1] and worker.busy == 4)
        gates["t1"].set()
        await eventually(lambda: limits == [4, 1, 1] and worker.busy == 4)
    finally:
        await env.close(task)


async def test_a_stop_while_holding_claims_nothing_more_and_ends_the_loop_at_once() -> None:
    # a poll interval longer than the test's bounds: only the stop's nudge ends the loop
    env = Gated(claim_gather=60.0, poll_interval=60.0)
    worker, gates, limits = env.worker, env.gates, env.limits
    task = await env.start()
    try:
        await eventually(lambda: limits == [4] and worker.busy == 4)
        gates["t0"].set()
        await eventually(lambda: worker.busy == 3)  # holding: one slot of four free
        stopping = asyncio.create_task(worker.stop(grace=5))
        for i in range(1, 4):
            gates[f"t{i}"].set()
        await asyncio.wait_for(stopping, 10)
        await asyncio.wait_for(task, 10)
        assert limits == [4] and worker.stats.done == 4
    finally:
        await env.close(task)
