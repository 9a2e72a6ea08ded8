"""Durable sleep (issue 38): ``await ctx.sleep(...)`` commits the run, releases its claim and
records the wake-up in the same commit; the wake-up happens once, when the store's clock
reaches it; a cancel while asleep ends the run; an embedded Runtime wakes its own runs.
Time is a manual clock."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Annotated, Any, TypedDict

import pytest
import pytest_asyncio

from tests.metrics_support import sample
from tests.runtime_support import eventually
from wakeful import ManualClock
from wakeful.errors import InvalidInput
from wakeful.fleet import LocalWake, Registry, Worker, cancel, submit
from wakeful.runtime import START, ClaimPolicy, Graph, NodeContext, Runtime, append
from wakeful.runtime.alarms import wake_due
from wakeful.runtime.sleeps import wake_at
from wakeful.store.memory import MemoryStore

POLICY = ClaimPolicy(ttl=30, renew_every=10)


class State(TypedDict):
    log: Annotated[list[str], append]


def sleepy_graph(calls: dict[str, int], seconds: float = 3600) -> Any:
    async def before(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        calls["before"] = calls.get("before", 0) + 1
        return {"log": ["before"]}

    async def nap(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        calls["nap"] = calls.get("nap", 0) + 1
        await ctx.sleep(timedelta(seconds=seconds))
        calls["woke"] = calls.get("woke", 0) + 1
        return {"log": ["woke"]}

    async def after(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        calls["after"] = calls.get("after", 0) + 1
        return {"log": ["after"]}

    g = Graph(State, name="sleepy")
    g.node("before", before)
    g.node("nap", nap)
    g.node("after", after)
    g.edge(START, "before")
    g.edge("before", "nap")
    g.edge("nap", "after")
    return g.compile()


class Env:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.store = MemoryStore(self.clock)
        self.wake = LocalWake()
        self.calls: dict[str, int] = {}
        self.registry = Registry(default="sleepy")
        self.registry.add("sleepy", sleepy_graph(self.calls))
        self.workers: list[tuple[Worker, asyncio.Task[None]]] = []

    def worker(self, worker_id: str) -> Worker:
        worker = Worker(
            self.store,
            self.registry,
            claims=POLICY,
            wake=self.wake,
            worker_id=worker_id,
            poll_interval=0.02,
            retry_backoff=0.0,
            clock=self.clock,
        )
        self.workers.append((worker, asyncio.create_task(worker.run())))
        return worker

    async def latest(self, thread_id: str) -> Any:
        snap = await self.store.read(thread_id)
        return snap.checkpoint if snap is not None else None

    async def close(self) -> None:
        for worker, task in self.workers:
            await worker.stop(grace=5)
            await asyncio.wait_for(task, 10)


@pytest_asyncio.fixture
async def env() -> AsyncIterator[Env]:
    environment = Env()
    try:
        yield environment
    finally:
        await environment.close()


async def _asleep(env: Env, thread_id: str) -> Any:
    async def check() -> bool:
        cp = await env.latest(thread_id)
        return cp is not None and cp.metadata.get("wake_at") is not None

    await eventually(check)
    return await env.latest(thread_id)


@pytest.mark.asyncio
async def test_a_sleeping_run_releases_its_claim_and_wakes_once_when_due(env: Env) -> None:
    env.worker("w1")
    env.worker("w2")
    start = env.clock.now()
    await submit(env.store, "t1", "sleepy", {}, dispatch_id="d1", wake=env.wake)
    asleep = await _asleep(env, "t1")
    assert asleep.status == "suspended"
    assert asleep.metadata["wake_at"] == (start + timedelta(hours=1)).isoformat()
    d = await env.store.get_dispatch("d1")
    assert d is not None and d.status == "scheduled"  # until its wake time (issue 38)
    assert d.available_at == start + timedelta(hours=1)  # the wake-up, by the store's clock
    snap = await env.store.read("t1")
    assert snap is not None and snap.claim is None, "no process holds a sleeping run"
    events = await env.store.events_after("t1")
    assert [e.data["wake_at"] for e in events if e.type == "run.sleeping"] == [
        asleep.metadata["wake_at"]
    ]
    env.clock.advance(3599.9)
    await asyncio.sleep(0.2)  # ten polls of each worker: nothing is due yet
    assert (await env.latest("t1")).id == asleep.id
    env.clock.advance(0.1)

    async def completed() -> bool:
        cp = await env.latest("t1")
        return cp is not None and cp.status == "completed"

    await eventually(completed)
    cp = await env.latest("t1")
    assert cp.state == {"log": ["before", "woke", "after"]}
    assert env.calls == {"before": 1, "nap": 2, "woke": 1, "after": 1}
    done = await env.store.get_dispatch("d1")
    assert done is not None and done.status == "done"
    assert done.attempts == 2  # the start and the wake-up


@pytest.mark.asyncio
async def test_a_worker_counts_and_logs_a_sleeping_run_apart(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="wakeful.fleet")
    worker = env.worker("w1")
    start = env.clock.now()
    await submit(env.store, "t1", "sleepy", {}, dispatch_id="d1", wake=env.wake)
    await _asleep(env, "t1")
    await eventually(lambda: worker.stats.sleeping == 1)
    # asleep: neither waiting for answers nor a failed attempt, and no longer running
    assert (worker.stats.awaiting, worker.stats.retried, worker.stats.done) == (0, 0, 0)
    scrape = worker.metrics.render()
    assert sample(scrape, 'wakeful_settles_total{outcome="sleeping"}') == 1
    assert sample(scrape, "wakeful_worker_running_dispatches") == 0
    wake = (start + timedelta(hours=1)).isoformat()
    ended = [r.getMessage() for r in caplog.records if "ended" in r.getMessage()]
    assert len(ended) == 1 and "ended sleeping" in ended[0] and f"until {wake}" in ended[0]
    env.clock.advance(3600)
    await eventually(lambda: worker.stats.done == 1)
    assert worker.stats.sleeping == 1 and worker.stats.awaiting == 0


@pytest.mark.asyncio
async def test_a_cancel_while_asleep_ends_the_run_and_it_never_wakes(env: Env) -> None:
    env.worker("w1")
    await submit(env.store, "t1", "sleepy", {}, dispatch_id="d1", wake=env.wake)
    await _asleep(env, "t1")
    await cancel(env.store, "t1", "no longer needed", wake=env.wake)

    async def cancelled() -> bool:
        cp = await env.latest("t1")
        return cp is not None and cp.status == "cancelled"

    await eventually(cancelled)
    env.clock.advance(7200)
    await asyncio.sleep(0.2)
    assert (await env.latest("t1")).status == "cancelled"
    assert "woke" not in env.calls and "after" not in env.calls
    d = await env.store.get_dispatch("d1")
    assert d is not None and d.status == "done"


@pytest.mark.asyncio
async def test_wake_ups_do_not_spend_the_attempt_budget() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    calls: dict[str, int] = {}
    gate = asyncio.Event()

    async def naps(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        for _ in range(4):  # four sleeps in one node: each wake-up re-runs it
            await ctx.sleep(10)
        return {"log": ["rested"]}

    async def work(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        calls["work"] = calls.get("work", 0) + 1
        if calls["work"] == 1:
            await gate.wait()  # this attempt hangs: its lease will lapse
        return {"log": ["worked"]}

    g = Graph(State, name="naps")
    g.node("naps", naps)
    g.node("work", work)
    g.edge(START, "naps")
    g.edge("naps", "work")
    registry = Registry(default="naps")
    registry.add("naps", g.compile())
    worker = Worker(
        store,
        registry,
        concurrency=2,
        claims=POLICY,
        poll_interval=0.02,
        clock=clock,
        worker_id="w",
    )
    task = asyncio.create_task(worker.run())
    try:
        await submit(store, "t1", "naps", {}, dispatch_id="d1", max_attempts=2)
        for sleeps in range(1, 5):

            async def asleep(n: int = sleeps) -> bool:
                snap = await store.read("t1")
                if snap is None or snap.checkpoint is None or snap.claim is not None:
                    return False
                return bool(snap.checkpoint.metadata.get("sleeps") == n)

            await eventually(asleep)
            clock.advance(10)
        await eventually(lambda: calls.get("work") == 1)
        clock.advance(31)  # the hanging attempt's lease lapses: a recovery, attempt 6 of 2

        async def completed() -> bool:
            snap = await store.read("t1")
            cp = snap.checkpoint if snap else None
            return cp is not None and cp.status in ("completed", "indeterminate")

        await eventually(completed)
        snap = await store.read("t1")
        assert snap is not None and snap.checkpoint is not None
        assert snap.checkpoint.status == "completed", "four wake-ups are not four failures"
        d = await store.get_dispatch("d1")
        assert d is not None and d.attempts == 6
    finally:
        gate.set()
        await worker.stop(grace=5)
        await asyncio.wait_for(task, 10)


@pytest.mark.asyncio
async def test_an_embedded_runtime_wakes_its_own_run() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(seconds)

    calls: dict[str, int] = {}
    runtime = Runtime(store, POLICY, clock, sleep=sleep)
    handle = await runtime.start("t1", sleepy_graph(calls, seconds=90), {"log": []})
    outcome = await handle.result()
    assert outcome.status == "completed"
    assert outcome.state == {"log": ["before", "woke", "after"]}
    assert slept == [90.0]
    assert calls == {"before": 1, "nap": 2, "woke": 1, "after": 1}
    snap = await store.read("t1")
    assert snap is not None and snap.claim is None


@pytest.mark.asyncio
async def test_sleep_refuses_a_negative_duration_and_a_naive_time() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    seen: list[str] = []

    async def bad(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        try:
            await ctx.sleep(-1)
        except InvalidInput as exc:
            seen.append(exc.field)
        try:
            await ctx.sleep_until(clock.now().replace(tzinfo=None))
        except InvalidInput as exc:
            seen.append(exc.field)
        return {"log": ["ok"]}

    g = Graph(State, name="bad")
    g.node("bad", bad)
    g.edge(START, "bad")
    outcome = await (await Runtime(store, POLICY, clock).start("t1", g.compile(), {})).result()
    assert outcome.status == "completed" and seen == ["duration", "when"]


@pytest.mark.asyncio
async def test_a_restarted_process_wakes_a_due_sleep_of_an_embedded_run() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    calls: dict[str, int] = {}
    graph = sleepy_graph(calls, seconds=60)

    async def never(seconds: float) -> None:
        await asyncio.Event().wait()  # the process "dies" asleep: its timer never fires

    first = Runtime(store, POLICY, clock, sleep=never)
    handle = await first.start("t1", graph, {"log": []})
    snap = None
    for _ in range(200):
        snap = await store.read("t1")
        if snap and snap.checkpoint and "wake_at" in snap.checkpoint.metadata:
            break
        await asyncio.sleep(0.005)
    assert snap is not None and snap.claim is None
    await handle.cancel()  # the first process is gone
    second = Runtime(store, POLICY, clock)
    assert await wake_due(second, "t1", graph) is None  # not due yet
    clock.advance(60)
    woken = await wake_due(second, "t1", graph)
    assert woken is not None
    outcome = await woken.result()
    assert outcome.status == "completed" and outcome.state == {"log": ["before", "woke", "after"]}
    assert await wake_due(second, "t1", graph) is None
    assert calls == {"before": 1, "nap": 2, "woke": 1, "after": 1}


@pytest.mark.asyncio
async def test_a_run_that_slept_then_waits_for_an_answer_is_not_asleep() -> None:
    """The checkpoints after a sleep carry its metadata on (``sleeps`` counts them), but a
    later suspension on a question is not a sleep: nothing may show or wake it as one."""
    clock = ManualClock()
    store = MemoryStore(clock)

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)

    async def nap(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        await ctx.sleep(timedelta(seconds=90))
        return {"log": ["woke"]}

    async def ask(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        return {"log": [str(ctx.interrupt("go on?"))]}

    g = Graph(State, name="nap-then-ask")
    g.node("nap", nap)
    g.node("ask", ask)
    g.edge(START, "nap")
    g.edge("nap", "ask")
    runtime = Runtime(store, POLICY, clock, sleep=sleep)
    outcome = await (await runtime.start("t1", g.compile(), {"log": []})).result()
    assert outcome.status == "suspended" and outcome.wake_at is None
    snap = await store.read("t1")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.metadata["sleeps"] == 1  # the sleep before the question
    assert wake_at(snap.checkpoint) is None


@pytest.mark.asyncio
async def test_a_sleeping_run_keeps_its_thread_busy(env: Env) -> None:
    """Busy threads (issue 36): a run asleep is unfinished, so a submission waits behind it
    (runs after it wakes and ends) and ``if_busy="interrupt"`` ends it interrupted."""
    env.worker("w1")
    await submit(env.store, "t1", "sleepy", {}, dispatch_id="d1", wake=env.wake)
    await _asleep(env, "t1")
    behind = await submit(env.store, "t1", "sleepy", {}, dispatch_id="d2", wake=env.wake)
    assert behind.status == "queued" and behind.queued_behind == "d1"
    await asyncio.sleep(0.2)  # ten polls: d2 is not claimable while d1's run sleeps
    assert [r.run_id for r in await env.store.runs("t1")] == ["run-d1"]
    env.clock.advance(3600)

    async def both_asleep_in_turn() -> bool:
        runs = {r.run_id: r.status for r in await env.store.runs("t1")}
        return runs.get("run-d1") == "completed" and runs.get("run-d2") == "suspended"

    await eventually(both_asleep_in_turn)
    await submit(
        env.store, "t1", "sleepy", {}, dispatch_id="d3", wake=env.wake, if_busy="interrupt"
    )

    async def interrupted() -> bool:
        runs = {r.run_id: r.status for r in await env.store.runs("t1")}
        return runs.get("run-d2") == "interrupted" and runs.get("run-d3") == "suspended"

    await eventually(interrupted)
    assert env.calls["before"] == 3 and env.calls["woke"] == 1 and env.calls["after"] == 1


@pytest.mark.asyncio
async def test_a_sleep_inside_a_subgraph_sleeps_the_run_and_wakes_inside_it() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    slept: list[float] = []
    calls: dict[str, int] = {}

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(seconds)

    inner = sleepy_graph(calls, seconds=60)
    g = Graph(State, name="outer").node("inner", inner).edge(START, "inner")
    runtime = Runtime(store, POLICY, clock, sleep=sleep)
    outcome = await (await runtime.start("t1", g.compile(), {"log": []})).result()
    assert outcome.status == "completed"
    assert outcome.state == {"log": ["before", "woke", "after"]}
    assert slept == [60.0]
    # the wake-up continued inside the subgraph: its first node did not run again
    assert calls == {"before": 1, "nap": 2, "woke": 1, "after": 1}
    events = await store.events_after("t1")
    asleep = [e for e in events if e.type == "run.sleeping"]
    assert [e.data["tickets"] for e in asleep] == [["inner/nap-s1"]]
