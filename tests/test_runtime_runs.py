"""Runs on one runtime: durability modes, interrupts and resume, retries, cancellation,
admission refusals, tenants and the node context."""

from __future__ import annotations

import asyncio
import gc
import itertools
from typing import Annotated, Any, TypedDict

import pytest

from tests.runtime_support import eventually
from wakeful import ManualClock, TenantMismatch, ThreadBusy
from wakeful.errors import (
    GraphChanged,
    NothingToRecover,
    NotSuspended,
    RunCancelled,
    RunFailed,
    RunInProgress,
    UnknownTicket,
)
from wakeful.runtime import START, Graph, NodeContext, RetryPolicy, Runtime, append
from wakeful.runtime.context import idempotency_key
from wakeful.store.memory import MemoryStore
from wakeful.store.projection import Committed, Mutation


class State(TypedDict):
    log: Annotated[list[str], append]


def step(tag: str) -> Any:
    def node(state: dict[str, Any]) -> dict[str, Any]:
        return {"log": [tag]}

    return node


def linear(*names: str) -> Any:
    g = Graph(State)
    for name in names:
        g.node(name, step(name))
    g.edge(START, names[0])
    for a, b in itertools.pairwise(names):
        g.edge(a, b)
    return g.compile()


async def event_types(store: MemoryStore, thread: str) -> list[str]:
    return [e.type for e in await store.events_after(thread, 0, 1000)]


@pytest.mark.asyncio
@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
async def test_each_durability_mode_completes_with_the_same_state(durability: str) -> None:
    store = MemoryStore(ManualClock())
    handle = await Runtime(store).start("t", linear("a", "b", "c"), {}, durability=durability)
    outcome = await handle.result()
    assert outcome.state == {"log": ["a", "b", "c"]}
    snap = await store.read("t")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.status == "completed" and snap.claim is None
    types = await event_types(store, "t")
    assert types[0] == "run.started" and types[-1] == "run.completed"
    if durability == "exit":
        assert snap.version == 2, "exit: the admission commit and one commit at the end"
        assert types.count("task.completed") == 3
    else:
        assert snap.version == 1 + 3, (
            "admission + a checkpoint per step (a step with one task needs no separate write)"
        )
    history = await store.checkpoints("t")
    assert len(history) == (2 if durability == "exit" else 4)


class RecordingStore(MemoryStore):
    """A memory store that keeps the kind of every durable write it makes."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock)
        self.kinds: list[str] = []

    async def _persist(self, record: Mutation) -> None:
        kind = type(record).__name__
        if isinstance(record, Committed):
            kind += "+claim" if record.claim is not None else ""
            kind += "+release" if record.commit.release else ""
        self.kinds.append(kind)


@pytest.mark.asyncio
@pytest.mark.parametrize("durability", ["sync", "exit"])
async def test_a_run_claims_with_its_first_commit_and_releases_with_its_last(
    durability: str,
) -> None:
    store = RecordingStore(ManualClock())
    handle = await Runtime(store).start("t", linear("a", "b", "c"), {}, durability=durability)
    await handle.result()
    middle = ["Committed"] * (2 if durability == "sync" else 0)
    assert store.kinds == ["Committed+claim", *middle, "Committed+release"]
    snap = await store.read("t")
    assert snap is not None and snap.claim is None and snap.version == len(store.kinds)


@pytest.mark.asyncio
async def test_a_suspension_releases_and_a_resume_claims_with_its_commit() -> None:
    async def ask(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        return {"log": [str(ctx.interrupt("ok?"))]}

    g = Graph(State)
    g.node("ask", ask)
    g.edge(START, "ask")
    graph = g.compile()
    store = RecordingStore(ManualClock())
    runtime = Runtime(store)
    outcome = await (await runtime.start("t", graph, {})).result()
    assert outcome.status == "suspended"
    assert store.kinds == ["Committed+claim", "Committed+release"]
    snap = await store.read("t")
    assert snap is not None and snap.claim is None
    (ticket,) = outcome.tickets
    done = await (await runtime.resume("t", graph, {ticket.id: "yes"})).result()
    assert done.state == {"log": ["yes"]}
    assert store.kinds[2:] == ["Committed+claim", "Committed+release"]


@pytest.mark.asyncio
async def test_sync_commits_each_task_result_before_the_barrier() -> None:
    gate = asyncio.Event()
    seen: list[int] = []
    store = MemoryStore(ManualClock())

    async def fast(state: dict[str, Any]) -> dict[str, Any]:
        return {"log": ["fast"]}

    async def slow(state: dict[str, Any]) -> dict[str, Any]:
        snap = await store.read("t")
        assert snap is not None
        seen.append(len(snap.writes))
        await gate.wait()
        return {"log": ["slow"]}

    builder = Graph(State).node("fast", fast).node("slow", slow)
    g = builder.edge(START, "fast").edge(START, "slow").compile()
    handle = await Runtime(store).start("t", g, {})

    async def fast_write_recorded() -> bool:
        snap = await store.read("t")
        return snap is not None and [w.node for w in snap.writes] == ["fast"]

    await eventually(fast_write_recorded)
    gate.set()
    await handle.result()


@pytest.mark.asyncio
async def test_async_durability_applies_backpressure_and_keeps_order() -> None:
    store = MemoryStore(ManualClock())
    names = [f"n{i}" for i in range(30)]
    handle = await Runtime(store).start("t", linear(*names), {}, durability="async")
    outcome = await handle.result()
    assert outcome.state["log"] == names
    seqs = [e.seq for e in await store.events_after("t", 0, 1000)]
    assert seqs == list(range(1, len(seqs) + 1))
    history = [cp.id for cp, _ in await store.checkpoints("t", limit=100)]
    assert (
        len(history) == 31
        and history == sorted(history, key=lambda i: int(i.rsplit("-c", 1)[1]))[::-1]
    )


@pytest.mark.asyncio
async def test_interrupt_suspends_and_resume_answers_without_rerunning_finished_tasks() -> None:
    store = MemoryStore(ManualClock())
    calls: dict[str, int] = {"ask": 0, "side": 0}

    def ask(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        calls["ask"] += 1
        answer = ctx.interrupt({"question": "ship it?"})
        return {"log": [f"answer={answer}"]}

    def side(state: dict[str, Any]) -> dict[str, Any]:
        calls["side"] += 1
        return {"log": ["side"]}

    builder = Graph(State).node("ask", ask).node("side", side).node("after", step("after"))
    g = builder.edge(START, "ask").edge(START, "side").edge("ask", "after").compile()
    runtime = Runtime(store)
    outcome = await (await runtime.start("t", g, {})).result()
    assert outcome.status == "suspended"
    [ticket] = outcome.tickets
    assert ticket.question == {"question": "ship it?"} and ticket.node == "ask"
    snap = await store.read("t")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.status == "suspended" and snap.claim is None
    assert [w.node for w in snap.writes] == ["side"]

    with pytest.raises(UnknownTicket):
        await runtime.resume("t", g, {"nope": 1})
    with pytest.raises(RunInProgress):
        await runtime.start("t", g, {})
    done = await (await runtime.resume("t", g, {ticket.id: "yes"})).result()
    assert done.status == "completed"
    assert done.state["log"] == ["answer=yes", "side", "after"]
    assert calls == {"ask": 2, "side": 1}
    with pytest.raises(NotSuspended):
        await runtime.resume("t", g, {ticket.id: "again"})
    assert "run.suspended" in await event_types(store, "t")


@pytest.mark.asyncio
async def test_resume_may_answer_a_subset_of_tickets() -> None:
    store = MemoryStore(ManualClock())

    def asker(name: str) -> Any:
        def node(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
            return {"log": [f"{name}={ctx.interrupt(name)}"]}

        return node

    builder = Graph(State).node("x", asker("x")).node("y", asker("y"))
    g = builder.edge(START, "x").edge(START, "y").compile()
    runtime = Runtime(store)
    first = await (await runtime.start("t", g, {})).result()
    tickets = {t.node: t.id for t in first.tickets}
    assert set(tickets) == {"x", "y"}
    second = await (await runtime.resume("t", g, {tickets["x"]: 1})).result()
    assert second.status == "suspended" and [t.node for t in second.tickets] == ["y"]
    third = await (await runtime.resume("t", g, {tickets["y"]: 2})).result()
    assert third.status == "completed" and third.state["log"] == ["x=1", "y=2"]


@pytest.mark.asyncio
async def test_retry_policy_retries_then_fails_the_run() -> None:
    store = MemoryStore(ManualClock())
    attempts = {"flaky": 0, "broken": 0}

    def flaky(state: dict[str, Any]) -> dict[str, Any]:
        attempts["flaky"] += 1
        if attempts["flaky"] < 3:
            raise ConnectionError("transient")
        return {"log": ["flaky"]}

    def broken(state: dict[str, Any]) -> dict[str, Any]:
        attempts["broken"] += 1
        raise ValueError("always")

    slept: list[float] = []

    async def no_wait(seconds: float) -> None:
        slept.append(seconds)

    runtime = Runtime(store, sleep=no_wait)
    builder = Graph(State).node("flaky", flaky, retry=RetryPolicy(max_attempts=3, initial_delay=1))
    g = builder.edge(START, "flaky").compile()
    assert (await (await runtime.start("t1", g, {})).result()).state == {"log": ["flaky"]}
    assert attempts["flaky"] == 3 and slept[:2] == [1.0, 2.0]

    builder = Graph(State).node(
        "broken", broken, retry=RetryPolicy(max_attempts=2, initial_delay=0)
    )
    g2 = builder.edge(START, "broken").compile()
    with pytest.raises(RunFailed, match="ValueError: always"):
        await (await runtime.start("t2", g2, {})).result()
    assert attempts["broken"] == 2
    snap = await store.read("t2")
    assert snap is not None and snap.checkpoint is not None and snap.checkpoint.status == "failed"


@pytest.mark.asyncio
async def test_cancel_records_cancelled_and_releases() -> None:
    store = MemoryStore(ManualClock())
    started = asyncio.Event()

    async def hang(state: dict[str, Any]) -> dict[str, Any]:
        started.set()
        await asyncio.Event().wait()
        return {}

    g = Graph(State).node("hang", hang).edge(START, "hang").compile()
    handle = await Runtime(store).start("t", g, {})
    await started.wait()
    await handle.cancel()
    with pytest.raises(RunCancelled):
        await handle.result()
    snap = await store.read("t")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.status == "cancelled" and snap.claim is None
    assert handle.status == "cancelled"
    assert (await event_types(store, "t"))[-1] == "run.cancelled"


@pytest.mark.asyncio
async def test_admission_refusals() -> None:
    store = MemoryStore(ManualClock())
    runtime = Runtime(store)
    g = linear("a")
    with pytest.raises(NothingToRecover):
        await runtime.recover("t", g)
    with pytest.raises(NotSuspended):
        await runtime.resume("t", g, {})
    await (await runtime.start("t", g, {})).result()
    with pytest.raises(NothingToRecover):
        await runtime.recover("t", g)
    again = await (await runtime.start("t", g, {"log": ["second"]})).result()
    assert again.state["log"] == ["a", "second", "a"], "a new run continues the thread's state"
    claim = await store.claim("t", "someone-else", 30)
    with pytest.raises(ThreadBusy):
        await runtime.start("t", g, {})
    with pytest.raises(ThreadBusy):
        await runtime.delete_thread("t")
    await store.release("t", claim.token)
    snap = await store.read("t")
    assert snap is not None and snap.claim is None, "refusals leave no claim behind"
    await runtime.delete_thread("t")
    assert await store.read("t") is None


@pytest.mark.asyncio
async def test_a_changed_graph_is_refused_for_recovery_unless_allowed() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    gate = asyncio.Event()

    async def hang(state: dict[str, Any]) -> dict[str, Any]:
        await gate.wait()
        return {}

    g = Graph(State).node("hang", hang).edge(START, "hang").compile()
    abandoned = await Runtime(store, holder="first").start("t", g, {})
    other = linear("hang", "extra")
    clock.advance(31)  # the first run's claim lapses (its renewal would be 10 s of real time)
    runtime = Runtime(store, holder="second")
    with pytest.raises(GraphChanged):
        await runtime.recover("t", other)
    handle = await runtime.recover("t", other, allow_graph_change=True)
    assert (await handle.result()).status == "completed"
    gate.set()
    await abandoned.cancel()


@pytest.mark.asyncio
async def test_tenants_are_checked_before_anything_else() -> None:
    store = MemoryStore(ManualClock())
    runtime = Runtime(store)
    g = linear("a")
    await (await runtime.start("t", g, {}, tenant="acme")).result()
    for call in (
        runtime.start("t", g, {}, tenant="other"),
        runtime.recover("t", g, tenant="other"),
        runtime.resume("t", g, {}, tenant="other"),
        runtime.delete_thread("t", tenant="other"),
        runtime.start("t", g, {}),
    ):
        with pytest.raises(TenantMismatch) as refused:
            await call
        assert "acme" not in str(refused.value)
    snap = await store.read("t")
    assert snap is not None and snap.claim is None and snap.tenant == "acme"


@pytest.mark.asyncio
async def test_node_context_exposes_token_key_and_events() -> None:
    store = MemoryStore(ManualClock())
    seen: dict[str, Any] = {}

    async def node(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        seen.update(token=ctx.fencing_token, key=ctx.idempotency_key, task=ctx.task_id)
        ctx.emit("progress", {"pct": 50})
        ctx.emit_live("typing", {"delta": "x"})
        return {"log": ["n"]}

    runtime = Runtime(store)
    g = Graph(State).node("n", node).edge(START, "n").compile()
    live: list[Any] = []

    async def listen() -> None:
        async for item in runtime.subscribe("t"):
            live.append(item)
            if getattr(item, "type", None) == "run.completed":
                return

    listener = asyncio.create_task(listen())
    await asyncio.sleep(0)
    handle = await runtime.start("t", g, {})
    await handle.result()
    await asyncio.wait_for(listener, 10)
    assert seen["token"] == handle.token
    assert seen["key"] == idempotency_key("t", handle.run_id, 0, seen["task"])
    durable = [e.type for e in await store.events_after("t", 0, 100)]
    assert "progress" in durable and "typing" not in durable
    assert any(getattr(i, "type", None) == "typing" and not hasattr(i, "seq") for i in live)


@pytest.mark.asyncio
async def test_live_events_from_async_and_thread_nodes_arrive_in_order_and_batched() -> None:
    store = MemoryStore(ManualClock())
    runtime = Runtime(store)

    def in_a_thread(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        for i in range(50):
            ctx.emit_live("thread.delta", {"i": i})
        return {"log": ["t"]}

    async def on_the_loop(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        for i in range(50):
            ctx.emit_live("loop.delta", {"i": i})
        return {"log": ["l"]}

    g = Graph(State).node("t", in_a_thread).node("l", on_the_loop).edge(START, "t")
    compiled = g.edge("t", "l").compile()
    live: list[Any] = []
    subscription = runtime.subscribe("t")

    async def listen() -> None:
        async for item in subscription:
            live.append(item)
            if getattr(item, "type", None) == "run.completed":
                return

    listener = asyncio.create_task(listen())
    assert runtime.live._queues.get("t") is not None, "attached when subscribe returns"
    scheduled: list[str] = []
    loop = asyncio.get_running_loop()
    soon, threadsafe = loop.call_soon, loop.call_soon_threadsafe

    def counted(schedule: Any) -> Any:
        def call(callback: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(callback, "__name__", "") in ("publish", "_flush"):
                scheduled.append(callback.__name__)  # one live hand-off to the loop
            return schedule(callback, *args, **kwargs)

        return call

    loop.call_soon = counted(soon)  # type: ignore[method-assign]
    loop.call_soon_threadsafe = counted(threadsafe)  # type: ignore[method-assign]
    try:
        handle = await runtime.start("t", compiled, {})
        await handle.result()
        await asyncio.wait_for(listener, 10)
    finally:
        loop.call_soon, loop.call_soon_threadsafe = soon, threadsafe  # type: ignore[method-assign]
    for kind in ("thread.delta", "loop.delta"):
        got = [i.data["i"] for i in live if getattr(i, "type", None) == kind]
        assert got == list(range(50)), kind
    # the thread's 50 in a few batches, not one by one; the loop's at once, no hand-off
    assert 1 <= len(scheduled) <= 20, scheduled
    assert runtime.live._batches == {}
    other = Runtime(store)
    other.live.emit(loop, "nobody", "r", "x", None)
    assert other.live._batches == {}, "nobody subscribes: dropped at once"


@pytest.mark.asyncio
async def test_a_subscription_receives_live_events_emitted_before_its_first_iteration() -> None:
    """``subscribe`` attaches when it returns: a run started right after it, which emits
    and ends before the subscriber first looks, is seen whole, live events before the
    durable ending; closing a subscription never iterated detaches it."""
    store = MemoryStore(ManualClock())
    runtime = Runtime(store)

    async def node(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        for i in range(3):
            ctx.emit_live("x.delta", {"i": i})
        return {"log": ["n"]}

    compiled = Graph(State).node("n", node).edge(START, "n").compile()
    subscription = runtime.subscribe("t")
    handle = await runtime.start("t", compiled, {})
    await handle.result()  # the whole run, before the first iteration
    types = []
    async for item in subscription:
        types.append(item.type)
        if item.type == "run.completed":
            break
    await subscription.aclose()  # type: ignore[attr-defined]
    assert types.count("x.delta") == 3
    assert types.index("x.delta") < types.index("run.completed")
    assert runtime.live._queues == {}
    unused = runtime.subscribe("t")
    assert "t" in runtime.live._queues
    await unused.aclose()  # type: ignore[attr-defined]
    assert runtime.live._queues == {}


@pytest.mark.asyncio
async def test_a_finished_run_is_freed_without_the_garbage_collector() -> None:
    # A worker ends thousands of runs; one left in a reference cycle (the run and its claim
    # renewer's callbacks) waits for the collector, which then scans all that is live.
    from wakeful.runtime.loop import Execution

    store = MemoryStore(ManualClock())
    runtime = Runtime(store)
    gc.collect()
    gc.disable()
    try:
        handle = await runtime.start("t", linear("a", "b"), {})
        assert (await handle.result()).state == {"log": ["a", "b"]}
        del handle
        await asyncio.sleep(0)  # the run's task is let go by the loop's done callbacks
        assert not [o for o in gc.get_objects() if isinstance(o, Execution)]
    finally:
        gc.enable()


@pytest.mark.asyncio
async def test_cancelling_a_wait_for_the_result_leaves_the_run_running() -> None:
    gate, entered = asyncio.Event(), asyncio.Event()

    async def held(state: dict[str, Any]) -> dict[str, Any]:
        entered.set()
        await gate.wait()
        return {"log": ["held"]}

    g = Graph(State)
    g.node("held", held).edge(START, "held")
    handle = await Runtime(MemoryStore(ManualClock())).start("t", g.compile(), {})
    waiting = asyncio.create_task(handle.result())
    # the waiter (scheduled first) is suspended on the result by the time the node runs
    await entered.wait()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert handle.status == "running" and not handle.done()
    gate.set()
    assert (await handle.result()).state == {"log": ["held"]}
    assert (await handle.result()).status == "completed", "a finished run answers again"
